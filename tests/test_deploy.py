"""The shipped systemd units start the commands with arguments the tools accept."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deployfiles import DEPLOY, PARSERS, parse_command


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(DEPLOY / "systemd" / name)
    return cp


def environment(service: configparser.SectionProxy, default_file: Path) -> dict[str, str]:
    env = {"STATE_DIRECTORY": "/var/lib/" + service["StateDirectory"]}
    for item in service.get("Environment", "").split():
        key, _, value = item.partition("=")
        env[key] = value
    for line in default_file.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = shlex.split(value)[0] if value else ""
    return env


@pytest.mark.parametrize("tool", sorted(PARSERS))
def test_unit_command_line_parses(tool: str) -> None:
    service = unit(f"{tool}.service")["Service"]
    env = environment(service, DEPLOY / f"{tool}.default")
    line = re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], service["ExecStart"])
    argv = shlex.split(line)
    assert argv[:2] == ["/usr/bin/env", tool]
    args = parse_command(tool, argv[2:])
    assert str(args.state_dir) == env["STATE_DIRECTORY"]


# -- Prometheus rules and the Grafana dashboard (deploy/prometheus, deploy/grafana) ------------
PROMETHEUS = DEPLOY / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    tool = shutil.which("promtool")
    # No skip: a rule file nobody checked is worse than a failing test.
    assert tool is not None, "promtool missing: apt-get install prometheus (./dev test installs it)"
    return subprocess.run([tool, *args], capture_output=True, text=True, timeout=60, check=False)


def test_alert_rules_are_valid() -> None:
    done = promtool("check", "rules", str(PROMETHEUS / "stortune-rules.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_alert_rules_fire_as_their_tests_say() -> None:
    # The drifted-host alert fires after 15 minutes of drift, not for drift corrected sooner.
    done = promtool("test", "rules", str(PROMETHEUS / "stortune-rules.test.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def exported_names() -> set[str]:
    """Every series name /metrics can serve, histogram and counter suffixes included."""
    from stortune.server.metrics.exposition import FAMILIES, OTHER_FAMILIES
    from stortune.server.metrics.recorder import Recorder
    from stortune.server.metrics.rollouts import FAMILIES as ROLLOUT_FAMILIES

    names = {name for name, _, _ in FAMILIES} | set(OTHER_FAMILIES) | {name for name, _ in ROLLOUT_FAMILIES}
    for family in Recorder().registry.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")
                    }.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def test_rules_and_dashboard_use_only_exported_series() -> None:
    exported = exported_names()
    rules = (PROMETHEUS / "stortune-rules.yml").read_text().splitlines()
    texts = [line for line in rules if not line.lstrip().startswith("#")]  # comments name future series
    dashboard = json.loads((DEPLOY / "grafana" / "stortune.json").read_text())
    texts += [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    used = {name for text in texts for name in re.findall(r"\bstortune_[a-z_]+", text)}
    assert used and used <= exported, used - exported
