"""Layering: schemas is pure; the agent never imports the control plane; the CLI is a REST client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "schemas": ("stortune.agent", "stortune.server", "os", "subprocess", "socket"),
    # prometheus_client: the control plane's /metrics only; the agent's idle memory has no room for it.
    "agent": ("stortune.server", "prometheus_client"),
    # It speaks to the control plane over HTTP only; validation and plans come from schemas.
    "cli": ("stortune.server", "stortune.agent"),
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("part", sorted(FORBIDDEN))
def test_layer_does_not_import_forbidden_modules(part: str) -> None:
    files = sorted((ROOT / part / "stortune").rglob("*.py"))
    assert files, f"no sources under {part}/"
    offenders = [
        f"{f.relative_to(ROOT)} imports {name}"
        for f in files
        for name in imports(f)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[part])
    ]
    assert offenders == []
