"""``spec.rollout`` of a StorageProfile: how a new generation reaches the hosts it changes.

Waves are cumulative: each wave's size counts the hosts of the waves before it, and a host
belongs to the first wave that takes it (``waves.deal``). The last wave must be
``{percent: 100}``: a list that ends short of the fleet would leave hosts on the old
generation for ever, and a last wave that silently "takes the rest" would turn ``{hosts: 5}``
into a wave of a thousand. Sizes only grow (hosts after hosts, percent after percent), so no
wave is written to be empty. ``strategy: all-at-once`` is today's behaviour: every host at
once, nothing gated, nothing halted; it takes no other field.

A StorageProfile's ``spec.rollout`` (docs/rollouts.md); without it a change goes out in the
default waves. ``parse_rollout`` reads that mapping and names each problem by its path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    StrictBool,
    StrictInt,
    Tag,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from stortune.schemas.bench.safety import writing_steps
from stortune.schemas.bench.spec import BenchmarkSpecBody, Duration, PresetRef, Workload, at_most
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep
from stortune.schemas.documents import DocumentError, Problem, validation_problems, with_subpath
from stortune.schemas.patterns import glob_matches
from stortune.schemas.profile import NAME_PATTERN, is_name
from stortune.schemas.tuning.experiment import Objective, measures

#: Waves one rollout may have: a canary, a few widening steps and the rest need far fewer.
MAX_WAVES = 20
#: The largest host count a document may give (a wave's size, maxUnavailable, maxFailures).
MAX_HOSTS = 100_000
#: The longest soak, and the oldest before-run an analysis may reuse: a week. Longer is a typo.
WEEK = 7 * 86400.0
MAX_OBJECTIVES = 16
#: What a rollout does without spec.rollout (issue 27): a canary, a tenth, everyone.
DEFAULT_WAVES: tuple[dict[str, JsonValue], ...] = ({"hosts": 1}, {"percent": 10}, {"percent": 100})

Strategy = Literal["waves", "all-at-once"]
OnFailure = Literal["rollback", "pause"]
_PERCENT_TEXT = re.compile(r"([0-9]{1,3})%")


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _percent_number(value: object) -> object:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError(f"{value!r:.40} is not a number: write the percentage as 10, not '10%'")
    return value


class Wave(_Doc):
    """A wave's size, counting the waves before it: ``{hosts: N}`` or ``{percent: P}``."""

    hosts: StrictInt | None = Field(default=None, description="Hosts changed once this wave is through",
                                    json_schema_extra={"minimum": 1, "maximum": MAX_HOSTS})
    percent: Annotated[float | None, BeforeValidator(_percent_number)] = Field(
        default=None, description="Percent of the hosts the change concerns, rounded up, at least one",
        json_schema_extra={"exclusiveMinimum": 0, "maximum": 100})

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, v: int | None) -> int | None:
        if v is not None and not 1 <= v <= MAX_HOSTS:
            raise ValueError(f"{v} is not a wave size: a wave takes from 1 to {MAX_HOSTS} hosts")
        return v

    @field_validator("percent")
    @classmethod
    def _percent(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 100:  # NaN fails too
            raise ValueError(f"{v:g} is not a wave size: a percentage is above 0 and at most 100")
        return v

    @model_validator(mode="after")
    def _one(self) -> Wave:
        if (self.hosts is None) == (self.percent is None):
            raise ValueError("give exactly one of hosts (a count) or percent (of the hosts changed)")
        return self


def _count(least: int) -> Callable[[object], int | str]:
    """A host count from ``least`` or a percentage text ``N%`` (normalised)."""
    def check(value: object) -> int | str:
        if isinstance(value, int) and not isinstance(value, bool):
            if not least <= value <= MAX_HOSTS:
                raise ValueError(f"{value} must be from {least} to {MAX_HOSTS} hosts, or a percentage"
                                 " like 10%")
            return value
        m = _PERCENT_TEXT.fullmatch(value.strip()) if isinstance(value, str) and len(value) <= 16 else None
        if m is None:
            raise ValueError(f"{value!r:.40} is not a host count like 1 or a percentage like 10%")
        percent = int(m.group(1))
        if not max(least, 0) <= percent <= 100 or (least and percent == 0):
            raise ValueError(f"{value!r} must be from {'1%' if least else '0%'} to 100%")
        return f"{percent}%"
    return check


def _count_schema(least: int, description: str) -> dict[str, Any]:
    return {"anyOf": [{"type": "integer", "minimum": least, "maximum": MAX_HOSTS},
                      {"type": "string", "pattern": r"^[0-9]{1,3}%$"}], "description": description}


#: Hosts being changed at once inside a wave: at least one.
MaxUnavailable = Annotated[int | str, BeforeValidator(_count(1)), WithJsonSchema(_count_schema(
    1, "Hosts of a wave being changed at once: a count, or a percentage of the wave (rounded up)"))]
#: Failed hosts the rollout tolerates: zero halts at the first.
MaxFailures = Annotated[int | str, BeforeValidator(_count(0)), WithJsonSchema(_count_schema(
    0, "Failed hosts tolerated before the rollout halts: a count, or a percentage of the hosts it"
       " concerns (rounded down)"))]


WeekTime = Annotated[Duration, at_most(WEEK, "a week", "this may be", "2m, 1h, 24h")]
#: The name of a stored BenchmarkSpec (its target and workloads are checked when it is used).
SpecName = Annotated[str, Field(json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 253})]


def _bench_kind(value: Any) -> str:
    if isinstance(value, str):
        return "spec"
    if isinstance(value, PresetRef) or (isinstance(value, dict) and "preset" in value):
        return "preset"
    return "workload"


BenchmarkRef = Annotated[
    Annotated[SpecName, Tag("spec")] | Annotated[PresetRef, Tag("preset")]
    | Annotated[Workload, Tag("workload")],
    Discriminator(_bench_kind),
]


def workload_problems(steps: Sequence[WorkloadStep], objectives: Sequence[Objective],
                      on_device: bool = True) -> list[str]:
    """Why these steps cannot judge a canary: a writing step on a raw device (a rollout never
    destroys data, allowDestructive or not), or an objective no step measures. Shared by the
    inline workload (here) and a stored BenchmarkSpec (``check_stored_benchmark``)."""
    problems: list[str] = []
    writing = writing_steps(steps) if on_device else ""
    if writing:
        problems.append(f"@benchmark {writing} write to the raw device, destroying its contents: an"
                        " analysis runs read workloads only (preset stream-32k, or a read or"
                        " randread workload)")
    names = ", ".join(s.name for s in steps)
    for i, objective in enumerate(objectives):
        named = [s for s in steps if glob_matches(objective.step, s.name)]
        direction = objective.metric.split("_", 1)[0]
        if not named:
            problems.append(f"@objectives[{i}].step {objective.step!r} matches no step; steps are {names}")
        elif not any(measures(s.pattern, direction) for s in named):
            problems.append(f"@objectives[{i}] no step it names {direction}s, so {objective.metric}"
                            " would never be measured")
    return problems


class Analysis(_Doc):
    """Benchmark evidence a gated wave's hosts must give: before, change, after, noise rule."""

    benchmark: BenchmarkRef = Field(description=(
        "A preset with its overrides ({preset: stream-32k, runtime: 10s}), a read workload, or the"
        " name of a stored BenchmarkSpec; run on the devices the profile's rules change"))
    objectives: list[Objective] = Field(default_factory=list, max_length=MAX_OBJECTIVES, description=(
        "Metrics a canary must not regress beyond the noise (default: each step's own figures)"))
    requireImprovement: StrictBool = Field(default=False, description=(
        "A canary must also improve an objective beyond the noise"))
    maxAge: WeekTime | None = Field(default=None, gt=0, description=(
        "Reuse the host's own run of the same workload younger than this as the before-run"
        " (default: always benchmark before the change; at most 7 days)"))
    waves: list[StrictInt] = Field(default_factory=lambda: [1], min_length=1, max_length=MAX_WAVES,
                                   description="The waves gated, by number (1 is the first)",
                                   json_schema_extra={"default": [1]})

    @field_validator("waves")
    @classmethod
    def _numbers(cls, v: list[int]) -> list[int]:
        for i, number in enumerate(v):
            if not 1 <= number <= MAX_WAVES:
                raise ValueError(f"@[{i}] wave {number} is not a wave number (1 to {MAX_WAVES})")
            if number in v[:i]:
                raise ValueError(f"@[{i}] wave {number} is listed twice")
        return sorted(v)

    @model_validator(mode="after")
    def _read_only(self) -> Analysis:
        if isinstance(self.benchmark, str):
            if not is_name(self.benchmark):
                raise ValueError(f"@benchmark {self.benchmark[:80]!r} is not a BenchmarkSpec name: lower-case"
                                 " letters, digits, '-' and '.', at most 253 characters")
            return self
        steps = (self.benchmark.steps(TargetFacts(), 1) if isinstance(self.benchmark, PresetRef)
                 else [self.benchmark.step(1)])
        problems = workload_problems(steps, self.objectives)
        if problems:
            raise ValueError(problems[0])
        return self


def check_stored_benchmark(analysis: Analysis, body: BenchmarkSpecBody) -> list[str]:
    """For the control plane, once it has the BenchmarkSpec ``analysis.benchmark`` names: what
    makes it unfit to judge a canary (messages start with ``@field``, as the parser's do)."""
    return workload_problems(body.steps(TargetFacts()), analysis.objectives,
                             on_device=body.target.device is not None)


def _default_waves() -> list[Wave]:
    return [Wave.model_validate(w) for w in DEFAULT_WAVES]


class RolloutSpec(_Doc):
    strategy: Strategy = Field(default="waves", description=(
        "waves: wave after wave, each gated by health (and analysis); all-at-once: every host"
        " at once, as without rollouts"))
    waves: list[Wave] = Field(default_factory=_default_waves, min_length=1, max_length=MAX_WAVES,
                              description="Cumulative sizes; the last is {percent: 100}",
                              json_schema_extra={"default": list(DEFAULT_WAVES)})
    # 10%, not Kubernetes' 1: one host at a time makes the last wave of a 1,000-host fleet 900 applies
    # in a row, where issue 27 asks for at most 1.5x the time of all-at-once. A canary wave of one
    # host is still changed alone (10% of 1 rounds up to 1).
    maxUnavailable: MaxUnavailable = "10%"
    maxFailures: MaxFailures = 0
    soak: WeekTime = Field(default=0.0, ge=0, description=(
        "How long a wave stays updated and healthy before the next starts (at most 7 days)"))
    onFailure: OnFailure = Field(default="rollback", description=(
        "Past maxFailures or on a failed analysis: rollback puts the changed hosts back on the"
        " previous generation; pause halts where it is"))
    analysis: Analysis | None = None

    @model_validator(mode="after")
    def _coherent(self) -> RolloutSpec:
        if self.strategy == "all-at-once":
            # A field at its default says nothing: the canonical form (``document()``, and a
            # StorageProfile's) writes every default out, and must parse back.
            fields = type(self).model_fields
            extra = sorted(f for f in self.model_fields_set - {"strategy"}
                           if getattr(self, f) != fields[f].get_default(call_default_factory=True))
            if extra:
                raise ValueError(f"@{extra[0]} strategy all-at-once changes every host at once, so"
                                 f" {', '.join(extra)} cannot apply: remove it, or use strategy: waves")
            return self
        last = self.waves[-1]
        if last.percent != 100:
            raise ValueError(f"@waves[{len(self.waves) - 1}] the last wave must be {{percent: 100}}, so that"
                             " every host is reached: add it after this one")
        previous: dict[str, tuple[int, float]] = {}
        for i, wave in enumerate(self.waves):
            kind, size = ("hosts", float(wave.hosts)) if wave.hosts is not None else ("percent", wave.percent)
            assert size is not None  # Wave._one
            if kind in previous and size <= previous[kind][1]:
                j = previous[kind][0]
                raise ValueError(f"@waves[{i}].{kind} {size:g} is not above waves[{j}].{kind}"
                                 f" {previous[kind][1]:g}: sizes count the waves before, so each"
                                 " must be larger")
            previous[kind] = (i, size)
        if self.analysis is not None:
            beyond = [n for n in self.analysis.waves if n > len(self.waves)]
            if beyond:
                raise ValueError(f"@analysis.waves wave {beyond[0]} does not exist: there are"
                                 f" {len(self.waves)} waves")
        return self

    def document(self) -> dict[str, Any]:
        """Canonical JSON form; parses back to an equal spec."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- reading -------------------------------------------------------------------------

def _problems(exc: ValidationError, where: str, prefix: str) -> list[Problem]:
    """Field paths under ``prefix``, without pydantic's union tags, a validator's ``@sub.path``
    moved into the path."""
    out = []
    for problem in validation_problems(exc, where):
        path = re.sub(r"^analysis\.benchmark\.(?:spec|preset|workload)(?=\.|$)", "analysis.benchmark",
                      problem.path)
        path, message = with_subpath(path, problem.message)
        out.append(Problem(problem.where, f"{prefix}.{path}" if path else prefix, message))
    return out


def parse_rollout(data: Any, where: str = "document", prefix: str = "spec.rollout") -> RolloutSpec:
    """``spec.rollout`` from decoded YAML/JSON (None: the defaults); DocumentError naming each
    field at fault by its path under ``prefix``."""
    try:
        return RolloutSpec.model_validate({} if data is None else data)
    except ValidationError as exc:
        raise DocumentError(_problems(exc, where, prefix)) from None
