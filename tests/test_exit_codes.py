"""Exit codes mean one thing in every stortune command line: 0 ok, 1 error (bad usage included),
2 only what a pipeline acts on (changes pending, a failed threshold, a regression).

argparse exits 2 on a usage error; a CI gate reading `stortune-agent plan`'s or `stortune diff`'s
2 as "changes pending" would then act on a typo."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

import pytest

from stortune.agent.cli import build_parser as agent_parser
from stortune.agent.cli import main as agent_main
from stortune.cli.main import build_parser as cli_parser
from stortune.cli.main import main as cli_main
from stortune.schemas.cliparser import EXIT_ERROR, Parser
from stortune.server.cli import build_parser as server_parser
from stortune.server.cli import main as server_main

Main = Callable[[Sequence[str]], int]


def exit_code(main: Main, argv: Sequence[str]) -> int:
    """What the process would exit with: main's return, or the SystemExit argparse raised."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR


# Hostile: missing required options, unknown options, bad values, unknown commands, wrong arity,
# in exactly the commands whose exit 2 means something.
USAGE_ERRORS: list[tuple[str, Main, list[str]]] = [
    ("stortune-agent", agent_main, ["plan"]),                        # -f missing
    ("stortune-agent", agent_main, ["plan", "-f", "x.yaml", "--bogus"]),
    ("stortune-agent", agent_main, ["plan", "-f", "x.yaml", "-o", "xml"]),
    ("stortune-agent", agent_main, ["bench"]),                       # -f or --preset missing
    ("stortune-agent", agent_main, ["bench", "--preset", "no-such-preset", "--target", "loop0"]),
    ("stortune-agent", agent_main, ["no-such-command"]),
    ("stortune-agent", agent_main, []),
    ("stortune", cli_main, ["diff"]),
    ("stortune", cli_main, ["diff", "-f", "x.yaml", "--bogus"]),
    ("stortune", cli_main, ["bench", "run"]),
    ("stortune", cli_main, ["bench", "run", "-f", "x.yaml", "--poll", "-1"]),
    ("stortune", cli_main, ["bench", "compare", "only-one"]),
    ("stortune", cli_main, ["bench", "compare", "a", "b", "-o", "xml"]),
    ("stortune", cli_main, ["bench", "no-such-action"]),
    ("stortune", cli_main, ["no-such-command"]),
    ("stortune-server", server_main, ["--bogus"]),
    ("stortune-server", server_main, ["--rate-limit", "nonsense"]),
    ("stortune-server", server_main, ["token", "create"]),            # --role missing
    ("stortune-server", server_main, ["certs"]),
]


@pytest.mark.parametrize(("tool", "main", "argv"), USAGE_ERRORS,
                         ids=[f"{tool} {' '.join(argv)}" for tool, _, argv in USAGE_ERRORS])
def test_a_usage_error_exits_1_with_the_usage(tool: str, main: Main, argv: list[str],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(main, argv) == 1
    err = capsys.readouterr().err
    assert "usage:" in err and "error:" in err


def _parsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


@pytest.mark.parametrize("build", [agent_parser, cli_parser, server_parser],
                         ids=["stortune-agent", "stortune", "stortune-server"])
def test_every_parser_and_subparser_keeps_usage_errors_at_1(
        build: Callable[[], argparse.ArgumentParser]) -> None:
    """A command added later gets the same rule: every (sub)parser is a cliparser.Parser."""
    found = dict(_parsers(build()))
    assert len(found) > 3
    assert [prog for prog, p in found.items() if not isinstance(p, Parser)] == []


@pytest.mark.parametrize("module", ["stortune.agent.cli", "stortune.cli.main", "stortune.server.cli"])
def test_the_installed_entry_points_exit_1_on_bad_usage(module: str) -> None:
    """The real processes, as a pipeline runs them (the issue's case: `stortune-agent plan`)."""
    argv = {"stortune.agent.cli": ["plan"], "stortune.cli.main": ["diff"],
            "stortune.server.cli": ["token", "create"]}[module]
    done = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    assert "the following arguments are required" in done.stderr
