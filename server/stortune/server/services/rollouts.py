"""Progressive rollouts (issue 27): where the pure machine (schemas/rollout/machine.py) meets the
database.

A profile's new generation (create, replace, delete) starts a rollout in the same transaction
as the profile write: the hosts whose desired state it changes are pinned at what they hold now
(``rollout_pins``), and the machine's actions move pins wave after wave. A host's desired state
(``desired``, read by the reconciler) is then, per profile, the generation it is pinned at (as
stored in ``profile_generations``) or, without a pin, the profile's current generation. The
driver (rollout_driver.py) feeds the machine observations and executes its actions through
``execute``; people steer it through ``command``.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, get_args

from pydantic import ValidationError
from sqlalchemy import delete, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from stortune.schemas.planner import plan
from stortune.schemas.profile import LabelSelector, StorageProfile
from stortune.schemas.rollout import machine
from stortune.schemas.rollout import waves as dealing
from stortune.schemas.rollout.spec import RolloutSpec
from stortune.schemas.topology import Topology
from stortune.server.controller import request_reconcile, withdraw_reconcile
from stortune.server.db.tables import Host, Profile, ProfileGeneration, Rollout, RolloutAnalysis, RolloutPin
from stortune.server.errors import Cause, Conflict, Invalid, NotFound
from stortune.server.services import events
from stortune.server.services.versions import next_resource_version

KIND = "StorageProfile"
#: Pending commands a rollout keeps; the driver consumes them every step, so more is a flood.
MAX_PENDING_COMMANDS = 16
#: Hosts listed by ``status`` unless asked otherwise, and at most.
DEFAULT_STATUS_HOSTS = 500
MAX_STATUS_HOSTS = 10_000
MAX_BY_LENGTH = 256
_WARNINGS = frozenset({"HostFailed", "Halted", "RolledBack", "Undone"})
_PINS_PER_STATEMENT = 500  # bound on a batched statement's parameters (SQLite allows 32,766)

#: A host's desired state for one profile: "device id NUL tunable" -> (value, mode), and its errors.
DesiredMap = dict[str, object]


# -- starting ------------------------------------------------------------------------------
def rollout_spec(profile: StorageProfile | None) -> RolloutSpec:
    """The profile's spec.rollout, or the default waves."""
    spec = None if profile is None else profile.spec.rollout
    return spec if spec is not None else RolloutSpec()


def record_generation(session: Session, name: str, generation: int, spec: Mapping[str, Any] | None,
                      now: datetime) -> None:
    """Keep the profile as it is at ``generation`` (None: a tombstone, deleted at it)."""
    session.merge(ProfileGeneration(profile=name, generation=generation,
                                    spec=None if spec is None else dict(spec), created_at=now))


def check_analysis(session: Session, profile: StorageProfile) -> None:
    """Invalid naming ``spec.rollout.analysis.benchmark`` when the analysis names a stored
    BenchmarkSpec that is missing or would write to a raw device: refused at the write, not
    found out when the first canary's before-run should start."""
    rollout = profile.spec.rollout
    if rollout is None or rollout.analysis is None or not isinstance(rollout.analysis.benchmark, str):
        return
    from stortune.server import rollout_analysis  # it imports the services

    why = rollout_analysis.check_benchmark(session, rollout.analysis)
    if why is None:
        return
    field, _, message = why.partition(" ")
    raise Invalid([Cause(f"spec.rollout.analysis.{field.removeprefix('@')}", message)],
                  kind="StorageProfile", name=profile.name)


def halted_deletion(session: Session, name: str) -> int | None:
    """The tombstone generation of ``name``'s deletion when its rollout halted (rolled back or
    not), else None. Such a profile can be neither replaced nor created again, so a second DELETE
    starts the deletion over (``profiles.delete``) once the cause is mended."""
    row = session.get(Rollout, name)
    if row is None or row.phase != "Halted":
        return None
    tomb = session.get(ProfileGeneration, (name, row.generation))
    return row.generation if tomb is not None and tomb.spec is None else None


def forget(session: Session, name: str) -> None:
    """Drop every trace of a profile's rollouts: its row, its pins and its stored generations (a
    profile created again under the name starts afresh)."""
    session.execute(delete(Rollout).where(Rollout.profile == name))
    session.execute(delete(ProfileGeneration).where(ProfileGeneration.profile == name))
    # Its canaries' evidence too: keyed by generation, which starts at 1 again, a profile created
    # again would list the old verdicts and reuse an old before-run as its own baseline.
    session.execute(delete(RolloutAnalysis).where(RolloutAnalysis.profile == name))
    _unpin(session, name)


def on_new_generation(session: Session, profile_name: str, before: StorageProfile | None,
                      after: StorageProfile | None, generation: int, *,
                      now: datetime) -> machine.RolloutState | None:
    """Start (or supersede) the rollout of ``generation``: part of the caller's transaction.

    ``before``: the profile at the generation it had (None: it did not exist); ``after``: at
    ``generation`` (None: deleted, ``generation`` is its tombstone). Returns the new state, or
    None when every host takes the generation at once (all-at-once, or no host's desired state
    changes)."""
    record_generation(session, profile_name, generation,
                      None if after is None else _spec_document(after), now)
    if before is not None and before.metadata.generation:
        # Hosts stay pinned at it: kept also when it predates rollouts (a database migrated to 0017).
        known = session.get(ProfileGeneration, (profile_name, before.metadata.generation))
        if known is None:
            record_generation(session, profile_name, before.metadata.generation, _spec_document(before), now)
    row = session.get(Rollout, profile_name)
    live = row is not None and row.phase != "Complete"
    old = machine.RolloutState.model_validate(row.state) if row is not None else None
    spec = rollout_spec(after if after is not None else before)
    if spec.strategy == "all-at-once":
        drop(session, profile_name, now)
        return None
    # The new rollout starts from the last completed generation: compare with what that holds,
    # or a host a live rollout had not reached yet would skip its change.
    base_profile = before
    if live and old is not None and before is not None and old.last_completed != before.metadata.generation:
        base_profile = at_generation(session, profile_name, old.last_completed, before)
    previous = (old.last_completed if live and old is not None
                else (before.metadata.generation or 0) if before is not None else 0)
    # Every host selected now is known to the rollout: one the change left alone took it at
    # once, and is not mistaken by the driver for a host enrolling later.
    hosts, seen = survey(session, base_profile, after)
    if not hosts and not (live and old is not None and
                          any(s.generation != old.last_completed for s in old.hosts.values())):
        drop(session, profile_name, now)
        return None
    stamp = now.timestamp()
    if live and old is not None:
        waiting = [c.get("command") for c in (row.commands if row is not None else []) if isinstance(c, dict)]
        if "pause" in waiting and old.phase == "Progressing":  # asked, not yet taken: still asked
            old = old.model_copy(update={"phase": "Paused"})
        dropped = sorted({str(c) for c in waiting} - {"pause"})
        if dropped:
            events.record(session, kind=KIND, name=profile_name, profile=profile_name, type="Warning",
                          reason="CommandsDropped", message=f"{', '.join(dropped)} asked of generation"
                          f" {old.generation} dropped: generation {generation} replaces its rollout", now=now)
        state, actions = machine.supersede(old, spec, generation, hosts, stamp)
    else:
        state, actions = machine.start(profile_name, spec, generation, previous, hosts, now=stamp)
    if row is None:
        row = Rollout(profile=profile_name, generation=generation, phase=state.phase,
                      state=state.model_dump(mode="json"), known=sorted({*seen, *state.hosts}),
                      commands=[], updated_at=now)
        session.add(row)
    else:
        row.generation = generation
        row.phase = state.phase
        row.state = state.model_dump(mode="json")
        row.known = sorted({*seen, *state.hosts})
        row.commands = []
        row.updated_at = now
    held = pins_of(session, profile_name)
    _unpin(session, profile_name)
    write_pins(session, profile_name, {h: hs.generation for h, hs in state.hosts.items()})
    # The profile write asked for every selected host to be reconciled; a host pinned at the very
    # generation it held (a pin, or unpinned the profile's generation before the write) has
    # nothing new to do, and a thousand such looks queued ahead of the canary delayed it by seconds.
    held_before = 0 if before is None else before.metadata.generation or 0
    withdraw_reconcile(session, [h for h, hs in state.hosts.items()
                                 if hs.generation == held.get(h, held_before)])
    execute(session, state, actions, now)
    prune(session, profile_name, {generation, state.previous, *(s.generation for s in state.hosts.values())})
    request_wake(session)
    return state


def drop(session: Session, name: str, now: datetime) -> None:
    """No rollout: every host takes the profile's current generation at once (a live rollout
    of an older one ends, its pins go)."""
    row = session.get(Rollout, name)
    if row is not None:
        if row.phase != "Complete":
            events.record(session, kind=KIND, name=name, profile=name, type="Normal", reason="Superseded",
                          message=f"the rollout of generation {row.generation} ends: the new generation"
                                  " reaches every host at once", now=now)
        session.delete(row)
    held = pins_of(session, name)
    if held:  # a host only a pin held (its selector no longer chooses it) restores now, not at resync
        request_reconcile(session, sorted(held), f"rollout of {name} ended")
    _unpin(session, name)
    prune(session, name, ())


def _spec_document(profile: StorageProfile) -> dict[str, Any]:
    return profile.spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def at_generation(session: Session, name: str, generation: int,
                  like: StorageProfile | None = None) -> StorageProfile | None:
    """The profile as stored at ``generation`` (metadata from ``like``); None: a tombstone, 0,
    or not stored."""
    if generation <= 0:
        return None
    found = session.get(ProfileGeneration, (name, generation))
    if found is None or found.spec is None:
        return None
    return _parsed(name, generation, found.spec, like)


def concerned(session: Session, before: StorageProfile | None, after: StorageProfile | None) -> list[str]:
    """Hosts whose desired state the change from ``before`` to ``after`` changes, planned on each
    host's stored topology (one query for the hosts; a host without a topology is concerned when
    either version selects it)."""
    return survey(session, before, after)[0]


def survey(session: Session, before: StorageProfile | None, after: StorageProfile | None
           ) -> tuple[list[str], list[str]]:
    """(the hosts concerned, every host either version selects)."""
    selectors = [p.spec.hostSelector for p in (before, after) if p is not None and p.spec.hostSelector]
    if not selectors:
        return [], []
    rows = session.execute(select(Host.name, Host.labels, Host.reported_labels, Host.topology_hash,
                                  Host.topology)).all()
    parsed: dict[str, Topology | None] = {}
    plans: dict[tuple[str, bool], DesiredMap] = {}
    before_maps: dict[str, DesiredMap] = {}
    after_maps: dict[str, DesiredMap] = {}
    unknown: list[str] = []
    selected: list[str] = []
    for name, api, reported, digest, raw in rows:
        labels = {**reported, **api}
        takes = [(p, maps) for p, maps in ((before, before_maps), (after, after_maps))
                 if p is not None and _selects(p.spec.hostSelector, labels)]
        if not takes:
            continue
        selected.append(name)
        key = digest or f"host:{name}"
        if key not in parsed:
            parsed[key] = _topology(raw)
        topology = parsed[key]
        if topology is None:
            unknown.append(name)
            continue
        for profile, maps in takes:
            # Hosts of one topology share its plan: a fleet is a few hardware models, and a
            # plan per host would hold the profile write's lock for seconds over 10,000 hosts.
            planned = plans.get((key, profile is after))
            if planned is None:
                planned = plans[(key, profile is after)] = desired_map(profile, topology)
            maps[name] = planned
    return sorted({*machine.concerned(before_maps, after_maps), *unknown}), sorted(selected)


def _selects(selector: LabelSelector | None, labels: Mapping[str, str]) -> bool:
    return selector is not None and selector.matches(dict(labels))


def _topology(raw: Mapping[str, Any] | None) -> Topology | None:
    from stortune.server.services import hosts  # hosts imports this module (host_removed)

    return hosts.stored_topology(raw)


def desired_map(profile: StorageProfile, topology: Topology) -> DesiredMap:
    """What ``profile`` alone makes the host hold: each setting's value and mode, and the settings
    it cannot make (a rejected value changes what the host reports, so it counts as a change)."""
    result = plan([profile], topology)
    out: DesiredMap = {f"{d.device_id}\0{d.tunable}": (d.desired, d.source.mode) for d in result.desired}
    for r in result.rejections:
        out[f"{r.device_id}\0{r.tunable}\0rejected"] = (r.value, r.fatal)
    return out


# -- pins ------------------------------------------------------------------------------------
def write_pins(session: Session, profile: str, pins: Mapping[str, int]) -> None:
    """Upsert ``pins`` (host -> generation) in batches; bumps the resourceVersion so the
    reconciler's cached host views are read again."""
    if not pins:
        return
    next_resource_version(session)
    values = [{"profile": profile, "host": h, "generation": g} for h, g in sorted(pins.items())]
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    for start in range(0, len(values), _PINS_PER_STATEMENT):
        stmt = insert(RolloutPin).values(values[start:start + _PINS_PER_STATEMENT])
        stmt = stmt.on_conflict_do_update(index_elements=["profile", "host"],
                                          set_={"generation": stmt.excluded.generation})
        session.execute(stmt.execution_options(synchronize_session=False))


def _unpin(session: Session, profile: str) -> None:
    """Drop the profile's pins; the resourceVersion moves when there were any (cached views)."""
    if session.scalar(select(RolloutPin.host).where(RolloutPin.profile == profile).limit(1)) is not None:
        next_resource_version(session)
        session.execute(delete(RolloutPin).where(RolloutPin.profile == profile))


def pins_of(session: Session, profile: str) -> dict[str, int]:
    """host -> pinned generation of ``profile``."""
    return dict(session.execute(select(RolloutPin.host, RolloutPin.generation)
                                .where(RolloutPin.profile == profile)).all())


def release(session: Session, profile: str) -> None:
    """A rollout completed: its pins go (every host takes the current generation) and the stored
    generations no longer referenced with them."""
    _unpin(session, profile)
    row = session.get(Rollout, profile)
    keep = set()
    if row is not None:
        keep |= {row.generation, int(row.state.get("previous", 0))}
    prune(session, profile, keep)


def prune(session: Session, profile: str, keep: Collection[int]) -> None:
    """Drop the profile's stored generations other than ``keep`` and its current one."""
    current = session.scalar(select(Profile.generation).where(Profile.name == profile))
    kept = {*keep, *(() if current is None else (current,))}
    session.execute(delete(ProfileGeneration).where(ProfileGeneration.profile == profile,
                                                    ProfileGeneration.generation.not_in(kept)))
    session.execute(delete(RolloutAnalysis).where(RolloutAnalysis.profile == profile,
                                                  RolloutAnalysis.generation.not_in(kept)))


def host_removed(session: Session, host: str, now: datetime) -> None:
    """A host declared gone leaves every rollout, as the driver's departure does, and its pins
    go: a machine registered again under the name is then a host enrolling, held at the last
    completed generation, not at whatever its namesake was pinned at (a canary's new generation,
    or a bad one a halted rollout will never release)."""
    holds: dict[str, int] = {}
    for row in session.scalars(select(Rollout).where(Rollout.phase != "Complete")):
        raw_hosts = row.state.get("hosts") if isinstance(row.state, dict) else None
        if host not in (row.known or ()) and not (isinstance(raw_hosts, dict) and host in raw_hosts):
            continue
        state = machine.RolloutState.model_validate(row.state)
        if host in state.hosts:
            rest = {h: hs for h, hs in state.hosts.items() if h != host}
            row.state = state.model_copy(update={"hosts": rest}).model_dump(mode="json")
            events.record(session, kind=KIND, name=row.profile, profile=row.profile, type="Normal",
                          reason="Departed", message=f"{host} was declared gone; it no longer counts in"
                                                     " the rollout", now=now)
        row.known = [h for h in row.known if h != host]
        row.updated_at = now
        holds[row.profile] = state.last_completed
    if session.scalar(select(RolloutPin.profile).where(RolloutPin.host == host).limit(1)) is not None:
        next_resource_version(session)
        session.execute(delete(RolloutPin).where(RolloutPin.host == host))
    for profile, generation in holds.items():
        write_pins(session, profile, {host: generation})
    if holds:
        request_wake(session)


def host_selected(session: Session, host: str, labels: Mapping[str, str], now: datetime) -> None:
    """A host new to a live rollout's profile (registered, or relabelled into its selector) is
    pinned at the last completed generation in the same transaction: unpinned it would take the
    generation the canaries are still judging (or, after a rollback, the bad one for good) before
    the driver's next pass enrols it. A host the rollout knows keeps what it holds."""
    pinned = set(session.scalars(select(RolloutPin.profile).where(RolloutPin.host == host)))
    holds: dict[str, int] = {}
    for row in session.scalars(select(Rollout).where(Rollout.phase != "Complete")):
        if row.profile in pinned or host in (row.known or ()):
            continue
        profile = session.get(Profile, row.profile)
        state = machine.RolloutState.model_validate(row.state)
        base = at_generation(session, row.profile, state.last_completed, None)
        selecting = [p for p in (base, None if profile is None else _current(profile)) if p is not None]
        if any(_selects(p.spec.hostSelector, labels) for p in selecting):
            holds[row.profile] = state.last_completed
    for profile_name, generation in holds.items():
        write_pins(session, profile_name, {host: generation})
        events.record(session, kind=KIND, name=profile_name, profile=profile_name, type="Normal",
                      reason="Held", message=f"{host} joined during the rollout: it holds generation"
                                             f" {generation}, the last completed, until it is enrolled",
                      now=now)
    if holds:
        request_wake(session)


def _current(row: Profile) -> StorageProfile | None:
    from stortune.server.services import profiles  # profiles imports this module

    try:
        return profiles.stored_profile(row)
    except profiles.StoredProfileInvalid:
        return None


# -- executing -------------------------------------------------------------------------------
def execute(session: Session, state: machine.RolloutState, actions: Sequence[machine.Action],
            now: datetime) -> list[str]:
    """Carry out a step's actions in the caller's transaction; the hosts to reconcile (asked for
    after commit)."""
    profile = state.profile
    pins: dict[str, int] = {}
    for action in actions:
        if isinstance(action, machine.Advance | machine.Revert | machine.Hold):
            pins[action.host] = action.generation
        elif isinstance(action, machine.StartAnalysis):
            _start_analysis(session, state, action, now)
        elif isinstance(action, machine.Event):
            events.record(session, kind=KIND, name=profile, profile=profile,
                          type="Warning" if action.reason in _WARNINGS else "Normal",
                          reason=action.reason, message=action.message, now=now)
    write_pins(session, profile, pins)
    hosts = sorted(pins)
    request_reconcile(session, hosts, f"rollout of {profile}")
    return hosts


def _start_analysis(session: Session, state: machine.RolloutState, action: machine.StartAnalysis,
                    now: datetime) -> None:
    from stortune.server import rollout_analysis  # it imports the services

    rollout_analysis.start(session, state, action.host, action.stage, now)


# -- the host's desired state ----------------------------------------------------------------
class _Parsed:
    """Parsed stored generations by (profile, generation, digest of the spec): a generation's
    content is what identifies it. ``created_at`` did not: a profile created again in the same
    instant (a frozen clock, a coarse one) under its old name took the other's parsed spec."""

    def __init__(self, size: int = 4096) -> None:
        self._size = size
        self._found: OrderedDict[tuple[str, int, str], StorageProfile] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, int, str]) -> StorageProfile | None:
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._found.move_to_end(key)
            return found

    def put(self, key: tuple[str, int, str], profile: StorageProfile) -> None:
        with self._lock:
            self._found[key] = profile
            while len(self._found) > self._size:
                self._found.popitem(last=False)


_PARSED = _Parsed()


def _parsed(name: str, generation: int, spec: Mapping[str, Any],
            like: StorageProfile | Profile | None) -> StorageProfile:
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str)
    key = (name, generation, hashlib.sha256(text.encode()).hexdigest())
    found = _PARSED.get(key)
    if found is None:
        labels: dict[str, str] = {}
        annotations: dict[str, str] = {}
        if isinstance(like, Profile):
            labels, annotations = like.labels, like.annotations
        elif like is not None:
            labels, annotations = like.metadata.labels, like.metadata.annotations
        found = StorageProfile.model_validate({
            "metadata": {"name": name, "labels": labels, "annotations": annotations,
                         "generation": generation},
            "spec": dict(spec)})
        _PARSED.put(key, found)
    return found


def desired(session: Session, host_name: str, selecting_rows: Sequence[Profile], *,
            labels: Mapping[str, str], invalid: dict[str, str] | None = None) -> list[StorageProfile]:
    """The profiles ``host_name`` must run, each at the generation it must hold: a pinned
    profile at its pin (nothing when the pin is 0, a tombstone, or a generation whose selector
    leaves the host out; a profile being deleted is kept while pinned at a live generation), an
    unpinned selecting profile at its current generation. ``invalid`` collects the profiles this
    version refuses (name -> why), as the reconciler reports them. ``spec.rollout`` is left out:
    it is the control plane's, and an agent has no use for it."""
    from stortune.server.services import profiles  # profiles imports this module

    pins = dict(session.execute(select(RolloutPin.profile, RolloutPin.generation)
                                .where(RolloutPin.host == host_name)).all())
    selecting = {r.name for r in selecting_rows}
    rows = {r.name: r for r in selecting_rows}
    missing = sorted(set(pins) - set(rows))
    if missing:
        rows.update({r.name: r for r in session.scalars(select(Profile).where(Profile.name.in_(missing)))})
    wanted = [(name, g) for name, g in pins.items() if name in rows and 0 < g != rows[name].generation]
    stored: dict[tuple[str, int], ProfileGeneration] = {}
    if wanted:
        stored = {(r.profile, r.generation): r for r in session.scalars(select(ProfileGeneration).where(
            tuple_(ProfileGeneration.profile, ProfileGeneration.generation).in_(wanted)))}
    out: list[StorageProfile] = []
    for name in sorted(rows):
        row = rows[name]
        pin = pins.get(name)
        if pin is None and (name not in selecting or row.deletion_timestamp is not None):
            continue
        if pin is not None and pin <= 0:
            continue
        try:
            if pin is None or pin == row.generation:
                # Its current generation, also while it is being deleted (the tombstone is newer).
                found: StorageProfile | None = profiles.stored_profile(row)
            else:
                kept = stored.get((name, pin))
                found = (None if kept is None or kept.spec is None
                         else _parsed(name, pin, kept.spec, row))
        except profiles.StoredProfileInvalid as exc:
            if invalid is not None:
                invalid[name] = "; ".join(f"{c.field}: {c.message}" for c in exc.causes)
            continue
        except ValidationError as exc:  # a stored generation this version refuses
            if invalid is not None:
                invalid[name] = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                          for e in exc.errors(include_url=False))
            continue
        if found is None or (pin is not None and not _selects(found.spec.hostSelector, labels)):
            continue
        out.append(_without_rollout(found))
    return out


def _without_rollout(profile: StorageProfile) -> StorageProfile:
    if profile.spec.rollout is None:
        return profile
    return profile.model_copy(update={"spec": profile.spec.model_copy(update={"rollout": None})})


def held_live(session: Session, profile: str) -> list[str]:
    """Hosts pinned at a generation of ``profile`` that holds something (not 0, not a
    tombstone): a profile being deleted waits for them as for hosts that report it applied. A
    host deleted (declared gone) holds nothing, whatever its pin says."""
    pins = dict(session.execute(select(RolloutPin.host, RolloutPin.generation)
                                .join(Host, Host.name == RolloutPin.host)
                                .where(RolloutPin.profile == profile)).all())
    if not pins:
        return []
    live = {g for g, spec in session.execute(
        select(ProfileGeneration.generation, ProfileGeneration.spec).where(
            ProfileGeneration.profile == profile, ProfileGeneration.generation.in_(set(pins.values()))))
        if spec is not None}
    return sorted(h for h, g in pins.items() if g in live)


# -- reading and steering --------------------------------------------------------------------
def _iso(stamp: float | None) -> str | None:
    return None if stamp is None else datetime.fromtimestamp(stamp, UTC).isoformat()


def status(session: Session, profile: str, limit: int = DEFAULT_STATUS_HOSTS) -> dict[str, Any] | None:
    """The rollout of ``profile`` as the REST API shows it; None when it has none."""
    row = session.get(Rollout, profile)
    if row is None:
        return None
    limit = max(0, min(limit, MAX_STATUS_HOSTS))
    state = machine.RolloutState.model_validate(row.state)
    per_wave: list[dict[str, Any]] = [
        {"number": i + 1, "hosts": 0, "stages": dict.fromkeys(get_args(machine.Stage), 0)}
        for i in range(state.waves)]
    for hs in state.hosts.values():
        if 0 <= hs.wave < len(per_wave):
            per_wave[hs.wave]["hosts"] += 1
            per_wave[hs.wave]["stages"][hs.stage] += 1
    open_members = sum(1 for hs in state.hosts.values() if hs.wave == state.wave)
    listed = sorted(state.hosts.items(), key=lambda kv: (kv[1].wave, kv[0]))[:limit]
    return {
        "profile": profile,
        "generation": state.generation,
        "previous": state.previous,
        "phase": state.phase,
        "reason": state.reason,
        "rollback": state.rollback,
        "rolledBack": state.rolledBack,
        "wave": state.wave + 1,
        "waves": per_wave,
        "counts": machine.counts(state),
        "failures": state.failures,
        "excused": state.excused,
        "maxFailures": dealing.max_failures(state.spec, len(state.hosts)),
        "maxUnavailable": dealing.max_unavailable(state.spec, open_members),
        "soakSince": _iso(state.soakSince),
        "started": _iso(state.started),
        "updated": row.updated_at.isoformat(),
        "hosts": [{"name": h, "wave": hs.wave + 1, "generation": hs.generation, "stage": hs.stage,
                   "failure": hs.failure, "verdict": hs.verdict} for h, hs in listed],
        "hostsListed": len(listed),
        "hostsTotal": len(state.hosts),
        "analysis": _analysis(session, state),
        "version": row.version,
        "pendingCommands": list(row.commands),
    }


def version(session: Session, profile: str) -> tuple[int, int, str] | None:
    """What a watch compares between looks (None: no rollout): the row's version with its
    generation and the time it was written, as ``status`` gives them. The version alone counts
    from 1 again for a row started anew (after an all-at-once change, or a profile created
    again), and could equal the one a watcher holds."""
    row = session.execute(select(Rollout.version, Rollout.generation, Rollout.updated_at)
                          .where(Rollout.profile == profile)).first()
    return None if row is None else (row[0], row[1], row[2].isoformat())


def seen_version(status: Mapping[str, Any]) -> tuple[int, int, str]:
    """``version`` of the rollout a status shows."""
    return status["version"], status["generation"], status["updated"]


def _analysis(session: Session, state: machine.RolloutState) -> list[Any]:
    try:
        from stortune.server import rollout_analysis  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        return []
    report = getattr(rollout_analysis, "status", None)
    return list(report(session, state)) if report is not None else []


def command(session: Session, profile: str, command: str, by: str, now: datetime) -> dict[str, Any]:
    """Queue ``command`` (pause, resume, undo) for the driver's next step; commits. NotFound
    without a rollout."""
    if command not in get_args(machine.Command):
        raise Invalid([Cause("command", f"{command[:40]!r} is not a rollout command: pause, resume or undo")],
                      kind="Rollout", name=profile)
    # The write lock first (db/engine.py): on SQLite a read then a write fails at once ("database
    # is locked") when another writer committed in between, as the reconciler's do all the time.
    next_resource_version(session)
    row = session.get(Rollout, profile)
    if row is None:
        raise NotFound("Rollout", profile)
    refused = _pointless(row, command)
    if refused is not None:
        raise Conflict(f'the rollout of "{profile}" is {refused}', kind="Rollout", name=profile)
    if len(row.commands) >= MAX_PENDING_COMMANDS:
        raise Conflict(f'the rollout of "{profile}" already has {len(row.commands)} pending commands; '
                       "wait for the driver to take them", kind="Rollout", name=profile)
    by = by[:MAX_BY_LENGTH]
    row.commands = [*row.commands, {"command": command, "by": by, "at": now.isoformat()}]
    row.updated_at = now
    events.record(session, kind=KIND, name=profile, profile=profile, type="Normal",
                  reason=f"{command.capitalize()}Requested", message=f"{command} requested by {by}", now=now)
    request_wake(session)
    session.commit()
    found = status(session, profile)
    assert found is not None
    return found


def _pointless(row: Rollout, command: str) -> str | None:
    """Why ``command`` can do nothing to the rollout whatever is pending before it, or None.
    A rollback is never undone by a later step (only a new generation ends it), and nothing
    steps a Complete rollout but an undo: such a command would only be dropped, or wait in
    the row for ever."""
    state = row.state if isinstance(row.state, dict) else {}
    if state.get("rollback") is True:
        done = "rolled back" if state.get("rolledBack") is True else "rolling back"
        return (f"{row.phase} and {done} to generation {state.get('previous')}: {command} cannot"
                " change that; write a new generation of the profile instead")
    if row.phase == "Complete" and command != "undo":
        return f"Complete: there is nothing to {command}; undo puts the previous generation back"
    return None


# -- waking the driver -----------------------------------------------------------------------
_WAKE = "stortune.rollouts.wake"


def request_wake(session: Session) -> None:
    """Wake the rollout driver once this transaction commits (see ``bind``)."""
    session.info[_WAKE] = True


def bind(sessions: sessionmaker[Session], wake: Callable[[], None]) -> None:
    """Call ``wake`` after each commit of a session of ``sessions`` that asked for it."""
    from sqlalchemy import event

    def after_commit(session: Session) -> None:
        if session.info.pop(_WAKE, False):
            wake()

    def after_end(session: Session, transaction: Any) -> None:
        if transaction.parent is None:
            session.info.pop(_WAKE, None)

    event.listen(sessions, "after_commit", after_commit)
    event.listen(sessions, "after_transaction_end", after_end)
