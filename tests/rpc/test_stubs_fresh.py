"""The committed protobuf/gRPC stubs are what proto/generate.py makes from the .proto files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"


def _stubs(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*_pb2*")) if p.suffix in (".py", ".pyi")}


def test_committed_stubs_match_a_fresh_generation(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(PROTO / "generate.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    fresh, committed = _stubs(tmp_path), _stubs(PROTO)
    assert fresh, "generate.py produced no stubs"
    stale = sorted(name for name in fresh.keys() | committed.keys()
                   if fresh.get(name) != committed.get(name))
    assert not stale, f"stale generated stubs {stale}: run python proto/generate.py"


def test_generated_files_say_so() -> None:
    for name, data in _stubs(PROTO).items():
        assert b"DO NOT EDIT" in data.split(b"\n\n", 1)[0], f"{name} lacks the generated-code header"


def test_the_proto_tree_is_a_namespace_root() -> None:
    # proto/stortune is one root of the PEP 420 `stortune` namespace: an
    # __init__.py there would hide stortune.agent, stortune.schemas, ...
    assert not (PROTO / "stortune" / "__init__.py").exists()
    for package in ("api", "api/agent", "api/agent/v1"):
        assert (PROTO / "stortune" / package / "__init__.py").is_file(), package
