"""The rollout state machine: ``step(state, observed, now) -> (state, actions)``, pure.

One rollout moves one profile's hosts from ``previous`` (the last generation that completed;
0 when the profile held nothing before) to ``generation``. The control plane stores the state,
feeds the hosts' observations and people's commands, and executes the actions, which are data:
``Advance`` / ``Revert`` / ``Hold`` set the generation of the profile a host must hold,
``StartAnalysis`` asks for a benchmark, ``Event`` is for people. The machine never asks twice
for what it asked (a stage records it), so a controller that executes each step's actions once
and stores the state in the same transaction resumes after a crash where it was.

A host of the open wave goes ``pending`` -> (``baseline``, when its wave is gated: the
before-run) -> ``changing`` (Advance sent) -> (``analysing``: the after-run and its verdict) ->
``updated``; or to ``failed``. ``baseline``, ``changing`` and ``analysing`` are the changing
hosts ``maxUnavailable`` bounds, with any updated host that is not healthy (as Kubernetes
counts unavailable pods: a sick host is not a spare slot); failed hosts count against
``maxFailures`` instead, or one failure would stall a wave for ever. A failure is sticky: a host
that comes back keeps its count. A wave passes when each of its hosts is updated and healthy
or failed, and has stayed so for ``soak`` (the last wave too: Complete means the fleet stayed
healthy). A failed analysis halts whatever ``maxFailures`` says: it is evidence against the
change, not a flaky host; a before-run that fails (verdict ``failed`` in ``baseline``) is a
failed host, counted against ``maxFailures``. Halting with ``onFailure: rollback`` (and
``undo``) reverts every host not at ``previous``; the rollout is ``rolledBack`` once each
reports ``previous`` (or is unreachable: the control plane keeps it desired at ``previous``
and it converges on return).
``pause`` stops new hosts and waves (in-flight hosts finish; the soak restarts on resume);
``resume`` lifts a pause, or a halt that reverted nothing (failures so far are excused).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.rollout import waves as dealing
from stortune.schemas.rollout.spec import RolloutSpec

Phase = Literal["Progressing", "Paused", "Halted", "Complete"]
HaltReason = Literal["FailureLimit", "AnalysisFailed", "Undone"]
Stage = Literal["pending", "baseline", "changing", "analysing", "updated", "failed", "reverting", "reverted"]
#: Why a host failed: its apply failed, left a setting blocked, it became unreachable, or a
#: setting drifted and could not be corrected (the controller decides each, for this generation).
FailureKind = Literal["apply-failed", "blocked", "unreachable", "drift", "analysis"]
Verdict = Literal["passed", "failed"]
Command = Literal["pause", "resume", "undo"]
AnalysisStage = Literal["before", "after"]

#: Stages in which a host is being changed (or benchmarked around its change).
_IN_FLIGHT: frozenset[Stage] = frozenset({"baseline", "changing", "analysing"})


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HostState(_Frozen):
    wave: int = Field(description="Index of the host's wave (0 is the first)")
    generation: int = Field(description="The generation of the profile the host must hold")
    stage: Stage = "pending"
    failure: FailureKind | None = None
    verdict: Verdict | None = None


class RolloutState(_Frozen):
    """What the control plane stores for a profile's rollout (JSON: ``model_dump``)."""

    profile: str
    spec: RolloutSpec
    generation: int
    previous: int = Field(description="The last generation that completed; 0: the profile held nothing")
    phase: Phase = "Progressing"
    reason: HaltReason | None = None
    rollback: bool = Field(default=False, description="Revert actions were sent")
    rolledBack: bool = Field(default=False, description="Every reverted host holds previous again")
    wave: int = Field(default=0, description="Index of the open wave")
    waves: int = Field(description="How many waves the rollout has")
    hosts: dict[str, HostState]
    failures: int = Field(default=0, description="Hosts that failed in this rollout (sticky)")
    excused: int = Field(default=0, description="Failures a resume acknowledged")
    soakSince: float | None = None
    started: float

    @property
    def last_completed(self) -> int:
        """What a host enrolling now must hold, and what a newer rollout starts from."""
        return self.generation if self.phase == "Complete" else self.previous


class HostObservation(_Frozen):
    """What the control plane last knew of a host, about this profile's rollout."""

    generation: int | None = Field(default=None, description="The generation it last applied in full")
    healthy: bool = True
    failure: FailureKind | None = None
    baseline: bool = Field(default=False, description="Its before-run is ready (analysis)")
    verdict: Verdict | None = Field(default=None, description="The noise rule's verdict on its after-run")


class Observed(_Frozen):
    """One step's input. A host without an observation is unknown: it neither progresses nor fails."""

    hosts: dict[str, HostObservation] = Field(default_factory=dict)
    commands: tuple[Command, ...] = ()
    enrolled: tuple[str, ...] = Field(default=(), description="Hosts the profile newly selects")
    departed: tuple[str, ...] = Field(default=(), description="Hosts gone from the profile")


@dataclass(frozen=True)
class _Put:
    """The host must hold ``generation`` of the profile (subclasses say why; they never compare equal)."""

    host: str
    generation: int


class Advance(_Put):
    """A host of the open wave takes the new generation."""


class Revert(_Put):
    """A changed host goes back to the previous generation (halt with rollback, or undo)."""


class Hold(_Put):
    """An enrolling host gets the last completed generation; not a change of this rollout."""


@dataclass(frozen=True)
class StartAnalysis:
    host: str
    stage: AnalysisStage


@dataclass(frozen=True)
class Event:
    reason: str
    message: str


Action = Advance | Revert | Hold | StartAnalysis | Event


class _Run:
    """One step's working copy: the state's fields replaced as they change, hosts as they move,
    actions in the order decided."""

    def __init__(self, state: RolloutState) -> None:
        self.s = state
        self.hosts = dict(state.hosts)
        self.actions: list[Action] = []
        self.regressed: list[str] = []

    def set(self, **values: object) -> None:
        self.s = self.s.model_copy(update=values)

    def move(self, host: str, **changes: object) -> None:
        self.hosts[host] = self.hosts[host].model_copy(update=changes)

    def event(self, reason: str, message: str) -> None:
        self.actions.append(Event(reason, message))

    def members(self, wave: int) -> list[str]:
        """The wave's hosts in rollout order (the hosts dict keeps the order they were dealt in)."""
        return [h for h, hs in self.hosts.items() if hs.wave == wave]

    def state(self) -> RolloutState:
        return self.s.model_copy(update={"hosts": self.hosts})


def start(profile: str, spec: RolloutSpec, generation: int, previous: int, hosts: Iterable[str], *,
          now: float, current: Mapping[str, int] | None = None,
          commands: Sequence[Command] = ()) -> tuple[RolloutState, list[Action]]:
    """A rollout of ``generation`` over the hosts whose desired state it changes (see ``concerned``;
    the others may take it at once: it holds the same for them). ``current``: a host's generation
    when not ``previous`` (a superseded rollout had changed it); it keeps it until its wave."""
    wave_list = dealing.waves_of(spec)
    dealt = dealing.deal(profile, hosts, wave_list)
    held = current or {}
    state = RolloutState(
        profile=profile, spec=spec, generation=generation, previous=previous, waves=len(wave_list),
        started=now, hosts={h: HostState(wave=i, generation=held.get(h, previous))
                            for i, members in enumerate(dealt) for h in members})
    sizes = "/".join(str(len(m)) for m in dealt)
    first = Event("RolloutStarted", f"generation {generation} of {profile} over {len(state.hosts)} hosts"
                                    f" in waves of {sizes} (from generation {previous})")
    new, actions = step(state, Observed(commands=tuple(commands)), now)
    return new, [first, *actions]


def supersede(state: RolloutState, spec: RolloutSpec, generation: int, hosts: Iterable[str],
              now: float) -> tuple[RolloutState, list[Action]]:
    """A new generation during a rollout: a new rollout from the last completed generation; the
    hosts the old one had changed are concerned too, and keep what they hold until their wave."""
    base = state.last_completed
    current = {h: s.generation for h, s in state.hosts.items() if s.generation != base}
    # A pause people asked for outlives the generation it was asked on: a GitOps sync pushing
    # the next commit must not lift it and change more canaries.
    paused: tuple[Command, ...] = ("pause",) if state.phase == "Paused" else ()
    new, actions = start(state.profile, spec, generation, base, set(hosts) | set(current), now=now,
                         current=current, commands=paused)
    note = Event("Superseded", f"generation {generation} replaces the rollout of {state.generation}"
                               f" ({state.phase}); {len(current)} hosts held it")
    return new, [note, *actions]


def step(state: RolloutState, observed: Observed, now: float) -> tuple[RolloutState, list[Action]]:
    run = _Run(state)
    _membership(run, observed)
    for command in observed.commands:
        _command(run, command)
    _observe(run, observed.hosts)
    _judge(run)
    if run.s.rollback and not run.s.rolledBack and all(h.stage != "reverting" for h in run.hosts.values()):
        run.set(rolledBack=True)
        run.event("RolledBack", f"every changed host holds generation {run.s.previous} again")
    if run.s.phase == "Progressing":
        _progress(run, observed.hosts, now)
    elif run.s.phase == "Paused":
        run.set(soakSince=None)
    return run.state(), run.actions


# -- the parts of a step ---------------------------------------------------------------
def _membership(run: _Run, observed: Observed) -> None:
    for host in observed.departed:
        if run.hosts.pop(host, None) is not None:
            run.event("Departed", f"{host} left the profile; it no longer counts in the rollout")
    last_wave = run.s.waves - 1
    for host in observed.enrolled:
        if host in run.hosts:
            continue
        complete = run.s.phase == "Complete"
        generation = run.s.generation if complete else run.s.previous
        run.hosts[host] = HostState(wave=last_wave, generation=generation,
                                    stage="updated" if complete else "pending")
        run.actions.append(Hold(host, generation))
        run.event("Enrolled", f"{host} holds generation {generation}, the last completed"
                              + ("" if complete else f", and joins wave {last_wave + 1}"))


def _command(run: _Run, command: Command) -> None:
    phase = run.s.phase
    if command == "pause" and phase == "Progressing":
        run.set(phase="Paused")
        run.event("Paused", "paused on request: no host starts changing until resume")
    elif command == "resume" and phase == "Paused":
        run.set(phase="Progressing")
        run.event("Resumed", "resumed on request")
    elif command == "resume" and phase == "Halted" and not run.s.rollback:
        run.set(phase="Progressing", reason=None, excused=run.s.failures)
        run.event("Resumed", f"resumed on request; the {run.s.failures} failures so far are excused")
    elif command == "undo" and not run.s.rollback:
        _halt(run, "Undone", "undone on request", revert=True)
    else:
        run.event("Ignored", f"{command} does nothing to a rollout that is {phase}"
                             + (" and rolled back: apply a new generation instead" if run.s.rollback
                                else ""))


def _fail(run: _Run, host: str, kind: FailureKind) -> None:
    run.move(host, stage="failed", failure=kind)
    run.set(failures=run.s.failures + 1)
    run.event("HostFailed", f"{host} failed: {kind}")


def _observe(run: _Run, observations: Mapping[str, HostObservation]) -> None:
    target = run.s.generation
    previous = run.s.previous
    live = run.s.phase != "Complete"
    for host, seen in observations.items():
        hs = run.hosts.get(host)
        if hs is None or hs.stage in ("pending", "failed", "reverted"):
            continue
        if hs.stage == "reverting":
            if seen.generation == previous or seen.failure == "unreachable":
                run.move(host, stage="reverted")
            continue
        if seen.failure is not None and live and not run.s.rollback:
            _fail(run, host, seen.failure)
        elif hs.stage == "baseline" and seen.baseline:
            run.move(host, stage="changing", generation=target)
            run.actions.append(Advance(host, target))
        elif hs.stage == "baseline" and seen.verdict == "failed":
            # No before-run can be had (it failed, or the benchmark cannot run there): the host
            # fails and counts against maxFailures; the change itself was not judged.
            _fail(run, host, "analysis")
        elif hs.stage == "changing" and seen.generation == target and seen.healthy:
            if _gated(run, hs.wave):
                run.move(host, stage="analysing")
                run.actions.append(StartAnalysis(host, "after"))
            else:
                run.move(host, stage="updated")
        elif hs.stage == "analysing" and seen.verdict is not None:
            run.move(host, verdict=seen.verdict)
            if seen.verdict == "passed":
                run.move(host, stage="updated")
            else:
                _fail(run, host, "analysis")
                run.regressed.append(host)


def _gated(run: _Run, wave: int) -> bool:
    analysis = run.s.spec.analysis
    return analysis is not None and wave + 1 in analysis.waves


def _judge(run: _Run) -> None:
    if run.s.phase not in ("Progressing", "Paused"):
        return
    failures = run.s.failures - run.s.excused
    limit = dealing.max_failures(run.s.spec, len(run.hosts))
    revert = run.s.spec.onFailure == "rollback"
    if run.regressed:
        _halt(run, "AnalysisFailed", f"the analysis found a regression on {', '.join(run.regressed[:5])}",
              revert=revert)
    elif failures > limit:
        _halt(run, "FailureLimit", f"{failures} hosts failed, more than maxFailures {limit}", revert=revert)


def _halt(run: _Run, reason: HaltReason, why: str, *, revert: bool) -> None:
    previous = run.s.previous
    run.set(phase="Halted", reason=reason, soakSince=None)
    for host in [h for h, hs in run.hosts.items() if hs.stage == "baseline"]:
        run.move(host, stage="pending")  # not changed yet: its before-run is no longer needed
    if not revert:
        run.event("Halted", f"{why}; no further host changes (resume to go on, undo to revert)")
        return
    run.set(rollback=True)
    back = sorted(h for h, hs in run.hosts.items() if hs.generation != previous)
    for host in back:
        run.move(host, stage="reverting", generation=previous)
        run.actions.append(Revert(host, previous))
    run.event("Halted", f"{why}; {len(back)} hosts go back to generation {previous}")


def _progress(run: _Run, observations: Mapping[str, HostObservation], now: float) -> None:
    total = run.s.waves
    while True:
        wave = run.s.wave
        members = run.members(wave)
        _start_hosts(run, wave, members, observations)
        if not members:  # the waves before took every host it would: nothing to soak
            run.event("WaveSkipped", f"wave {wave + 1} of {total} has no hosts of its own")
        elif not _wave_ready(run, members, observations):
            run.set(soakSince=None)
            return
        else:
            since = now if run.s.soakSince is None else run.s.soakSince
            if now - since < run.s.spec.soak:
                run.set(soakSince=since)
                return
            run.event("WavePassed", f"wave {wave + 1} of {total} passed ({len(members)} hosts)")
        run.set(soakSince=None, wave=wave + 1)
        if wave + 1 == total:
            run.set(phase="Complete", wave=wave)
            run.event("Complete", f"generation {run.s.generation} reached every host")
            return
        run.event("WaveStarted", f"wave {wave + 2} of {total} starts")


def _start_hosts(run: _Run, wave: int, members: Sequence[str],
                 observations: Mapping[str, HostObservation]) -> None:
    busy = sum(1 for h in members if run.hosts[h].stage in _IN_FLIGHT
               or (run.hosts[h].stage == "updated" and not _healthy(observations, h)))
    room = dealing.max_unavailable(run.s.spec, len(members)) - busy
    target = run.s.generation
    for host in members:
        if room <= 0:
            return
        if run.hosts[host].stage != "pending":
            continue
        if _gated(run, wave):
            run.move(host, stage="baseline")
            run.actions.append(StartAnalysis(host, "before"))
        else:
            run.move(host, stage="changing", generation=target)
            run.actions.append(Advance(host, target))
        room -= 1


def _healthy(observations: Mapping[str, HostObservation], host: str) -> bool:
    seen = observations.get(host)
    return seen is None or seen.healthy


def _wave_ready(run: _Run, members: Sequence[str], observations: Mapping[str, HostObservation]) -> bool:
    """Each host updated and seen healthy this step, or failed."""
    return all(run.hosts[h].stage == "failed" or (
        run.hosts[h].stage == "updated" and h in observations and observations[h].healthy)
        for h in members)


# -- for the control plane and people ---------------------------------------------------
def concerned(before: Mapping[str, Mapping[str, object]], after: Mapping[str, Mapping[str, object]]
              ) -> list[str]:
    """Hosts whose desired state (any mapping: device/tunable -> value) the new generation
    changes; a host absent from ``after`` holds nothing (a deleted profile, a host no longer
    selected), so its restorations roll out too. Empty: no rollout is needed."""
    return sorted(h for h in set(before) | set(after) if dict(before.get(h, {})) != dict(after.get(h, {})))


def counts(state: RolloutState) -> dict[str, int]:
    """Hosts per stage, every stage present (the status's numbers, one per phase of a host)."""
    out: dict[str, int] = dict.fromkeys(get_args(Stage), 0)
    for hs in state.hosts.values():
        out[hs.stage] += 1
    return out
