"""stortune-agent end to end on real loop devices: plan, apply, explain, restore,
and bad input that must change nothing on the host."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

QUEUE = ("scheduler", "nr_requests", "read_ahead_kb", "max_sectors_kb")


def queue(dev: str) -> dict[str, str]:
    out = {}
    for attr in QUEUE:
        raw = (Path("/sys/block") / dev / "queue" / attr).read_text().strip()
        if attr == "scheduler":
            raw = next(w.strip("[]") for w in raw.split() if w.startswith("["))
        out[attr] = raw
    return out


def offered(dev: str) -> list[str]:
    return (Path("/sys/block") / dev / "queue/scheduler").read_text().replace("[", "").replace(
        "]", "").split()


def profile(dev: str, settings: str, name: str = "loop-test", match: str | None = None) -> str:
    return f"""
apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: {name}}}
spec:
  rules:
    - name: the-loop
      match: {match or f"{{kind: [loop], name: [{dev}]}}"}
      settings: {settings}
"""


def agent(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stortune.agent.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def loop(loop_devices: Callable[[int], list[str]]) -> str:
    (dev,) = loop_devices(1)
    return dev


def other_scheduler(dev: str) -> str:
    current = queue(dev)["scheduler"]
    return next(s for s in offered(dev) if s not in (current, "none"))


def test_plan_apply_plan_restore(loop: str, tmp_path: Path) -> None:
    before = queue(loop)
    sched = other_scheduler(loop)
    # values that differ from whatever the device has now
    ra = 4096 if before["read_ahead_kb"] != "4096" else 8192
    nr = 64 if before["nr_requests"] != "64" else 32
    ms = 256 if before["max_sectors_kb"] != "256" else 128
    doc = tmp_path / "p.yaml"
    doc.write_text(profile(loop, f"{{scheduler: {sched}, nr_requests: {nr}, read_ahead_kb: {ra},"
                                 f" max_sectors_kb: {ms}}}"))
    state = str(tmp_path / "state")

    planned = agent("plan", "-f", str(doc), "-o", "json")
    assert planned.returncode == 2, planned.stderr
    changes = json.loads(planned.stdout)["changes"]
    assert [c["tunable"] for c in changes] == ["scheduler", "nr_requests", "max_sectors_kb",
                                               "read_ahead_kb"]

    applied = agent("apply", "-f", str(doc), "--state-dir", state)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert queue(loop) == {"scheduler": sched, "nr_requests": str(nr), "read_ahead_kb": str(ra),
                           "max_sectors_kb": str(ms)}
    again = agent("plan", "-f", str(doc), "--state-dir", state)
    assert again.returncode == 0, again.stdout

    restored = agent("restore", "--state-dir", state)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert queue(loop) == before


def test_dropping_a_setting_restores_its_original(loop: str, tmp_path: Path) -> None:
    before = queue(loop)
    doc, state = tmp_path / "p.yaml", str(tmp_path / "state")
    doc.write_text(profile(loop, "{read_ahead_kb: 1024, max_sectors_kb: 128}"))
    assert agent("apply", "-f", str(doc), "--state-dir", state).returncode == 0
    doc.write_text(profile(loop, "{read_ahead_kb: 2048}"))
    assert agent("apply", "-f", str(doc), "--state-dir", state).returncode == 0
    now = queue(loop)
    assert now["read_ahead_kb"] == "2048" and now["max_sectors_kb"] == before["max_sectors_kb"]
    assert agent("restore", "--state-dir", state).returncode == 0
    assert queue(loop) == before


def test_plan_exits_2_while_a_dropped_setting_is_to_be_put_back(loop: str, tmp_path: Path) -> None:
    """The restoration apply would make is a pending change: shown, and exit 2 until applied."""
    before = queue(loop)
    ms = 128 if before["max_sectors_kb"] != "128" else 256
    doc, state = tmp_path / "p.yaml", str(tmp_path / "state")
    doc.write_text(profile(loop, f"{{read_ahead_kb: 1024, max_sectors_kb: {ms}}}"))
    assert agent("apply", "-f", str(doc), "--state-dir", state).returncode == 0
    doc.write_text(profile(loop, "{read_ahead_kb: 1024}"))

    planned = agent("plan", "-f", str(doc), "--state-dir", state, "-o", "json")
    assert planned.returncode == 2, planned.stdout + planned.stderr
    plan = json.loads(planned.stdout)
    assert plan["changes"] == []
    assert [(r["device"], r["tunable"], r["current"], r["desired"], r["to"])
            for r in plan["restorations"]] == [
        (loop, "max_sectors_kb", ms, int(before["max_sectors_kb"]), "original")]
    table = agent("plan", "-f", str(doc), "--state-dir", state)
    assert table.returncode == 2
    assert "1 restoration(s)" in table.stdout and "original" in table.stdout

    assert agent("apply", "-f", str(doc), "--state-dir", state).returncode == 0
    assert queue(loop)["max_sectors_kb"] == before["max_sectors_kb"]
    assert agent("plan", "-f", str(doc), "--state-dir", state).returncode == 0
    assert agent("restore", "--state-dir", state).returncode == 0


def test_plan_cannot_read_the_state_directory(tmp_path: Path) -> None:
    """Hostile: the originals store unreadable (here a directory): an error naming it, exit 1,
    not a plan that silently shows no restoration."""
    state = tmp_path / "state"
    (state / "originals.json").mkdir(parents=True)
    doc = tmp_path / "p.yaml"
    doc.write_text(profile("loop0", "{read_ahead_kb: 1024}"))
    result = agent("plan", "-f", str(doc), "--state-dir", str(state))
    assert result.returncode == 1
    assert "originals.json: cannot read the originals store" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("settings", "match", "words"),
    [
        ("{read_ahead_kb: -4}", None, "spec.rules[0].settings.read_ahead_kb: must be >= 0"),
        ("{read_ahead_kb: fast}", None, "spec.rules[0].settings.read_ahead_kb: must be an integer"),
        ("{nr_requests: 5000}", None, "spec.rules[0].settings.nr_requests: must be <= 2048"),
        ("{read_ahead_kb: 512, turbo: 1}", None, "spec.rules[0].settings.turbo: unknown field"),
        ("{read_ahead_kb: 512}", "{kind: [tape]}", "spec.rules[0].match.kind[0]"),
        ("{read_ahead_kb: 512}", "{name: ['../vda']}", "spec.rules[0].match.name"),
    ],
)
def test_bad_input_is_named_and_changes_nothing(loop: str, tmp_path: Path, settings: str,
                                                match: str | None, words: str) -> None:
    before = queue(loop)
    doc = tmp_path / "bad.yaml"
    doc.write_text(profile(loop, settings, match=match))
    result = agent("apply", "-f", str(doc), "--state-dir", str(tmp_path / "state"))
    assert result.returncode == 1
    assert words in result.stderr + result.stdout
    assert queue(loop) == before
    assert not (tmp_path / "state" / "desired.json").exists()


@pytest.mark.parametrize(
    ("settings", "tunable", "words"),
    [
        ("{read_ahead_kb: 512, scheduler: warp-drive}", "scheduler",
         "scheduler 'warp-drive' is not offered by this kernel"),
        ("{read_ahead_kb: 512, max_sectors_kb: 1048576}", "max_sectors_kb",
         "max_sectors_kb 1048576 exceeds max_hw_sectors_kb"),
    ],
)
def test_hostile_a_value_the_device_refuses_is_an_error_on_that_setting_alone(
        loop: str, tmp_path: Path, settings: str, tunable: str, words: str) -> None:
    before = queue(loop)
    doc, state = tmp_path / "bad.yaml", str(tmp_path / "state")
    doc.write_text(profile(loop, settings))
    result = agent("apply", "-f", str(doc), "--state-dir", state)
    assert result.returncode == 1
    assert f"error: loop-test/the-loop: {loop} {tunable}=" in result.stderr and words in result.stderr
    assert "1 cannot be set" in result.stdout
    # The rest is applied and kept (the desired state is stored for re-applies); the refused one not.
    assert queue(loop) == {**before, "read_ahead_kb": "512"}
    assert (tmp_path / "state" / "desired.json").exists()
    assert agent("plan", "-f", str(doc), "--state-dir", state).returncode == 1
    assert agent("restore", "--state-dir", state).returncode == 0
    assert queue(loop) == before


def test_not_a_storage_profile(tmp_path: Path) -> None:
    doc = tmp_path / "cm.yaml"
    doc.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {}\n")
    result = agent("plan", "-f", str(doc))
    assert result.returncode == 1
    assert "kind: 'ConfigMap' is not a StorageProfile document" in result.stderr


@pytest.mark.parametrize("command", ["plan", "apply", "explain", "udev-rules"])
@pytest.mark.parametrize(("model", "words"), [
    ("(" * 1000, "the regular expression has 1000 characters; at most 256"),  # was a RecursionError
    (r"(\w)\1", "not a regular expression RE2 can run: invalid escape sequence: \\1"),
])
def test_a_pattern_that_cannot_run_is_named_without_a_traceback(
    tmp_path: Path, command: str, model: str, words: str,
) -> None:
    """Hostile: the document is refused before any device is read or written."""
    doc = tmp_path / "p.yaml"
    doc.write_text(profile("sda", "{read_ahead_kb: 4096}", match=f"{{kind: [disk], model: '{model}'}}"))
    state = tmp_path / "state"
    result = agent(command, "-f", str(doc), *(["--state-dir", str(state)] if command == "apply" else []))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert f"p.yaml (StorageProfile/loop-test): spec.rules[0].match.model: {words}" in result.stderr
    assert not (state / "desired.json").exists()


def test_explain_and_udev_rules(loop: str, tmp_path: Path) -> None:
    doc = tmp_path / "p.yaml"
    doc.write_text(profile(loop, "{read_ahead_kb: 4096}") + "    - name: disks-only\n"
                   "      match: {kind: [disk]}\n      settings: {read_ahead_kb: 64}\n")
    explained = agent("explain", "-f", str(doc))
    assert explained.returncode == 0, explained.stderr
    assert "loop-test/the-loop" in explained.stdout
    assert "kind loop is not one of ['disk']" in explained.stdout
    rules = agent("udev-rules", "-f", str(doc))
    assert rules.returncode == 0, rules.stderr
    line = next(x for x in rules.stdout.splitlines() if (loop in x and not x.startswith("#"))
                or f'KERNEL=="{loop}"' in x)
    assert 'ATTR{queue/read_ahead_kb}="4096"' in line


def test_topology_outputs() -> None:
    for fmt in ("json", "yaml", "table"):
        result = agent("topology", "-o", fmt)
        assert result.returncode == 0, result.stderr
        assert "vda" in result.stdout
