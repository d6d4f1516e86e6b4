"""Who may touch the generated protobuf code and grpc.

Only ``stortune.api.agent.wire`` imports the generated stubs. In the agent,
grpc is for serve mode only: the CLI's other commands and the standalone
daemon stay small (idle RSS) and keep working where grpc is unusable.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_boundaries import imports

ROOT = Path(__file__).resolve().parents[2]
WIRE = ROOT / "proto" / "stortune" / "api" / "agent" / "wire.py"
SOURCE_DIRS = ("agent", "schemas", "server", "proto", "tests", "bench")
GRPC_IN_AGENT = {"rpc.py", "serve.py", "mtls.py"}


def _generated(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return "_pb2" in last or name.startswith("stortune.api.agent.v1")


def _is_generated_file(path: Path) -> bool:
    return "_pb2" in path.name


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")
                  if ".venv" not in p.parts and not _is_generated_file(p))


def test_only_wire_imports_the_generated_code() -> None:
    offenders = [f"{p.relative_to(ROOT)} imports {name}" for p in _sources() if p != WIRE
                 for name in imports(p) if _generated(name)]
    assert offenders == []
    assert any(_generated(name) for name in imports(WIRE))


def test_grpc_is_imported_only_by_the_serve_mode_modules_of_the_agent() -> None:
    agent = ROOT / "agent" / "stortune" / "agent"
    offenders = [p.name for p in agent.rglob("*.py")
                 if any(n == "grpc" or n.startswith(("grpc.", "google.protobuf")) for n in imports(p))
                 and p.name not in GRPC_IN_AGENT]
    assert offenders == []


@pytest.mark.parametrize("module", ["stortune.agent.cli", "stortune.agent.daemon",
                                    "stortune.agent.registration"])
def test_standalone_agent_modules_load_without_grpc(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'grpc'"\
           f" or m.startswith('google.protobuf') or m.startswith('stortune.server')))"
    # -I: a caller's PYTHONPATH or sitecustomize must not change what gets imported.
    out = subprocess.run([sys.executable, "-I", "-c", code], check=True, capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]"
