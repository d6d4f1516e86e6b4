"""What the deploy/ tests share: where the files are and the parsers their command lines must pass."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from stortune.agent.cli import build_parser as agent_parser
from stortune.server.cli import build_parser as server_parser

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
#: Each console script that deploy/ starts, and its real argument parser.
PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "stortune-agent": agent_parser, "stortune-server": server_parser,
}


def parse_command(tool: str, args: list[str]) -> argparse.Namespace:
    """``args`` as ``tool`` parses them; argparse exits (failing the test) on a bad flag."""
    return PARSERS[tool]().parse_args(args)
