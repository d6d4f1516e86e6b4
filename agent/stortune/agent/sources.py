"""Where profiles come from on the command line: files, directories, stdin."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from stortune.schemas.documents import DocumentError, Problem, duplicate_names, load_profiles
from stortune.schemas.profile import StorageProfile

YAML_SUFFIXES = (".yaml", ".yml", ".json")


def expand(paths: Sequence[str]) -> list[Path | None]:
    """Files in the order given; a directory contributes its YAML files sorted by name.

    ``None`` stands for standard input (``-``).
    """
    out: list[Path | None] = []
    for raw in paths:
        if raw == "-":
            out.append(None)
            continue
        path = Path(raw)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.suffix in YAML_SUFFIXES and p.is_file()))
        else:
            out.append(path)
    return out


def read_profiles(paths: Sequence[str]) -> list[StorageProfile]:
    """Every profile from every source, or one DocumentError listing all problems."""
    profiles: list[StorageProfile] = []
    problems: list[Problem] = []
    for path in expand(paths):
        source = "<stdin>" if path is None else str(path)
        try:
            text = sys.stdin.read() if path is None else path.read_text()
        except OSError as exc:
            problems.append(Problem(source, "", f"cannot read: {exc.strerror}"))
            continue
        try:
            profiles.extend(load_profiles(text, source))
        except DocumentError as exc:
            problems.extend(exc.problems)
    problems.extend(duplicate_names(profiles, "input"))
    if not profiles and not problems:
        problems.append(Problem(", ".join(paths), "", "no StorageProfile documents found"))
    if problems:
        raise DocumentError(problems)
    return profiles
