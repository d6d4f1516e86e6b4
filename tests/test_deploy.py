"""The shipped systemd units start the commands with arguments the tools accept."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import pytest

from stortune.agent.cli import build_parser as agent_parser
from stortune.server.cli import build_parser as server_parser

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PARSERS = {"stortune-agent": agent_parser, "stortune-server": server_parser}


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
    args = PARSERS[tool]().parse_args(argv[2:])  # argparse exits (fails the test) on a bad flag
    assert str(args.state_dir) == env["STATE_DIRECTORY"]
