"""apply and diff share this: one decision per document (create, configure, leave), one prune rule,
and one view per host of what the whole set would do there."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from stortune.cli.client import (
    Client,
    ClientError,
    Conflict,
    DryRun,
    HostPlan,
    NotFound,
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


def pending(plan: HostPlan) -> int:
    """What would really happen on the host: enforced changes and settings put back."""
    enforced = sum(1 for c in plan.changes if c.source.mode != "audit")
    return enforced + len(plan.restorations)


def errors(plans: Sequence[HostPlan], profiles: Collection[str]) -> list[tuple[str, PlannedRejection]]:
    """(host, error) for every setting of ``profiles`` a host cannot set: each blocks only itself
    there, but the files ask for something that will not happen."""
    return [(plan.host, r) for plan in plans for r in plan.rejections
            if r.fatal and r.source.profile in profiles]


def host_changes(client: Client, outcomes: Sequence[Outcome], *, pruned: Collection[str] = ()
                 ) -> list[HostPlan]:
    """One view per host of what applying these documents (and pruning ``pruned``) would do there.

    Planned by the control plane for the whole set at once (``POST /plans``):
    each document's own dry run plans it with the *stored* versions of the
    others, so it cannot tell that a setting one file removes another file now
    sets, nor what a prune puts back. Only documents whose own dry run passed
    are sent, as apply would store only those.
    """
    if not outcomes and not pruned:
        return []
    return client.plan([o.manifest.document() for o in outcomes], list(pruned))
