"""An experiment over several hosts of a class: each host's outcome, and whether one answer holds
on all of them.

Each host runs its own engine against its own baseline. The pooled answer is the point that is
best relative to each host's baseline (the geometric mean of the hosts' ratios), among the points
measured and feasible on every host; its gain pools the hosts' runs, each divided by that host's
baseline, and the noise rule judges it. ``holds_everywhere`` says whether it is a significant
gain on every host on its own: a class-wide profile built on one host's luck is how bad tunings
spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from stortune.schemas.tuning import evidence
from stortune.schemas.tuning.evidence import Gain, Outcome, TrialSummary
from stortune.schemas.tuning.experiment import TuningSpec
from stortune.schemas.tuning.space import Measurement, Point, describe, point_key


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class HostVerdict(_Model):
    host: str
    pct: float | None = Field(description="The pooled point against this host's baseline, in %")
    significant: bool
    confirmed: bool = Field(description="Judged on the host's confirmation runs (else its search runs)")


class FleetOutcome(_Model):
    perHost: dict[str, Outcome]
    values: Point | None = Field(description="The pooled recommendation; None: keep each host's settings")
    keepCurrent: bool
    gain: Gain | None = None
    significant: bool = False
    holds_everywhere: bool
    hosts: list[HostVerdict] = Field(default_factory=list)
    reason: str


def _gm(values: Sequence[float]) -> float:
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


def _runs_of(spec: TuningSpec, outcome: Outcome, point: Point) -> tuple[list[float], bool]:
    """The point's runs on one host: its confirmation runs when it was confirmed there."""
    conf = outcome.confirmation
    if conf is not None and conf.n and point_key(conf.point) == point_key(point):
        return list(conf.values), True
    found = next((t for t in outcome.trials if point_key(t.point) == point_key(point)), None)
    return (list(found.values) if found else []), False


def _baseline_values(outcome: Outcome) -> list[float]:
    check = outcome.baseline
    values = list(check.start.values) if check.start else []
    if check.reliable and check.end is not None:
        values += check.end.values
    return values


def pooled(measurements_by_host: Mapping[str, Sequence[Measurement]], spec: TuningSpec,
           baselines: Mapping[str, Point], members: Mapping[str, int] | None = None) -> FleetOutcome:
    per_host = {host: evidence.outcome(spec, baselines[host], ms, (members or {}).get(host, 1))
                for host, ms in measurements_by_host.items()}
    if not per_host:
        return FleetOutcome(perHost={}, values=None, keepCurrent=True, holds_everywhere=False,
                            reason="no host measured anything")
    base = {h: _baseline_values(o) for h, o in per_host.items()}
    if any(not v or min(v) <= 0 for v in base.values()):
        return FleetOutcome(perHost=per_host, values=None, keepCurrent=True, holds_everywhere=False,
                            reason="a host has no positive baseline measurement to compare with")
    candidate = _best_everywhere(spec, per_host, base)
    if candidate is None:
        return FleetOutcome(perHost=per_host, values=None, keepCurrent=True, holds_everywhere=False,
                            reason="no point was measured and feasible on every host")
    reference: list[float] = []
    pooled_runs: list[float] = []
    verdicts: list[HostVerdict] = []
    for host, outcome in per_host.items():
        scale = _gm(base[host])
        runs, confirmed = _runs_of(spec, outcome, candidate)
        reference += [v / scale for v in base[host]]
        pooled_runs += [v / scale for v in runs]
        d = evidence.compare(spec, base[host], runs) if runs else None
        verdicts.append(HostVerdict(host=host, pct=d.delta_pct if d else None,
                                    significant=bool(d and evidence.improves(spec, d)), confirmed=confirmed))
    d = evidence.compare(spec, reference, pooled_runs)
    significant = evidence.improves(spec, d)
    everywhere = significant and all(v.significant for v in verdicts)
    unconfirmed = [v.host for v in verdicts if not v.confirmed]
    note = f"; not confirmed by fresh runs on {', '.join(unconfirmed)}" if unconfirmed else ""
    shown = f"{describe(candidate)}: {d.delta_pct or 0:+.1f}% pooled over {len(per_host)} hosts"
    if not significant:
        return FleetOutcome(perHost=per_host, values=None, keepCurrent=True, gain=evidence.gain_of(d),
                            holds_everywhere=False, hosts=verdicts,
                            reason=f"{shown}, inside the noise ({d.noise_text()}): keep the current settings")
    weak = [v.host for v in verdicts if not v.significant]
    where = "on every host" if everywhere else f"but not significant on {', '.join(weak)}"
    return FleetOutcome(perHost=per_host, values=candidate, keepCurrent=False, gain=evidence.gain_of(d),
                        significant=True, holds_everywhere=everywhere, hosts=verdicts,
                        reason=f"{shown}, beyond the noise ({d.noise_text()}), {where}{note}")


def _best_everywhere(spec: TuningSpec, per_host: Mapping[str, Outcome],
                     base: Mapping[str, list[float]]) -> Point | None:
    tables: list[dict[tuple[tuple[str, int | str], ...], TrialSummary]] = [
        {point_key(t.point): t for t in o.trials if t.feasible and t.mean} for o in per_host.values()]
    common = set(tables[0]).intersection(*tables[1:])
    best: tuple[float, Point] | None = None
    for key in sorted(common, key=str):
        ratios = [(t[key].mean or 0.0) / _gm(b) for t, b in zip(tables, base.values(), strict=True)]
        score = _gm(ratios) if spec.objective.maximize else 1 / _gm(ratios)
        if best is None or score > best[0]:
            best = (score, dict(tables[0][key].point))
    return best[1] if best else None
