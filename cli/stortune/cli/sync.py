"""apply and diff share this: one decision per document (create, configure, leave), one prune rule,
and one way of reading the server's dry-run plans into per-host changes."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stortune.cli.client import (
    Client,
    ClientError,
    Conflict,
    DryRun,
    HostPlan,
    NotFound,
    PlannedChange,
    PlannedRejection,
    Profile,
)
from stortune.cli.manifests import Manifest, is_managed, live

Action = Literal["created", "configured", "unchanged"]


@dataclass(frozen=True)
class Outcome:
    manifest: Manifest
    action: Action
    live: Profile | None  # as read before the write; None when it did not exist
    dry_run: DryRun | None = None


class BeingDeleted(ClientError):
    """Not retried: the server holds the object until its hosts have restored their settings."""


def apply(client: Client, manifest: Manifest, *, dry_run: bool) -> Outcome:
    """Create or replace one profile; a 409 gets one more try on a fresh read, then propagates."""
    try:
        return _apply_once(client, manifest, dry_run=dry_run)
    except Conflict:
        # Someone wrote between our GET and our write (or created it first): re-read and decide again.
        return _apply_once(client, manifest, dry_run=dry_run)


def _apply_once(client: Client, manifest: Manifest, *, dry_run: bool) -> Outcome:
    try:
        current: Profile | None = client.get_profile(manifest.name)
    except NotFound:
        current = None
    if current is None:
        body = manifest.document()
        if dry_run:
            return Outcome(manifest, "created", None, client.preview_create(body))
        client.create_profile(body)
        return Outcome(manifest, "created", None)
    if current.deleting:
        raise BeingDeleted("being deleted: hosts are still restoring its settings (see `stortune get "
                           f"events --profile {manifest.name}`); apply it again once it is gone")
    action: Action = "configured" if live(current) != manifest.compared() else "unchanged"
    # The resourceVersion just read makes the write conditional: a change made since is a 409.
    body = manifest.document(current.resource_version)
    if dry_run:
        return Outcome(manifest, action, current, client.preview_replace(manifest.name, body))
    if action == "configured":
        client.replace_profile(manifest.name, body)
    return Outcome(manifest, action, current)


def prunable(client: Client, keep: Collection[str]) -> list[Profile]:
    """Profiles an earlier apply created that the files no longer hold. Hand-made ones never are."""
    return [p for p in client.list_profiles().items
            if is_managed(p) and p.name not in keep and not p.deleting]


@dataclass
class HostChanges:
    host: str
    topology_reported: bool = True
    changes: list[PlannedChange] = field(default_factory=list)
    rejections: list[PlannedRejection] = field(default_factory=list)

    def plan(self) -> HostPlan:
        return HostPlan(self.host, self.topology_reported, self.changes, self.rejections)

    @property
    def pending(self) -> int:
        """What would really happen on the host: enforced changes, and rejections that block it."""
        enforced = sum(1 for c in self.changes if c.source.mode != "audit")
        return enforced + sum(1 for r in self.rejections if r.fatal)


def host_changes(outcomes: Sequence[Outcome], *, pruned: Collection[str] = ()) -> list[HostChanges]:
    """Merge the per-document dry runs into one view per host.

    Each dry run plans its document together with the *stored* versions of the
    other profiles on the host. A change is therefore taken from the dry run of
    the document that makes it, so a profile also being applied is seen in its
    new version, and profiles being pruned are left out.
    """
    applied = {o.manifest.name for o in outcomes}
    hosts: dict[str, HostChanges] = {}
    seen: set[tuple[str, ...]] = set()
    for outcome in outcomes:
        if outcome.dry_run is None:
            continue
        own = outcome.manifest.name
        for plan in outcome.dry_run.plans:
            view = hosts.setdefault(plan.host, HostChanges(plan.host))
            if not plan.topology_reported:
                view.topology_reported = False
                continue
            for change in plan.changes:
                owner = change.source.profile
                key = (plan.host, "change", change.device, change.tunable, owner, change.source.rule)
                if _authoritative(owner, own, applied, pruned) and key not in seen:
                    seen.add(key)
                    view.changes.append(change)
            for rejection in plan.rejections:
                owner = rejection.source.profile
                key = (plan.host, "rejection", rejection.device, rejection.tunable, owner,
                       rejection.source.rule)
                if _authoritative(owner, own, applied, pruned) and key not in seen:
                    seen.add(key)
                    view.rejections.append(rejection)
    return [hosts[name] for name in sorted(hosts)]


def _authoritative(owner: str, planned: str, applied: Collection[str], pruned: Collection[str]) -> bool:
    if owner in pruned:
        return False
    return owner == planned or owner not in applied
