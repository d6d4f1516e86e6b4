"""The RolloutDriver: steps each live rollout's machine (schemas/rollout/machine.py) in the app's loop.

The machine is pure; this loop feeds it. Each pass (every ``interval`` seconds, and at once when
woken: a host's status was written, a rollout row changed) refreshes the in-memory fleet index,
and for every rollout that can still move and whose profile name's shard this server owns:
builds the machine's ``Observed`` from the hosts' records (``observe``, pure: no query per
host), steps the machine, and in ONE transaction, optimistic on the row's ``version``, stores
the new state, clears the commands it consumed and executes the actions
(``services.rollouts.execute``: pins, events, reconcile requests). A crash between steps
loses nothing: the stored state says what was asked, and the next pass (here or on the
server that takes the shard over) resumes from it. Two servers stepping one rollout cannot
both win: the shard's fence aborts the one that lost the lease, and the version the other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, get_args

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from stortune.schemas.profile import LabelSelector
from stortune.schemas.rollout import machine
from stortune.schemas.rollout import waves as dealing
from stortune.server import rollout_analysis
from stortune.server.db.tables import Profile, ProfileGeneration, Rollout, RolloutAnalysis
from stortune.server.services import finalizers, rollouts
from stortune.server.services.fleet_state import FleetState, HostRecord
from stortune.server.services.versions import next_resource_version
from stortune.server.shards import AllShards, LeaseLost, Ownership, fenced

log = logging.getLogger(__name__)

#: Applied=False reasons that mean the host's apply of what it must hold failed (reconciler/report.py);
#: others (an experiment holding the host, say) are no verdict on the generation.
APPLY_FAILED = frozenset({"ApplyFailed", "Rejected"})
#: Stages whose hosts' observations machine.step never reads: a pending host is started by the
#: count of the others, a failed one counts as done and a reverted one as not, whatever it reports.
IDLE: frozenset[str] = frozenset({"pending", "failed", "reverted"})
_COMMANDS: frozenset[str] = frozenset(get_args(machine.Command))
#: Seconds at least between two passes (fewer when ``interval`` is shorter): the hosts a wave
#: changes report within moments of each other, and one pass sees them all.
MIN_GAP = 0.05


def _utcnow() -> datetime:
    return datetime.now(UTC)


# -- observing (pure) ----------------------------------------------------------------------
@dataclass(frozen=True)
class Analysis:
    """What the analysis knows of a host: its before-run is ready, its after-run's verdict."""

    baseline: bool = False
    verdict: machine.Verdict | None = None


#: host -> (its record, its pin, its analysis, the observation made of them).
Memo = dict[str, tuple[HostRecord, int, Analysis | None, machine.HostObservation]]


def _status(record: HostRecord, condition: str) -> tuple[str, str]:
    return record.conditions.get(condition, ("Unknown", ""))


def host_observation(state: machine.RolloutState, host: str, record: HostRecord,
                     holds_nothing: Callable[[str, int], bool],
                     analysis: Analysis | None = None) -> machine.HostObservation:
    """One host, from its record. ``holds_nothing(host, generation)``: the generation holds nothing
    of the profile for the host (0, a tombstone, a spec whose selector leaves it out); such a
    generation is reached once the profile is gone from the host's applied set."""
    profile = state.profile
    pinned = state.hosts[host].generation if host in state.hosts else state.previous
    generation = record.applied.get(profile)
    if generation is None and holds_nothing(host, pinned):
        generation = pinned
    failure: machine.FailureKind | None = None
    if _status(record, "Reachable")[0] == "False":
        failure = "unreachable"
    elif (profile, pinned) in record.rejected_at:
        failure = "blocked"
    else:
        applied, reason = _status(record, "Applied")
        # Host-wide, so only a failure while the host does not hold what it must counts against
        # this rollout: an updated host failing a later apply of another profile is not this one's.
        # A "Rejected" explained by the settings table is judged by its rows above: rows of an
        # earlier generation (the very rejection this one may fix) or of another profile, still
        # standing until the host's next apply, are not this generation's failure.
        explained = reason == "Rejected" and bool(record.rejected_at)
        if applied == "False" and reason in APPLY_FAILED and generation != pinned and not explained:
            failure = "apply-failed"
    seen = analysis or Analysis()
    # Built from checked values (typed literals and ints) for every host on every pass: validating
    # them again was the driver's largest cost at 1,000 hosts.
    return machine.HostObservation.model_construct(
        generation=generation, healthy=_status(record, "Ready")[0] == "True", failure=failure,
        baseline=seen.baseline, verdict=seen.verdict)


def observe(state: machine.RolloutState, records: Mapping[str, HostRecord], *,
            holds_nothing: Callable[[str, int], bool], selects: Callable[[HostRecord], bool] | None,
            known: Collection[str], commands: Iterable[str] = (),
            analysis: Mapping[str, Analysis] | None = None, moving_only: bool = False,
            memo: Memo | None = None) -> machine.Observed:
    """The machine's input for one step, from the fleet index (``records``: every host by name).

    A host of the rollout without a record has departed (its row is gone). ``selects``: the
    current spec's selector (None: the profile is being deleted, nobody enrols); a selected
    host the rollout has never seen enrols. Unknown commands are dropped (the row is data).
    ``moving_only``: leave out the hosts whose observation the machine does not read (``IDLE``
    stages): late in a wide wave most hosts are pending, and a step need not look at them. Not
    with a command: an undo turns such hosts into reverting ones before the machine observes.
    ``memo``: this rollout's observations from earlier passes, reused for a host whose record
    (the fleet index replaces a host's record when its row changes), pin and analysis are the
    same; kept only when the host reports the profile (``holds_nothing`` was not asked)."""
    seen = analysis or {}
    wanted = tuple(c for c in commands if c in _COMMANDS)
    moving_only = moving_only and not wanted
    hosts: dict[str, machine.HostObservation] = {}
    departed: list[str] = []
    for host, hs in state.hosts.items():
        record = records.get(host)
        if record is None:
            departed.append(host)
        elif moving_only and hs.stage in IDLE:
            continue
        else:
            extra = seen.get(host)
            hit = memo.get(host) if memo is not None else None
            if hit is not None and hit[0] is record and hit[1] == hs.generation and hit[2] == extra:
                hosts[host] = hit[3]
                continue
            hosts[host] = host_observation(state, host, record, holds_nothing, extra)
            if memo is not None and state.profile in record.applied:
                memo[host] = (record, hs.generation, extra, hosts[host])
    enrolled: list[str] = []
    if selects is not None:
        enrolled = sorted(name for name, record in records.items()
                          if name not in state.hosts and name not in known and selects(record))
    return machine.Observed(hosts=hosts, commands=wanted,  # validated again by the model
                            enrolled=tuple(enrolled), departed=tuple(departed))


def in_rollout_order(state: machine.RolloutState) -> machine.RolloutState:
    """The state with its hosts in rollout order again: the machine starts a wave's hosts in the
    order of its hosts mapping, and PostgreSQL's JSONB does not keep the order of an object's keys."""
    profile = state.profile
    hosts = sorted(state.hosts.items(), key=lambda kv: (kv[1].wave, dealing.order_key(profile, kv[0]), kv[0]))
    return state.model_copy(update={"hosts": dict(hosts)})


def pending_commands(stored: Any) -> list[str]:
    """The command names of a row's ``commands`` list, in order; junk entries skipped."""
    if not isinstance(stored, list):
        return []
    return [c["command"] for c in stored if isinstance(c, dict) and isinstance(c.get("command"), str)]


def can_move(phase: str, state: Mapping[str, Any], commands: Sequence[Any]) -> bool:
    """A rollout the driver still steps: not Complete or rolled back, unless a command waits (an
    undo after Complete is taken: the issue promises it at any time)."""
    if phase == "Complete":
        return bool(commands)
    return bool(commands) or not (phase == "Halted" and state.get("rolledBack") is True)


# -- the loop ------------------------------------------------------------------------------
class RolloutDriver:
    """Start it with the app (``start``/``stop``); ``wake`` is safe from any thread.

    ``steps``: profile -> steps this server wrote (what the replica tests count)."""

    def __init__(self, sessions: sessionmaker[Session], fleet: FleetState, *,
                 clock: Callable[[], datetime] = _utcnow, interval: float = 1.0,
                 ownership: Ownership | None = None, min_gap: float = MIN_GAP) -> None:
        self.interval = interval
        self.min_gap = min_gap
        self.fleet = fleet
        self.ownership = ownership or AllShards()
        self.ownership.watch(lambda _gained, _lost: self.wake())  # a shard taken over: step its rollouts
        self.steps: dict[str, int] = {}
        self._failing: dict[str, str] = {}  # profile -> the error its last step failed with
        self._parsed = _ParsedRows()
        self._memos: dict[str, Memo] = {}  # profile -> its hosts' observations (observe's memo)
        self._sessions = sessions
        self._clock = clock
        self._wakeup: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        # Commits that start a rollout or queue a command for one (services/rollouts.request_wake).
        rollouts.bind(sessions, self.wake)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._main = asyncio.create_task(self._run(), name="rollout-driver")
        log.info("rollout driver started: rollouts stepped every %gs and when hosts report", self.interval)

    async def stop(self) -> None:
        task, self._main, self._loop = self._main, None, None
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def wake(self) -> None:
        loop, wakeup = self._loop, self._wakeup
        if loop is None or wakeup is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server is stopping
            loop.call_soon_threadsafe(wakeup.set)

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            self._wakeup.clear()  # before the pass: a wake during it makes another
            began = time.monotonic()
            try:
                await asyncio.to_thread(self.pass_once)
            except Exception:  # the database, or a bug: the next pass tries again
                log.exception("rollout pass failed; again in %gs", self.interval)
            # Every host status write wakes the driver: during a wide wave they come faster than
            # passes, which then ran back to back and took the CPU the reconciler applies with.
            # A gap as long as the pass (at least min_gap) lets a burst of writes make one pass.
            gap = min(self.interval, max(self.min_gap, time.monotonic() - began))
            await asyncio.sleep(gap)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval - gap):
                    await self._wakeup.wait()

    # -- one pass (in a thread) --------------------------------------------------------------
    def pass_once(self) -> list[str]:
        """Step every rollout this server drives; returns the profiles whose step was written."""
        with self._sessions() as session:
            # Complete rows too: one row per profile, and an undo may wait in one (commands are
            # a short list; the state is not read).
            rows = session.execute(select(Rollout.profile, Rollout.phase, Rollout.commands)).all()
            # Only a halt without a command needs the state (rolled back yet?): reading every
            # rollout's state (each host's stage) on every pass cost more than the step.
            quiet = [name for name, phase, commands in rows if phase == "Halted" and not commands]
            states: dict[str, Any] = dict(session.execute(select(Rollout.profile, Rollout.state)
                                          .where(Rollout.profile.in_(quiet))).all()) if quiet else {}
        live = []
        for name, phase, commands in rows:
            state = states.get(name)
            if can_move(phase, state if isinstance(state, dict) else {}, commands or []):
                live.append(name)
        self._failing = {k: v for k, v in self._failing.items() if k in live}
        self._parsed.keep(live)
        self._memos = {k: v for k, v in self._memos.items() if k in live}
        if not live:
            return []
        self.fleet.refresh()
        written = []
        for name in sorted(live):
            fence = self.ownership.fence(name)
            if fence is None:
                continue  # another server owns the profile name's shard
            try:
                with fenced(fence), self.ownership.working(fence):
                    if self._step(name):
                        written.append(name)
                        self.steps[name] = self.steps.get(name, 0) + 1
            except StaleDataError:
                log.debug("rollout of %s: written meanwhile; stepped again next pass", name)
                self.wake()
            except LeaseLost as exc:
                log.info("rollout of %s: %s; its new owner steps it", name, exc)
            except Exception as exc:
                # Once per profile and error: a row no step can read would log every second otherwise.
                if self._failing.get(name) != repr(exc):
                    self._failing[name] = repr(exc)
                    log.exception("rollout of %s: the step failed; tried again every pass", name)
            else:
                self._failing.pop(name, None)
        return written

    def _step(self, name: str) -> bool:
        """Decide once, on a read; only when the step changes something, write it in a transaction
        that takes the write lock first (the resourceVersion bump: on SQLite a transaction that
        read and then wrote fails at once if another writer committed in between, db/engine.py)
        and stores it only if the row is still at the version decided on: a command, a profile
        write or another server's step in between makes the next pass decide again."""
        records, _ = self.fleet.snapshot()
        now = self._clock()
        with self._sessions() as session:
            step = _decide(session, name, records, now, parsed=self._parsed,
                           memo=self._memos.setdefault(name, {}))
            # Verdicts the analysis judged on this read (rollout_analysis.observe writes them to
            # the session) are written with the step, in the transaction that takes the lock first:
            # committing this read's session fails on SQLite once another writer committed since.
            verdicts = [(r.profile, r.generation, r.host, r.verdict, r.detail)
                        for r in session.dirty if isinstance(r, RolloutAnalysis)]
            session.rollback()
        if step is None:
            if verdicts:  # facts about finished runs, kept whatever becomes of the step
                with self._sessions() as session:
                    next_resource_version(session)
                    _store_verdicts(session, verdicts)
                    session.commit()
            return False
        new, actions = step.state, step.actions
        # Everything that needs no lock is made before taking it: while this transaction holds
        # SQLite's one write lock, every host status write of the reconciler waits.
        stored = new.model_dump(mode="json")
        known = sorted({*step.known, *new.hosts})
        # A thousand names need not be written again when no host was added.
        values: dict[str, Any] = {"known": known} if len(known) != len(step.known) else {}
        with self._sessions() as session:
            next_resource_version(session)
            # The row is not read back: written only if still at the version decided on.
            written: CursorResult[Any] = session.execute(  # type: ignore[assignment]
                update(Rollout).where(Rollout.profile == name, Rollout.version == step.version[0])
                .values(state=stored, phase=new.phase, generation=new.generation, commands=[],
                        updated_at=now, version=step.version[0] + 1, **values)  # commands: all were fed to it
                .execution_options(synchronize_session=False))
            if written.rowcount != 1:
                session.rollback()
                self.wake()  # written meanwhile: decided again at once, on what it holds now
                return False
            _store_verdicts(session, verdicts)
            # As the database gives it back (the next pass's read compares it).
            stamp = session.scalar(select(Rollout.updated_at).where(Rollout.profile == name))
            rollouts.execute(session, new, actions, now)
            if new.phase == "Complete":
                rollouts.release(session, name)  # every host takes the current generation
                profile = session.get(Profile, name)
                if profile is not None and profile.deletion_timestamp is not None:
                    finalizers.release_finished(session, now)  # a deletion rolled out: the row may go
            session.commit()
        # What this step stored is what the next one starts from: no need to read it back.
        if stamp is not None:
            written_at = (step.version[0] + 1, new.generation, stamp)
            self._parsed.put(name, written_at, step.ordered, frozenset(known))
        return True


def _store_verdicts(session: Session, verdicts: Sequence[tuple[str, int, str, str | None, Any]]) -> None:
    for profile, generation, host, verdict, detail in verdicts:
        session.execute(update(RolloutAnalysis).where(
            RolloutAnalysis.profile == profile, RolloutAnalysis.generation == generation,
            RolloutAnalysis.host == host).values(verdict=verdict, detail=detail)
            .execution_options(synchronize_session=False))


#: What tells one stored rollout state from another: (version, generation, updated_at).
Version = tuple[int, int, datetime]


class _ParsedRows:
    """Each rollout's state as parsed and put in rollout order, with its ``known`` set, by the row's
    version: a pass that finds the row unchanged (most passes: hosts report far more often than a
    step writes) neither parses the JSON of every host nor sorts them again. The version is the
    row's (version, generation, updated_at): a row deleted and started again counts its version
    from 1 anew, and this server may not have looked at it in between."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[Version, machine.RolloutState, frozenset[str]]] = {}

    def get(self, name: str, version: Version) -> tuple[machine.RolloutState, frozenset[str]] | None:
        found = self._rows.get(name)
        return (found[1], found[2]) if found is not None and found[0] == version else None

    def put(self, name: str, version: Version, state: machine.RolloutState, known: frozenset[str]) -> None:
        self._rows[name] = (version, state, known)

    def keep(self, names: Collection[str]) -> None:
        for name in set(self._rows) - set(names):
            del self._rows[name]


@dataclass(frozen=True)
class _Step:
    """A decided step: the new state and its actions, for the row at ``version``."""

    version: Version
    state: machine.RolloutState
    actions: list[machine.Action]
    known: frozenset[str]
    #: ``state`` in rollout order (a host enrolled this step is added last by the machine).
    ordered: machine.RolloutState


def _decide(session: Session, name: str, records: Mapping[str, HostRecord], now: datetime,
            *, parsed: _ParsedRows | None = None, memo: Memo | None = None) -> _Step | None:
    """The machine's step on the stored row and the fleet index; None when it changes nothing."""
    head = session.execute(select(Rollout.version, Rollout.generation, Rollout.updated_at, Rollout.commands)
                           .where(Rollout.profile == name)).first()
    if head is None:
        return None
    version: Version = (head[0], head[1], head[2])
    stored = head[3]
    cached = parsed.get(name, version) if parsed is not None else None
    if cached is None:
        raw = session.execute(select(Rollout.state, Rollout.known).where(
            Rollout.profile == name, Rollout.version == version[0])).first()
        if raw is None:  # written between the two reads: the next pass
            return None
        cached = in_rollout_order(machine.RolloutState.model_validate(raw[0])), frozenset(raw[1] or ())
        if parsed is not None:
            parsed.put(name, version, *cached)
    state, known = cached
    stored_commands = list(stored or [])
    profile = session.get(Profile, name)
    observed = observe(state, records, holds_nothing=_generations(session, state, records),
                       selects=_selector_of(profile), known=known, commands=pending_commands(stored_commands),
                       analysis=_analysis(session, state, records), moving_only=True,
                       memo=_bounded(memo, len(state.hosts)))
    new, actions = machine.step(state, observed, now.timestamp())
    if new == state and not actions and not stored_commands and set(new.hosts) <= known:
        return None
    ordered = new if new.hosts.keys() <= state.hosts.keys() else in_rollout_order(new)
    return _Step(version, new, actions, known, ordered)


def _bounded(memo: Memo | None, hosts: int) -> Memo | None:
    """The memo, emptied once it holds twice the rollout's hosts (departed hosts' entries)."""
    if memo is not None and len(memo) > 2 * hosts + 16:
        memo.clear()
    return memo


def _selector_of(profile: Profile | None) -> Callable[[HostRecord], bool] | None:
    if profile is None or profile.deletion_timestamp is not None:
        return None
    raw = profile.spec.get("hostSelector") if isinstance(profile.spec, dict) else None
    if raw is None:
        return None
    selector = LabelSelector.model_validate(raw)
    return lambda record: selector.matches(record.labels)


def _generations(session: Session, state: machine.RolloutState,
                 records: Mapping[str, HostRecord]) -> Callable[[str, int], bool]:
    """``holds_nothing`` over the stored generations the state's hosts are pinned at (one query)."""
    wanted = {hs.generation for hs in state.hosts.values()} | {state.previous, state.generation}
    wanted.discard(0)
    selectors: dict[int, LabelSelector | None] = {}
    if wanted:
        for generation, spec in session.execute(
                select(ProfileGeneration.generation, ProfileGeneration.spec)
                .where(ProfileGeneration.profile == state.profile, ProfileGeneration.generation.in_(wanted))):
            raw = spec.get("hostSelector") if isinstance(spec, dict) else None
            selectors[generation] = LabelSelector.model_validate(raw) if raw is not None else None

    def holds_nothing(host: str, generation: int) -> bool:
        if generation == 0:
            return True
        if generation not in selectors:  # pruned or never stored: not known to hold nothing
            return False
        selector = selectors[generation]
        record = records.get(host)
        return selector is None or (record is not None and not selector.matches(record.labels))

    return holds_nothing


def _analysis(session: Session, state: machine.RolloutState,
              records: Mapping[str, HostRecord]) -> dict[str, Analysis]:
    """The analysis' observations of the hosts benchmarked around their change (one query)."""
    if state.spec.analysis is None:
        return {}
    observed = rollout_analysis.observe(session, state, records)
    return {host: Analysis(baseline=seen.baseline, verdict=seen.verdict) for host, seen in observed.items()}

