"""Reading documents: multi-document YAML in, validated models or clear errors out.

Errors name the source, the document's position and the field path
(``spec.rules[0].settings.read_ahead_kb``), so a GitOps pipeline can point at
the line to fix.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from pydantic import ValidationError

from stortune.schemas.profile import API_VERSION, StorageProfile

KINDS = ("StorageProfile",)
#: stortune's other documents, which a repository keeps next to its profiles, and what runs them.
OTHER_KINDS = {
    "BenchmarkSpec": "stortune bench run -f (or stortune-agent bench -f)",
    "BenchmarkSchedule": "stortune bench schedule create -f",
    "TuningExperiment": "stortune tune run -f (or stortune-agent tune -f on one host)",
}
#: What a directory contributes (JSON is YAML too).
SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class Problem:
    where: str  # file and document number
    path: str  # field path inside the document, "" for the whole document
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.path}: {self.message}" if self.path else f"{self.where}: {self.message}"


class DocumentError(ValueError):
    """One or more invalid documents; nothing from the input should be used."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def field_path(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def validation_problems(exc: ValidationError, where: str) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field" + (
                " (not a tunable in the catalog)" if "settings" in err["loc"] else ""
            )
        problems.append(Problem(where, field_path(err["loc"]), msg))
    return problems


def check_header(data: Any, where: str, kind: str) -> dict[str, Any]:
    """``data`` if it is a mapping of ``kind`` at apiVersion stortune/v1, else DocumentError."""
    if not isinstance(data, dict):
        raise DocumentError([Problem(where, "", f"expected a mapping, got {type(data).__name__}")])
    if data.get("kind") != kind:
        raise DocumentError([Problem(where, "kind", f"{data.get('kind')!r:.80} is not a {kind} document")])
    if data.get("apiVersion") != API_VERSION:
        raise DocumentError([Problem(where, "apiVersion",
                                     f"{data.get('apiVersion')!r:.80}; expected {API_VERSION!r}")])
    return data


def labelled(data: dict[str, Any], where: str, kind: str) -> str:
    """Where a document is, with its kind and name when it has one: ``exp.yaml (Kind/name)``."""
    meta = data.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{where} ({kind}/{name})" if isinstance(name, str) and 0 < len(name) <= 253 else where


def without_tags(problems: list[Problem], lists: str, tags: Iterable[str]) -> list[Problem]:
    """Problems without the union tag pydantic puts after an item of a tagged list
    (``workloads[0].preset.size`` is ``workloads[0].size``); ``lists`` is a regex of the lists."""
    out = []
    for problem in problems:
        path = problem.path
        for tag in tags:
            path = re.sub(rf"((?:{lists})\[\d+\])\.{tag}(?=\.|$)", r"\1", path, count=1)
        out.append(Problem(problem.where, path, problem.message))
    return out


#: A sub-path a validator puts before its message ("@values[3] ...") to name the item at fault.
_SUBPATH = re.compile(r"^@((?:\.?[A-Za-z]+|\[\d+\])+) ")


def with_subpath(path: str, message: str) -> tuple[str, str]:
    """A validator's ``@sub.path`` message prefix moved onto the field ``path``: (path, message)."""
    m = _SUBPATH.match(message)
    if m is None:
        return path, message
    sub = m.group(1)
    return (path + ("" if sub.startswith("[") else ".") + sub) if path else sub, message[m.end():]


def parse_profile(data: Any, where: str = "document") -> StorageProfile:
    if not isinstance(data, dict):
        raise DocumentError([Problem(where, "", f"expected a mapping, got {type(data).__name__}")])
    kind, api = data.get("kind"), data.get("apiVersion")
    if kind not in KINDS:
        hint = f": run it with {OTHER_KINDS[kind]}" if isinstance(kind, str) and kind in OTHER_KINDS else ""
        raise DocumentError([Problem(where, "kind", f"{kind!r:.80} is not a StorageProfile document{hint}")])
    if api != API_VERSION:
        raise DocumentError([Problem(where, "apiVersion", f"{api!r}; expected {API_VERSION!r}")])
    try:
        return StorageProfile.model_validate(data)
    except ValidationError as exc:
        meta = data.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        label = f"{where} (StorageProfile/{name})" if name else where
        raise DocumentError(_rollout_paths(validation_problems(exc, label))) from None


def _rollout_paths(problems: list[Problem]) -> list[Problem]:
    """``spec.rollout`` problems named as rollout/spec.parse_rollout names them: without the
    benchmark's union tag, a validator's ``@sub.path`` moved onto the path."""
    out = []
    for problem in problems:
        if problem.path == "spec.rollout" or problem.path.startswith("spec.rollout."):
            path = re.sub(r"^(spec\.rollout\.analysis\.benchmark)\.(?:spec|preset|workload)(?=\.|$)", r"\1",
                          problem.path)
            path, message = with_subpath(path, problem.message)
            out.append(Problem(problem.where, path, message))
        else:
            out.append(problem)
    return out


def load_yaml_documents(text: str, source: str = "<input>") -> list[tuple[str, Any]]:
    """(where, data) for each non-empty YAML document in ``text``."""
    import yaml  # here: the serving agent receives and stores JSON only, and need not load it

    from stortune.schemas import yamlsafe

    try:
        docs = yamlsafe.load_all(text)
    except yaml.YAMLError as exc:
        raise DocumentError([Problem(source, "", f"not valid YAML: {exc}")]) from None
    out = []
    for index, data in enumerate(docs):
        if data is None:
            continue
        where = source if len(docs) == 1 else f"{source} (document {index + 1})"
        out.append((where, data))
    return out


def load_profiles(text: str, source: str = "<input>") -> list[StorageProfile]:
    """Every StorageProfile in a multi-document YAML text; all problems reported at once."""
    profiles: list[StorageProfile] = []
    problems: list[Problem] = []
    for where, data in load_yaml_documents(text, source):
        try:
            profiles.append(parse_profile(data, where))
        except DocumentError as exc:
            problems.extend(exc.problems)
    problems.extend(duplicate_names(profiles, source))
    if problems:
        raise DocumentError(problems)
    return profiles


def duplicate_names(profiles: list[StorageProfile], where: str) -> list[Problem]:
    names = [p.metadata.name for p in profiles]
    return [
        Problem(where, "metadata.name", f"{dupe!r} is defined more than once")
        for dupe in sorted({n for n in names if names.count(n) > 1})
    ]


def document_files(paths: Sequence[str]) -> list[Path | None]:
    """Files in the order given; a directory adds its YAML files, recursively, sorted.

    Hidden files and directories (.git, .github/workflows) are skipped: they are
    not profiles. ``None`` stands for standard input (``-``).
    """
    out: list[Path | None] = []
    for raw in paths:
        if raw == "-":
            out.append(None)
            continue
        path = Path(raw)
        if not path.is_dir():
            out.append(path)
            continue
        found = (p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        out.extend(sorted(p for p in found
                          if not any(part.startswith(".") for part in p.relative_to(path).parts)))
    return out


def read_sources(paths: Sequence[str], stdin: TextIO | None = None
                 ) -> tuple[list[tuple[str, str]], list[Problem]]:
    """(source name, text) of every file of ``paths``, and a problem for each unreadable one."""
    texts: list[tuple[str, str]] = []
    problems: list[Problem] = []
    for path in document_files(paths):
        source = "<stdin>" if path is None else str(path)
        try:
            texts.append((source, (stdin or sys.stdin).read() if path is None
                          else path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            problems.append(Problem(source, "", f"cannot read: {reason}"))
    return texts, problems
