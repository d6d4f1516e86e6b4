"""Simulated hosts for the rollout machine: they execute its actions and report back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from stortune.schemas.rollout import machine
from stortune.schemas.rollout.machine import (
    Action,
    Advance,
    Command,
    FailureKind,
    HostObservation,
    Observed,
    RolloutState,
    StartAnalysis,
    Verdict,
)
from stortune.schemas.rollout.spec import RolloutSpec, parse_rollout


def spec(**fields: object) -> RolloutSpec:
    return parse_rollout(fields)


@dataclass
class Fleet:
    """Each host holds a generation; an Advance or Revert lands at the next observation, unless
    ``fails`` says the host fails it; a before-run is ready at once; ``verdicts`` judge after-runs."""

    held: dict[str, int]
    fails: dict[str, FailureKind] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    unhealthy: set[str] = field(default_factory=set)
    baseline: set[str] = field(default_factory=set)
    after: set[str] = field(default_factory=set)
    log: list[Action] = field(default_factory=list)

    @classmethod
    def of(cls, hosts: Iterable[str], generation: int = 1) -> Fleet:
        return cls({h: generation for h in hosts})

    def execute(self, actions: Sequence[Action]) -> None:
        for action in actions:
            self.log.append(action)
            if isinstance(action, Advance | machine.Revert | machine.Hold):
                if not (isinstance(action, Advance) and action.host in self.fails):
                    self.held[action.host] = action.generation
            elif isinstance(action, StartAnalysis):
                (self.baseline if action.stage == "before" else self.after).add(action.host)

    def observe(self, state: RolloutState) -> dict[str, HostObservation]:
        out = {}
        for host, hs in state.hosts.items():
            failing = self.fails.get(host) if hs.generation == state.generation else None
            out[host] = HostObservation(
                generation=self.held.get(host), healthy=host not in self.unhealthy, failure=failing,
                baseline=host in self.baseline,
                verdict=self.verdicts.get(host, "passed") if host in self.after else None)
        return out

    def advanced(self) -> list[str]:
        return [a.host for a in self.log if isinstance(a, Advance)]


def settled(state: RolloutState) -> bool:
    """Complete, or Halted with its reverts (if any) confirmed: nothing more will happen alone."""
    return state.phase == "Complete" or (state.phase == "Halted" and state.rolledBack == state.rollback)


def run(state: RolloutState, fleet: Fleet, *, now: float = 0.0, tick: float = 1.0, steps: int = 10_000,
        commands: Callable[[int, RolloutState], Sequence[Command]] = lambda i, s: (),
        check: Callable[[RolloutState], None] = lambda s: None) -> RolloutState:
    """Step until the rollout is settled, or ``steps`` steps."""
    for i in range(steps):  # a step first: the commands may be for a settled rollout
        observed = Observed(hosts=fleet.observe(state), commands=tuple(commands(i, state)))
        state, actions = machine.step(state, observed, now)
        fleet.execute(actions)
        check(state)
        now += tick
        if settled(state):
            break
    return state
