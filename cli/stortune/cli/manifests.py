"""StorageProfile documents as kept in a GitOps repository: read, validated locally, compared.

Everything is validated before anything is sent, so one bad document stops the
whole apply instead of leaving the server half updated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

from stortune.cli.client import JSON, Profile
from stortune.schemas.documents import (
    DocumentError,
    Problem,
    duplicate_names,
    load_yaml_documents,
    parse_profile,
    read_sources,
)
from stortune.schemas.profile import StorageProfile

# Marks what `stortune apply` wrote, so --prune can tell it from profiles made by hand
# (kubectl's last-applied annotation, reduced to ownership).
MANAGED_BY: Final = "stortune.dev/managed-by"
MANAGER: Final = "stortune-apply"
# Other stortune documents a repository keeps next to its profiles (examples/benchmarks/,
# examples/tuning/): `bench run -f`, `bench schedule create -f` and `tune run -f` take them;
# apply and diff pass over them.
NOT_APPLIED: Final = frozenset({"BenchmarkSpec", "BenchmarkSchedule", "TuningExperiment"})
# Metadata the server sets and shows; dropped so `get -o yaml` output applies again.
_SERVER_METADATA: Final = ("deletionTimestamp", "finalizers", "generation", "resourceVersion", "uid",
                           "creationTimestamp")


@dataclass(frozen=True)
class Manifest:
    """One document to apply: where it came from and the body the server should hold."""

    source: str
    profile: StorageProfile

    @property
    def name(self) -> str:
        return self.profile.name

    @property
    def ref(self) -> str:
        return f"storageprofile/{self.name}"

    def document(self, resource_version: str | None = None) -> JSON:
        """The request body; with ``resource_version`` the write is conditional on it."""
        canonical = self.profile.document()
        metadata: JSON = {
            "name": self.name,
            "labels": dict(self.profile.metadata.labels),
            "annotations": {**self.profile.metadata.annotations, MANAGED_BY: MANAGER},
        }
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": canonical["apiVersion"], "kind": canonical["kind"], "metadata": metadata,
                "spec": canonical["spec"]}

    def compared(self) -> JSON:
        return comparable(self.document())


def comparable(document: JSON) -> JSON:
    """The parts apply owns, in the server's canonical form (defaults filled, unset fields absent):
    equal exactly when applying would change nothing."""
    meta: Any = document.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return {
        "metadata": {"name": meta.get("name"), "labels": meta.get("labels") or {},
                     "annotations": meta.get("annotations") or {}},
        "spec": document.get("spec") or {},
    }


def live(profile: Profile) -> JSON:
    return comparable(profile.raw)


def is_managed(profile: Profile) -> bool:
    return profile.annotations.get(MANAGED_BY) == MANAGER


def _strip_server_fields(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    data = {k: v for k, v in data.items() if k != "status"}
    meta = data.get("metadata")
    if isinstance(meta, dict):
        data["metadata"] = {k: v for k, v in meta.items() if k not in _SERVER_METADATA}
    return data


def read(paths: Sequence[str], stdin: TextIO | None = None) -> list[Manifest]:
    """Every document from every source, or one DocumentError listing every problem found."""
    manifests: list[Manifest] = []
    texts, problems = read_sources(paths, stdin)
    for source, text in texts:
        try:
            documents = load_yaml_documents(text, source)
        except DocumentError as exc:
            problems.extend(exc.problems)
            continue
        for where, data in documents:
            if isinstance(data, dict) and data.get("kind") in NOT_APPLIED:
                continue
            try:
                profile = parse_profile(_strip_server_fields(data), where)
            except DocumentError as exc:
                problems.extend(exc.problems)
                continue
            if profile.spec.hostSelector is None:
                # The server refuses it too; caught here so nothing at all is sent.
                problems.append(Problem(f"{where} (StorageProfile/{profile.name})", "spec.hostSelector",
                                        "required by the control plane: name the hosts this profile "
                                        "applies to with matchLabels or matchExpressions"))
                continue
            manifests.append(Manifest(source, profile))
    problems.extend(duplicate_names([m.profile for m in manifests], "input"))
    if not manifests and not problems:
        problems.append(Problem(", ".join(paths), "", "no StorageProfile documents found"))
    if problems:
        raise DocumentError(problems)
    return manifests
