"""StorageProfiles: validation, storage with optimistic concurrency, finalization, dry runs."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from stortune.schemas import stripecache
from stortune.schemas.documents import DocumentError, parse_profile, validation_problems
from stortune.schemas.plan import Plan
from stortune.schemas.planner import plan
from stortune.schemas.profile import API_VERSION, LabelSelector, StorageProfile, pattern_count
from stortune.server.controller import request_reconcile
from stortune.server.db.tables import Host, Profile
from stortune.server.errors import AlreadyExists, Cause, Conflict, Invalid, NotFound
from stortune.server.models.common import unstorable
from stortune.server.models.hosts import holding_kernel_refusals, rebooted, settings_table
from stortune.server.models.meta import parse_resource_version
from stortune.server.services import events, finalizers, hosts, rollouts
from stortune.server.services.finalizers import FINALIZER
from stortune.server.services.versions import current_resource_version, next_resource_version

KIND = "StorageProfile"
# Metadata the server owns and shows in documents. Clients that send a fetched
# document back (kubectl-style round trips) must not fail on them; the
# StorageProfile schema does not know them, so they are dropped before parsing.
_SERVER_METADATA = ("deletionTimestamp", "finalizers")


def validate(data: Any) -> StorageProfile:
    """A request body -> StorageProfile, or Invalid naming each bad field."""
    meta = data.get("metadata") if isinstance(data, dict) else None
    name = meta.get("name") if isinstance(meta, dict) and isinstance(meta.get("name"), str) else None
    found = unstorable(data)
    if found:
        raise Invalid([found], kind=KIND, name=name)
    if isinstance(meta, dict):
        data = {**data, "metadata": {k: v for k, v in meta.items() if k not in _SERVER_METADATA}}
    try:
        profile = parse_profile(data)
    except DocumentError as exc:
        raise Invalid([Cause(p.path, p.message) for p in exc.problems], kind=KIND, name=name) from None
    if profile.spec.hostSelector is None:
        raise Invalid([Cause("spec.hostSelector", "required by the control plane: name the hosts this "
                             "profile applies to with matchLabels or matchExpressions")],
                      kind=KIND, name=profile.name)
    return profile


def _spec_json(profile: StorageProfile) -> dict[str, Any]:
    # One canonical form (defaults filled, unset fields absent) so "did the
    # spec change" is a plain comparison.
    return profile.spec.model_dump(mode="json", by_alias=True, exclude_none=True)


class StoredProfileInvalid(Conflict):
    """A stored profile this version refuses: written by an earlier one whose rules were looser (a
    pattern only Python's ``re`` ran, say). Nothing can be planned with it, and planning without it
    would put back every setting it makes; it must be replaced (PUT) or deleted first."""

    def __init__(self, name: str, causes: Sequence[Cause]) -> None:
        detail = "; ".join(f"{c.field}: {c.message}" for c in causes)
        super().__init__(f'{KIND} "{name}" was stored by an earlier version and is not valid now ({detail}):'
                         " replace it (PUT, see Patterns in docs/profiles.md) or delete it",
                         kind=KIND, name=name, causes=causes)


def stored_profile(row: Profile) -> StorageProfile:
    """The row as the planner takes it, generation included (plans cite it); StoredProfileInvalid
    when this version refuses what an earlier one stored."""
    try:
        return StorageProfile.model_validate({
            "metadata": {"name": row.name, "labels": row.labels, "annotations": row.annotations,
                         "generation": row.generation},
            "spec": row.spec,
        })
    except ValidationError as exc:
        raise StoredProfileInvalid(row.name, [Cause(p.path, p.message)
                                              for p in validation_problems(exc, KIND)]) from None


def stored_document(row: Profile) -> dict[str, Any]:
    """The row as a document, also when this version refuses it (then as it is stored)."""
    try:
        return stored_profile(row).document()
    except StoredProfileInvalid:
        return {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": row.name, "labels": row.labels, "annotations": row.annotations,
                             "generation": row.generation},
                "spec": row.spec}


def selector(spec: dict[str, Any]) -> LabelSelector | None:
    raw = spec.get("hostSelector")
    return LabelSelector.model_validate(raw) if raw is not None else None


def _get(session: Session, name: str) -> Profile:
    row = session.get(Profile, name)
    if row is None:
        raise NotFound(KIND, name)
    return row


def get(session: Session, name: str) -> Profile:
    return _get(session, name)


def list_profiles(
    session: Session, label_selector: LabelSelector | None = None
) -> tuple[list[Profile], int]:
    version = current_resource_version(session)
    rows = session.scalars(select(Profile).order_by(Profile.name)).all()
    return [r for r in rows if label_selector is None or label_selector.matches(r.labels)], version


def selecting(session: Session, labels: dict[str, str]) -> list[Profile]:
    """Live profiles (not being deleted) whose hostSelector matches ``labels``, by name."""
    rows = session.scalars(
        select(Profile).where(Profile.deletion_timestamp.is_(None)).order_by(Profile.name)).all()
    return [r for r in rows if (s := selector(r.spec)) is not None and s.matches(labels)]


def being_deleted(session: Session, names: Iterable[str]) -> set[str]:
    """Which of ``names`` are profiles waiting for their finalizer."""
    wanted = set(names)
    if not wanted:
        return set()
    return set(session.scalars(select(Profile.name).where(
        Profile.name.in_(wanted), Profile.deletion_timestamp.is_not(None))).all())


def _new_row(profile: StorageProfile, version: int, now: datetime) -> Profile:
    return Profile(
        name=profile.name, uid=str(uuid.uuid4()), generation=1, resource_version=version,
        spec=_spec_json(profile), labels=profile.metadata.labels,
        annotations=profile.metadata.annotations, status={}, finalizers=[FINALIZER],
        created_at=now, updated_at=now, deletion_timestamp=None,
    )


def create(session: Session, profile: StorageProfile, now: datetime) -> Profile:
    version = next_resource_version(session)
    _check_absent(session, profile.name)
    rollouts.check_analysis(session, profile)
    row = _new_row(profile, version, now)
    session.add(row)
    events.record(session, kind=KIND, name=row.name, profile=row.name, type="Normal", reason="Created",
                  message="generation 1", now=now)
    request_reconcile(session, hosts.select_names(session, selector(row.spec)),
                      f"profile {row.name} created")
    try:
        session.flush()  # the row first: the rollout reads the profile's current generation
        rollouts.forget(session, row.name)  # what an earlier profile of this name left
        rollouts.on_new_generation(session, row.name, None, _with_generation(profile, 1), 1, now=now)
        session.commit()
    except IntegrityError:  # a concurrent create won the race
        session.rollback()
        raise AlreadyExists(KIND, profile.name) from None
    return row


def _check_absent(session: Session, name: str) -> None:
    existing = session.get(Profile, name)
    if existing is None:
        return
    if existing.deletion_timestamp is not None:
        raise AlreadyExists(KIND, name, f'{KIND} "{name}" already exists and is being deleted; '
                            "create it again once it is gone")
    raise AlreadyExists(KIND, name)


def _check_preconditions(row: Profile, profile: StorageProfile) -> None:
    """Optimistic concurrency. An absent resourceVersion is an unconditional
    update, as Kubernetes allows for most kinds (kubectl replace)."""
    if row.deletion_timestamp is not None:
        raise Conflict(f'{KIND} "{row.name}" is being deleted; it cannot be changed', kind=KIND,
                       name=row.name)
    meta = profile.metadata
    if meta.uid is not None and meta.uid != row.uid:
        raise Conflict(f'{KIND} "{row.name}": metadata.uid {meta.uid} is not the stored object '
                       f"({row.uid}); it was deleted and created again", kind=KIND, name=row.name)
    if meta.resourceVersion is not None and parse_resource_version(meta.resourceVersion) != (
        row.resource_version
    ):
        raise Conflict(
            f'Operation cannot be fulfilled on {KIND} "{row.name}": the object has been modified '
            f"(resourceVersion {meta.resourceVersion}, now {row.resource_version}); "
            "read it again and apply your change to the latest version",
            kind=KIND, name=row.name)


def _replacement(row: Profile, profile: StorageProfile) -> dict[str, Any]:
    spec = _spec_json(profile)
    return {
        "spec": spec,
        "labels": profile.metadata.labels,
        "annotations": profile.metadata.annotations,
        # generation counts spec changes only: metadata edits do not make hosts re-apply.
        "generation": row.generation + 1 if spec != row.spec else row.generation,
    }


def replace(session: Session, name: str, profile: StorageProfile, now: datetime) -> Profile:
    _check_name(name, profile)
    version = next_resource_version(session)
    row = _get(session, name)
    _check_preconditions(row, profile)
    rollouts.check_analysis(session, profile)
    old_selector = selector(row.spec)
    new = _replacement(row, profile)
    if all(getattr(row, k) == v for k, v in new.items()):
        session.rollback()  # a no-op write keeps its resourceVersion, as in Kubernetes
        return row
    spec_changed = new["generation"] != row.generation
    try:
        before: StorageProfile | None = stored_profile(row) if spec_changed else None
    except StoredProfileInvalid:
        before = None  # no host could plan with it: the replacement reaches every host at once
    for key, value in new.items():
        setattr(row, key, value)
    row.resource_version = version
    row.updated_at = now
    if spec_changed:
        events.record(session, kind=KIND, name=name, profile=name, type="Normal", reason="Updated",
                      message=f"generation {row.generation}", now=now)
        targets = {*hosts.select_names(session, old_selector),
                   *hosts.select_names(session, selector(row.spec))}
        request_reconcile(session, sorted(targets), f"profile {name} changed")
    try:
        if spec_changed:
            session.flush()  # the row first (a concurrent write fails here): the rollout reads it
            if before is None:
                rollouts.drop(session, name, now)
            else:
                rollouts.on_new_generation(session, name, before, _with_generation(profile, row.generation),
                                           row.generation, now=now)
        session.commit()
    except StaleDataError:
        session.rollback()
        raise Conflict(f'{KIND} "{name}" was modified concurrently; read it again', kind=KIND,
                       name=name) from None
    return row


def _check_name(name: str, profile: StorageProfile) -> None:
    if profile.name != name:
        raise Invalid([Cause("metadata.name", f"{profile.name!r} does not match the name in the URL "
                             f"({name!r})")], kind=KIND, name=name)


def write_status(session: Session, name: str, status: dict[str, Any], now: datetime) -> Profile:
    """The reconciler's report on a profile: a write (new resourceVersion), never a new generation."""
    version = next_resource_version(session)
    row = _get(session, name)
    row.status = status
    row.resource_version = version
    row.updated_at = now
    session.commit()
    return row


def delete(session: Session, name: str, now: datetime) -> tuple[Profile, bool]:
    """Delete, or start finalizing: returns the object and whether deletion is pending.

    While any host reports the profile applied, the row stays with
    deletionTimestamp set, so the reconciler can still see which settings to
    restore; it goes when the last of those hosts reports it gone or is deleted.
    """
    version = next_resource_version(session)
    row = _get(session, name)
    if row.deletion_timestamp is not None:
        tomb = rollouts.halted_deletion(session, name)
        if tomb is None:
            session.rollback()
            return row, True
        return _delete_again(session, row, tomb, version, now), True
    holders = finalizers.holding(session, name)
    targets = {*holders, *hosts.select_names(session, selector(row.spec))}
    # Asked before the rollout starts, which withdraws the hosts pinned at what they hold.
    request_reconcile(session, sorted(targets), f"profile {name} deleted")
    if holders:
        row.deletion_timestamp = now
        row.resource_version = version
        row.updated_at = now
        events.record(session, kind=KIND, name=name, profile=name, type="Normal", reason="Deleting",
                      message=f"waiting for {len(holders)} host(s) to restore its settings: "
                      + ", ".join(holders), now=now)
        session.flush()
        try:
            before: StorageProfile | None = stored_profile(row)
        except StoredProfileInvalid:
            before = None
        if before is None:
            rollouts.drop(session, name, now)
        else:  # the restorations roll out too: a tombstone generation, one past the last
            rollouts.on_new_generation(session, name, before, None, row.generation + 1, now=now)
    else:
        session.delete(row)
        rollouts.forget(session, name)
        events.record(session, kind=KIND, name=name, profile=name, type="Normal", reason="Deleted",
                      message="no host had it applied", now=now)
    session.commit()
    if not holders:
        row.deletion_timestamp = now  # the returned document shows what happened
    return row, bool(holders)


def _delete_again(session: Session, row: Profile, tomb: int, version: int, now: datetime) -> Profile:
    """A deletion whose rollout halted starts over at a new tombstone generation, from the
    generation the hosts were put back to (the machine supersedes from the last completed one)."""
    row.resource_version = version
    row.updated_at = now
    events.record(session, kind=KIND, name=row.name, profile=row.name, type="Normal", reason="Deleting",
                  message=f"deleted again: the halted deletion (generation {tomb}) starts over", now=now)
    session.flush()
    rollouts.on_new_generation(session, row.name, stored_profile(row), None, tomb + 1, now=now)
    request_reconcile(session, rollouts.held_live(session, row.name), f"profile {row.name} deleted again")
    session.commit()
    return row


# Dry runs ------------------------------------------------------------------

HostPlans = dict[str, Plan | None]  # None: the host has not reported a topology


def _with_generation(profile: StorageProfile, generation: int) -> StorageProfile:
    meta = profile.metadata.model_copy(update={"generation": generation})
    return profile.model_copy(update={"metadata": meta})


def plans(session: Session, put: Sequence[StorageProfile] = (), delete: Collection[str] = (), *,
          ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> HostPlans:
    """What the hosts would do once ``put`` were stored and ``delete`` deleted, all at once.

    Planned, like the reconciler does, with every live profile selecting the
    host in its new version, on the values (and recorded originals) the host
    last reported; so settings a host would put back show as restorations. The
    hosts: those a profile of ``put`` selects, those the stored version of a
    changed or deleted profile selects (a host it stops selecting restores its
    settings), and those that report one of them applied.
    """
    changed = {p.name for p in put} | set(delete)
    stored = {r.name: r for r in session.scalars(
        select(Profile).where(Profile.deletion_timestamp.is_(None)).order_by(Profile.name)).all()}
    # A stored profile is read whole only where it is planned with: one an earlier version stored
    # and this one refuses (StoredProfileInvalid) fails the hosts it selects, and its replacement
    # needs no more than its selector.
    kept = [(row, s) for name, row in stored.items() if name not in changed and (s := selector(row.spec))]
    parsed: dict[str, StorageProfile] = {}
    selectors = [s for s in (*(p.spec.hostSelector for p in put),
                             *(selector(stored[n].spec) for n in changed if n in stored)) if s is not None]
    holders = finalizers.holders(session) if changed else {}
    holding = {host for name in changed for host in holders.get(name, ())}
    result: HostPlans = {}
    for host in session.scalars(select(Host).order_by(Host.name)).all():
        labels = host.effective_labels
        if host.name not in holding and not any(s.matches(labels) for s in selectors):
            continue
        topology = hosts.stored_topology(host.topology)
        if topology is None:
            result[host.name] = None
            continue
        selected = [p for p in put if p.spec.hostSelector and p.spec.hostSelector.matches(labels)]
        for row, kept_selector in kept:
            if kept_selector.matches(labels):
                if row.name not in parsed:
                    parsed[row.name] = stored_profile(row)
                selected.append(parsed[row.name])
        # As the reconciler plans: with the values the kernel refused when written, as the host's
        # agent last reported them, held as errors (the agent would report them again).
        result[host.name] = holding_kernel_refusals(
            plan(selected, topology, stripe_cache_ram_share=ram_share),
            settings_table(host.status.get("devices", [])),
            rebooted=rebooted(host.status.get("checkedBootId"), host.boot_id))
    return result


def preview_create(session: Session, profile: StorageProfile, now: datetime, *,
                   ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> tuple[Profile, HostPlans]:
    """What create would store and do, storing nothing."""
    _check_absent(session, profile.name)
    row = _new_row(profile, 0, now)
    return row, plans(session, [_with_generation(profile, row.generation)], ram_share=ram_share)


def preview_replace(
    session: Session, name: str, profile: StorageProfile, *,
    ram_share: float = stripecache.DEFAULT_RAM_SHARE,
) -> tuple[Profile, HostPlans]:
    """What replace would store and do, storing nothing."""
    _check_name(name, profile)
    row = _get(session, name)
    _check_preconditions(row, profile)
    preview = Profile(**{attr: getattr(row, attr) for attr in _COLUMNS}, **_replacement(row, profile))
    return preview, plans(session, [_with_generation(profile, preview.generation)], ram_share=ram_share)


def preview_delete(session: Session, name: str, now: datetime, *,
                   ram_share: float = stripecache.DEFAULT_RAM_SHARE) -> tuple[Profile, HostPlans]:
    """What delete would do, deleting nothing: the profile as it would be shown (deletionTimestamp
    set), and the plans of the hosts without it (its settings as restorations)."""
    row = _get(session, name)
    preview = Profile(**{attr: getattr(row, attr) for attr in _COLUMNS if attr != "deletion_timestamp"},
                      spec=row.spec, labels=row.labels, annotations=row.annotations,
                      generation=row.generation, deletion_timestamp=row.deletion_timestamp or now)
    return preview, plans(session, delete=[name], ram_share=ram_share)


#: Patterns all the documents of one ``POST /plans`` may hold: a GitOps repository's worth,
#: while a request of a thousand documents full of globs cannot hold the server for a minute.
MAX_PATTERNS_PER_PLAN = 8192


def _spec_of(document: Any) -> dict[str, Any]:
    spec = document.get("spec") if isinstance(document, dict) else None
    return spec if isinstance(spec, dict) else {}


def preview_set(
    session: Session, documents: Sequence[Any], delete: Sequence[str], *,
    ram_share: float = stripecache.DEFAULT_RAM_SHARE,
) -> HostPlans:
    """The per-host plans of a whole set of changes (``POST /plans``): ``documents`` created or
    replaced and ``delete`` deleted together, so profiles changed at once are planned with each
    other's new versions. Each problem is named by its place in the request."""
    patterns = sum(pattern_count(_spec_of(d).get("rules")) for d in documents)
    if patterns > MAX_PATTERNS_PER_PLAN:  # counted before any document compiles one
        raise Invalid([Cause("profiles", f"the documents hold {patterns} patterns (globs and regular "
                             f"expressions) in all; at most {MAX_PATTERNS_PER_PLAN} per request: plan "
                             "them in parts")], kind="PlanRequest")
    causes: list[Cause] = []
    put: list[StorageProfile] = []
    for index, data in enumerate(documents):
        try:
            put.append(validate(data))
        except Invalid as exc:
            causes += [Cause(f"profiles[{index}]" + (f".{c.field}" if c.field else ""), c.message)
                       for c in exc.causes]
    names = [p.name for p in put]
    causes += [Cause(f"profiles[{names.index(n)}].metadata.name", f"{n!r} is given more than once")
               for n in sorted({n for n in names if names.count(n) > 1})]
    rows = {r.name: r for r in session.scalars(
        select(Profile).where(Profile.name.in_({*names, *delete}))).all()}
    for index, name in enumerate(delete):
        if name in names:
            causes.append(Cause(f"delete[{index}]", f"{name!r} is also in profiles: replaced or deleted?"))
        elif name not in rows:
            causes.append(Cause(f"delete[{index}]", f'StorageProfile "{name}" does not exist'))
    for index, name in enumerate(names):
        row = rows.get(name)
        if row is not None and row.deletion_timestamp is not None:
            causes.append(Cause(f"profiles[{index}].metadata.name",
                                f'StorageProfile "{name}" is being deleted; it cannot be changed'))
    if causes:
        raise Invalid(causes, kind="PlanRequest")
    generations = [1 if (row := rows.get(p.name)) is None else _replacement(row, p)["generation"]
                   for p in put]
    return plans(session, [_with_generation(p, g) for p, g in zip(put, generations, strict=True)],
                 delete, ram_share=ram_share)


_COLUMNS = ("name", "uid", "resource_version", "status", "finalizers", "created_at", "updated_at",
            "deletion_timestamp")
