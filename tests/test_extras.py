"""`pip install stortune` is the agent alone; the control plane and the client come with extras.

Run in this environment (which has everything) with a sitecustomize that makes the
extras' modules unimportable: the agent still loads and runs, and the other console
scripts say in one line which extra to install. tests/test_packaging.py installs the
bare wheel for real.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from stortune.cli import launch as cli_launch
from stortune.server import launch as server_launch
from tests.deployfiles import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
BIN = Path(sys.executable).parent

BLOCKER = """
import os, sys

BLOCKED = set(os.environ["STORTUNE_TEST_BLOCK"].split(","))


class Unimportable:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Unimportable())
"""


def dist_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return match.group(0).lower().replace("_", "-")


def extra(name: str) -> list[str]:
    """The distributions of an extra, self-references (stortune[tune]) followed."""
    out = []
    for requirement in PROJECT["optional-dependencies"][name]:
        inner = re.fullmatch(r"stortune\[([\w,]+)\]", requirement)
        out += [d for e in inner.group(1).split(",") for d in extra(e)] if inner else [dist_name(requirement)]
    return out


def modules_of(dist: str) -> set[str]:
    return {module for module, dists in importlib.metadata.packages_distributions().items()
            if dist in {d.lower().replace("_", "-") for d in dists}}


def run(tmp_path: Path, blocked: set[str], *argv: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "STORTUNE_TEST_BLOCK": ",".join(sorted(blocked))}
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                          check=False)


SERVER, CLI = server_launch.EXTRA_MODULES, cli_launch.EXTRA_MODULES


@pytest.mark.parametrize(("name", "modules"), [("server", SERVER), ("cli", CLI)])
def test_the_launchers_know_the_modules_of_their_extra(name: str, modules: frozenset[str]) -> None:
    dists = extra(name)
    for dist in dists:
        assert modules_of(dist) & modules, f"{dist} (extra {name}) has no module in the launcher's list"
    owned = set().union(*(modules_of(d) for d in dists))
    assert modules <= owned, f"not of the {name} extra: {sorted(modules - owned)}"


def test_the_base_dependencies_hold_nothing_of_the_extras() -> None:
    base = {dist_name(r) for r in PROJECT["dependencies"]}
    assert not base & set(extra("server") + extra("cli"))
    assert {"fastapi", "sqlalchemy", "psycopg", "matplotlib", "optuna", "httpx"} <= set(extra("server"))


def test_the_agent_runs_without_the_extras(tmp_path: Path) -> None:
    blocked = SERVER | CLI
    out = run(tmp_path, blocked, str(BIN / "stortune-agent"), "--help")
    assert out.returncode == 0, out.stderr
    # Every agent module loads (serve, rpc, bench, tune...), not only what --help touches.
    load_all = ("import importlib, pkgutil, stortune.agent as a\n"
                "for m in pkgutil.walk_packages(a.__path__, 'stortune.agent.'):\n"
                "    importlib.import_module(m.name)\n"
                "print('agent loaded')\n"
                "import fastapi\n")
    out = run(tmp_path, blocked, sys.executable, "-c", load_all)
    assert out.stdout == "agent loaded\n", out.stderr
    assert "No module named 'fastapi'" in out.stderr  # and the blocker works


@pytest.mark.parametrize(("script", "blocked", "hint"), [
    ("stortune-server", SERVER, "pip install 'stortune[server]'"),
    ("stortune-server", {"fastapi"}, "pip install 'stortune[server]'"),
    ("stortune", CLI, "pip install 'stortune[cli]'"),
])
def test_a_console_script_names_the_extra_it_misses(
    tmp_path: Path, script: str, blocked: set[str], hint: str,
) -> None:
    out = run(tmp_path, set(blocked), str(BIN / script), "--help")
    assert out.returncode == 1 and out.stdout == ""
    assert "Traceback" not in out.stderr and hint in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_another_missing_module_is_not_blamed_on_an_extra(tmp_path: Path) -> None:
    out = run(tmp_path, {"pydantic"}, str(BIN / "stortune-server"), "--help")
    assert out.returncode == 1 and "Traceback" in out.stderr and "stortune[server]" not in out.stderr


def test_a_bayesian_experiment_names_the_extra_before_touching_anything(tmp_path: Path) -> None:
    doc = (ROOT / "examples" / "tuning" / "local-demo-readahead.yaml").read_text()
    experiment = tmp_path / "bayesian.yaml"
    experiment.write_text(doc.replace("strategy: one-at-a-time", "strategy: bayesian"))
    state = tmp_path / "state"
    out = run(tmp_path, {"optuna"}, str(BIN / "stortune-agent"), "tune", "-f", str(experiment),
              "--state-dir", str(state))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "pip install 'stortune[tune]'" in out.stderr, out.stderr
    assert not state.exists(), "nothing recovered, discovered or journaled first"
