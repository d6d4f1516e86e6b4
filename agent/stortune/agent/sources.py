"""Where profiles come from on the command line: files, directories, stdin."""

from __future__ import annotations

from collections.abc import Sequence

from stortune.schemas.documents import DocumentError, Problem, duplicate_names, load_profiles, read_sources
from stortune.schemas.profile import StorageProfile


def read_profiles(paths: Sequence[str]) -> list[StorageProfile]:
    """Every profile from every source, or one DocumentError listing all problems."""
    profiles: list[StorageProfile] = []
    texts, problems = read_sources(paths)
    for source, text in texts:
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
