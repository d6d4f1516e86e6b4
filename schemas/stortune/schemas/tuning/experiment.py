"""The TuningExperiment document (apiVersion stortune/v1): which settings to vary, how, and to what end.

An experiment names the hosts and the device (the profile matcher), the workload (as a
BenchmarkSpec's), one objective metric and optional constraints, the parameters (catalog
tunables on the target or on the devices beneath it, with explicit values or a range), a
search strategy, adaptive repeats and a budget. Everything is checked against the catalog
when the document is read; what depends on the chosen device (a scheduler the kernel offers,
a tunable of the device's kind) is checked by ``check_against_device`` at submission.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictInt,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema, WithJsonSchema

from stortune.schemas import catalog, sizes
from stortune.schemas.bench import metrics
from stortune.schemas.bench.spec import BenchmarkSpecBody, Duration, Target, Threshold, WorkloadItem
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep
from stortune.schemas.catalog import TunableValueError, Value
from stortune.schemas.documents import (
    DocumentError,
    Problem,
    check_header,
    labelled,
    load_yaml_documents,
    validation_problems,
    with_subpath,
    without_tags,
)
from stortune.schemas.patterns import glob_matches
from stortune.schemas.planner import device_facts
from stortune.schemas.profile import NAME_PATTERN, Glob, LabelSelector, Match, Metadata, is_name
from stortune.schemas.topology import Device

KIND = "TuningExperiment"
#: Points a grid may hold (the product of the parameters' value counts); the control plane
#: has a setting that lowers it.
MAX_GRID = 4096
#: Values one parameter may list, or a range may expand to.
MAX_VALUES = 256
MAX_PARAMETERS = 16
#: The longest experiment text read (YAML or JSON).
MAX_DOCUMENT_BYTES = 1 << 20
#: Bound of a range's ends: above every catalog maximum, far below where float arithmetic
#: (a log scale's exp) overflows.
RANGE_MAX = 2**40
#: The longest wall-time budget (seconds): a month.
DURATION_MAX = 31 * 86400
#: The wall-time budget when the document gives none (seconds): the hosts are the experiment's
#: until it ends, so a forgotten one gives them back the same day.
DURATION_DEFAULT = 6 * 3600
#: Parameter key of a tunable set on the devices beneath the target.
BENEATH = "@beneath"

Strategy = Literal["one-at-a-time", "grid", "bayesian"]
Goal = Literal["maximize", "minimize"]
#: What each fio pattern measures.
_DIRECTIONS = {"read": ("read",), "randread": ("read",), "write": ("write",), "randwrite": ("write",),
               "rw": ("read", "write"), "randrw": ("read", "write")}


def measures(pattern: str, direction: str) -> bool:
    """Whether a step of fio ``pattern`` measures the metrics of ``direction`` (a metric's first
    word: read and write are directions, any other word is measured by every step)."""
    return direction not in ("read", "write") or direction in _DIRECTIONS[pattern]

Size = Annotated[int, BeforeValidator(sizes.parse_size), WithJsonSchema(sizes.json_schema(
    "Bytes, or with a unit: 512MiB, 2G (docs/profiles.md, Sizes)"))]
_Percent = Annotated[float, WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string"}],
                                            "description": "Percent: 10 or 10%"})]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _metric(name: str) -> str:
    metrics.get(name)
    return name


class ValueRange(_Doc):
    """Integers from min to max in ``steps`` points, evenly spaced or on a log scale."""

    min: StrictInt = Field(ge=0, le=RANGE_MAX)
    max: StrictInt = Field(ge=0, le=RANGE_MAX)
    scale: Literal["linear", "log"] = "linear"
    steps: StrictInt = Field(default=5, ge=2, le=MAX_VALUES)

    @model_validator(mode="after")
    def _ordered(self) -> ValueRange:
        if self.min >= self.max:
            raise ValueError(f"min {self.min} must be below max {self.max}")
        if self.scale == "log" and self.min < 1:
            raise ValueError("a log scale starts at 1 or more (min)")
        return self

    def points(self, multiple_of: int | None) -> list[int]:
        """The integers, rounded to the tunable's multiple, deduplicated, ascending."""
        out: list[int] = []
        for i in range(self.steps):
            frac = i / (self.steps - 1)
            if self.scale == "log":
                raw = math.exp(math.log(self.min) + frac * (math.log(self.max) - math.log(self.min)))
            else:
                raw = self.min + frac * (self.max - self.min)
            value = round(raw)
            if multiple_of:
                value = max(multiple_of, round(value / multiple_of) * multiple_of) if value else 0
            if value not in out:
                out.append(value)
        return out


def _scalar(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"must be an integer or a name, got {value!r:.40}")
    return value


#: One value of a parameter: the tunable's own check (in Parameter) says which kind it takes.
ParamValue = Annotated[int | str, BeforeValidator(_scalar), WithJsonSchema(
    {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 32}]})]


class Parameter(_Doc):
    tunable: str = Field(description="A catalog tunable: " + ", ".join(sorted(
        t.name for t in catalog.ordered() if t.scope == "device")))
    at: Literal["target", "beneath"] = Field(
        default="target", description="On the target device, or on every device beneath it"
                                      " (the md members' scheduler)")
    values: list[ParamValue] | None = Field(default=None, min_length=1, max_length=MAX_VALUES)
    range: ValueRange | None = None

    @field_validator("tunable")
    @classmethod
    def _tunable(cls, v: str) -> str:
        if v not in catalog.CATALOG:
            raise ValueError(f"unknown tunable {v[:80]!r}; known: {', '.join(sorted(catalog.CATALOG))}")
        if catalog.get(v).scope != "device":
            raise ValueError(f"{v} is host-wide; an experiment varies device tunables")
        return v

    @model_validator(mode="after")
    def _values(self) -> Parameter:
        if (self.values is None) == (self.range is None):
            raise ValueError("give exactly one of values (a list) or range {min, max, scale, steps}")
        tunable = catalog.get(self.tunable)
        if self.range is not None:
            if isinstance(tunable, catalog.ChoiceTunable):
                raise ValueError(f"@range {self.tunable} takes names; list them under values")
            for i, value in enumerate(self.range.points(tunable.multiple_of)):
                try:
                    tunable.validate(value)
                except TunableValueError as exc:
                    raise ValueError(f"@range expands to {value} (point {i + 1}), which {exc}") from None
            return self
        seen: set[Value] = set()
        for i, item in enumerate(self.values or []):
            try:
                checked: Value = tunable.validate(item)
            except TunableValueError as exc:
                raise ValueError(f"@values[{i}] {self.tunable} {exc}") from None
            if checked in seen:
                raise ValueError(f"@values[{i}] {checked!r} is listed twice")
            seen.add(checked)
        return self

    @property
    def key(self) -> str:
        """The name of this parameter in a point: the tunable, with ``@beneath`` when beneath."""
        return self.tunable + (BENEATH if self.at == "beneath" else "")

    def choices(self) -> list[Value]:
        """The values tried, in order."""
        if self.range is not None:
            return list(self.range.points(catalog.get(self.tunable).multiple_of))
        return list(self.values or [])


class Objective(_Doc):
    metric: str = Field(json_schema_extra={"enum": list(metrics.METRICS)})
    goal: Goal | None = Field(default=None, description="Default: the metric's better direction")
    step: Glob = Field(default="*", description="Glob over step names; the run's value is the mean"
                                                " over the steps it matches")

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        return _metric(v)

    @property
    def maximize(self) -> bool:
        if self.goal is None:
            return metrics.get(self.metric).higher_is_better
        return self.goal == "maximize"


class MetricBound(Threshold):
    """Another metric's bound, on the mean of a point's runs over the steps named by ``step``."""


def _percent(value: object) -> float:
    if isinstance(value, str) and value.strip().endswith("%"):
        value = value.strip()[:-1]
    if isinstance(value, bool) or not isinstance(value, int | float | str) or (
            isinstance(value, str) and len(value) > 32):
        raise ValueError(f"{value!r:.40} is not a percentage like 10 or 10%")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r:.40} is not a percentage like 10 or 10%") from None
    if not 0 < number <= 1000:
        raise ValueError(f"{value!r:.40} must be above 0% and at most 1000%")
    return number


class Fairness(_Doc):
    """How evenly concurrent jobs are served: the CV of per-job bandwidth across them."""

    fairness: Literal["read_bandwidth", "write_bandwidth", "total_bandwidth"]
    maxCV: Annotated[_Percent, BeforeValidator(_percent)] = Field(
        description="Largest coefficient of variation of per-job bandwidth, in %")
    step: Glob = "*"


class MemoryBound(_Doc):
    """RAM the candidate settings may cost: stripe_cache_size x 4 KiB x member disks."""

    memory: Size = Field(gt=0)


def _constraint_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "fairness" if "fairness" in value else "memory" if "memory" in value else "metric"
    return "fairness" if isinstance(value, Fairness) else "memory" if isinstance(value, MemoryBound) \
        else "metric"


Constraint = Annotated[
    Annotated[MetricBound, Tag("metric")] | Annotated[Fairness, Tag("fairness")]
    | Annotated[MemoryBound, Tag("memory")],
    Discriminator(_constraint_kind),
]


class Repeats(_Doc):
    min: StrictInt = Field(default=2, ge=1, le=20, description="Runs of every point tried")
    max: StrictInt = Field(default=5, ge=1, le=50, description="Runs of the leading points at most")
    baseline: StrictInt = Field(default=3, ge=1, le=20, description=(
        "Runs of the current settings at the start and again at the end (with fewer than 3 the"
        " drift check has little power)"))
    confirm: StrictInt = Field(default=3, ge=1, le=20, description=(
        "Fresh runs of the winner that judge its gain (the search's runs chose it: they are biased)"))

    @model_validator(mode="after")
    def _ordered(self) -> Repeats:
        if self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self


class Budget(_Doc):
    trials: StrictInt = Field(default=100, ge=2, le=10_000,
                              description="Benchmark runs in all, failed ones and both baselines included")
    duration: Duration = Field(default=DURATION_DEFAULT, gt=0, le=DURATION_MAX, description=(
        "Wall time from taking a host to giving it back (default 6h, at most 31 days): the search"
        " stops in time for the closing runs, and a trial still running at the end is stopped"))


class ResultProfile(_Doc):
    """Where ``applyResult`` stores the recommended StorageProfile: never over a profile by
    accident, only over the version named here."""

    name: str | None = Field(default=None, description="The profile's name (default: the experiment's);"
                             " a profile of that name must not exist, unless replace is true",
                             json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 253})
    replace: StrictBool = Field(default=False, description=(
        "Replace the existing profile of that name; needs its resourceVersion"))
    resourceVersion: str | None = Field(default=None, description=(
        "The resourceVersion of the profile replaced (stortune get profile NAME -o yaml): a profile"
        " changed since is not overwritten"), json_schema_extra={"pattern": r"^[0-9]{1,18}$"})

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        if v is not None and not is_name(v):
            raise ValueError(f"{v[:80]!r} is not a valid name: lower-case letters, digits, '-' and '.',"
                             " starting and ending alphanumeric, at most 253 characters")
        return v

    @field_validator("resourceVersion")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not (v.isascii() and v.isdigit() and len(v) <= 18):
            raise ValueError(f"{v[:40]!r} is not a resourceVersion: the digits the server gave"
                             " the profile (metadata.resourceVersion)")
        return v

    @model_validator(mode="after")
    def _paired(self) -> ResultProfile:
        if self.replace and self.resourceVersion is None:
            raise ValueError("@resourceVersion is required with replace: true: the version of the profile"
                             " you mean to replace, so that a profile changed since is not overwritten")
        if self.resourceVersion is not None and not self.replace:
            raise ValueError("@replace a resourceVersion is given, but replace is not true: set"
                             " replace: true to replace that profile, or name another profile")
        return self


class ExperimentTarget(_Doc):
    device: Match = Field(description="The one device to tune, chosen like a profile rule's match")


class TuningSpec(_Doc):
    hostSelector: LabelSelector | None = Field(
        default=None, description="Hosts to run on (the control plane); optional for local runs")
    maxHosts: StrictInt = Field(default=1, ge=1, le=64)
    target: ExperimentTarget
    workloads: list[WorkloadItem] = Field(min_length=1, max_length=64)
    objective: Objective
    constraints: list[Constraint] = Field(default_factory=list, max_length=16)
    parameters: list[Parameter] = Field(min_length=1, max_length=MAX_PARAMETERS)
    strategy: Strategy = "one-at-a-time"
    repeats: Repeats = Field(default_factory=Repeats)
    budget: Budget = Field(default_factory=Budget)
    applyResult: StrictBool = Field(default=False, description="Leave the winner applied at the end")
    result: ResultProfile | None = Field(default=None, description=(
        "The name of the recommended profile, and whether applyResult may replace a profile of that name"))
    seed: StrictInt = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the bayesian search")

    @model_validator(mode="after")
    def _coherent(self, info: ValidationInfo) -> TuningSpec:
        seen: dict[str, int] = {}
        for i, p in enumerate(self.parameters):
            if p.key in seen:
                raise ValueError(f"@parameters[{i}].tunable {p.tunable} ({p.at}) is also"
                                 f" parameters[{seen[p.key]}]")
            seen[p.key] = i
            kinds = catalog.get(p.tunable).applies_to
            if p.at == "target" and self.target.device.kind and not kinds & set(self.target.device.kind):
                raise ValueError(
                    f"@parameters[{i}].tunable {p.tunable} applies to"
                    f" {sorted(k.value for k in kinds)}, none of target.device.kind"
                    f" {[k.value for k in self.target.device.kind]}")
        least = self.least_trials
        if self.budget.trials < least:
            raise ValueError(f"@budget.trials {self.budget.trials} leaves no room for a search: the baseline"
                             f" at both ends ({self.baseline_runs} runs each, repeats.baseline), one point"
                             f" ({self.repeats.min}, repeats.min) and its confirmation ({self.confirm_runs},"
                             f" repeats.confirm) take {least}")
        limit = (info.context or {}).get("max_grid", MAX_GRID)
        size = grid_size(self.parameters)
        if size > limit:
            counts = " x ".join(str(len(p.choices())) for p in self.parameters)
            raise ValueError(f"@parameters the grid holds {counts} = {size} points; at most {limit}:"
                             " fewer values or parameters")
        if self.result is not None and self.result.replace and not self.applyResult:
            raise ValueError("@result.replace replaces a profile only with applyResult: true")
        steps = self.bench_body(writes=True).steps(TargetFacts())
        trial_s = trial_seconds(steps)
        if trial_s * least > self.budget.duration:
            raise ValueError(
                f"@budget.duration {_hours(self.budget.duration)} cannot hold the {least} trials the least"
                f" search takes: one trial runs the workloads' runtime and rampTime, {_hours(trial_s)};"
                " shorten the workloads' runtime or give a longer budget.duration")
        names = [s.name for s in steps]
        writing = [s.name for s in steps if s.writes]
        if writing:
            raise ValueError(f"@workloads {', '.join(writing[:4])} write to the device, destroying its"
                             " contents: an experiment runs read workloads only")
        wanted: list[tuple[str, str, str]] = [("objective", self.objective.step, self.objective.metric)]
        wanted += [(f"constraints[{i}]", c.step, c.metric if isinstance(c, MetricBound) else c.fairness)
                   for i, c in enumerate(self.constraints) if isinstance(c, MetricBound | Fairness)]
        for path, glob, metric in wanted:
            named = [s for s in steps if glob_matches(glob, s.name)]
            if not named:
                raise ValueError(f"@{path}.step {glob!r} matches no step; steps are {', '.join(names)}")
            direction = metric.split("_", 1)[0]
            if not any(measures(s.pattern, direction) for s in named):
                raise ValueError(f"@{path} no step it names {direction}s, so {metric} would never be"
                                 " measured")
        for i, c in enumerate(self.constraints):
            named = [s for s in steps if isinstance(c, Fairness) and glob_matches(c.step, s.name)]
            if named and all(s.numjobs == 1 for s in named):
                raise ValueError(f"@constraints[{i}].fairness needs concurrent jobs, and every step it names"
                                 " runs one (numjobs)")
        return self

    def bench_body(self, *, per_job: bool = False, writes: bool = False) -> BenchmarkSpecBody:
        """The benchmark each trial runs (one repeat: repeats are the engine's); ``writes`` only
        to list the steps of a document still being checked."""
        workloads = [w.model_copy(update={"repeats": None, "perJob": per_job or w.perJob})
                     for w in self.workloads]
        return BenchmarkSpecBody(target=Target(device=self.target.device), workloads=workloads, repeats=1,
                                 allowDestructive=writes)

    @property
    def least_trials(self) -> int:
        """Trials of the shortest complete run: both baselines, one point, its confirmation."""
        return 2 * self.baseline_runs + self.repeats.min + self.confirm_runs

    def trial_seconds(self) -> float:
        """About how long one trial's benchmark runs (its steps' ramp and runtime)."""
        return trial_seconds(self.bench_body().steps(TargetFacts()))

    @property
    def result_name(self) -> str | None:
        """The recommended profile's name when the document gives one."""
        return None if self.result is None else self.result.name

    @property
    def baseline_runs(self) -> int:
        """Runs of the baseline at each end."""
        return self.repeats.baseline

    @property
    def confirm_runs(self) -> int:
        """Fresh runs of the winner that judge its gain."""
        return self.repeats.confirm

    @property
    def fairness(self) -> list[Fairness]:
        return [c for c in self.constraints if isinstance(c, Fairness)]

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.parameters]


def trial_seconds(steps: Sequence[WorkloadStep]) -> float:
    """Seconds the steps run, ramp included; a step bounded only by its size counts nothing (the
    deadline still bounds it)."""
    return sum((s.ramp_time + (s.runtime or 0.0)) * s.repeats for s in steps)


def _hours(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.4g}h"
    return f"{seconds / 60:.4g}m" if seconds >= 60 else f"{seconds:.4g}s"


def grid_size(parameters: Sequence[Parameter]) -> int:
    return math.prod(len(p.choices()) for p in parameters)


def grid(parameters: Sequence[Parameter]) -> list[dict[str, Value]]:
    """Every point, the first parameter varying slowest."""
    keys = [p.key for p in parameters]
    return [dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(p.choices() for p in parameters))]


class TuningExperiment(_Doc):
    apiVersion: Literal["stortune/v1"] = "stortune/v1"
    kind: Literal["TuningExperiment"] = "TuningExperiment"
    metadata: Metadata
    spec: TuningSpec
    status: SkipJsonSchema[dict[str, Any] | None] = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def result_name(self) -> str:
        """The name of the recommended StorageProfile: spec.result.name, or the experiment's."""
        return self.spec.result_name or self.metadata.name

    def document(self) -> dict[str, Any]:
        """Canonical JSON form; parses back to an equal experiment."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- reading -------------------------------------------------------------------------
_TAGS = ("preset", "workload", "metric", "fairness", "memory")


def _problems(exc: ValidationError, where: str) -> list[Problem]:
    """Field paths without pydantic's union tags, with a validator's ``@sub.path`` moved into the path."""
    out = []
    for problem in without_tags(validation_problems(exc, where), "workloads|constraints", _TAGS):
        out.append(Problem(problem.where, *with_subpath(problem.path, problem.message)))
    return out


def parse_experiment(data: Any, where: str = "document", *, max_grid: int = MAX_GRID) -> TuningExperiment:
    """A TuningExperiment from decoded YAML/JSON; ``DocumentError`` naming each field at fault."""
    data = check_header(data, where, KIND)
    try:
        return TuningExperiment.model_validate(data, context={"max_grid": max_grid})
    except ValidationError as exc:
        raise DocumentError(_problems(exc, labelled(data, where, KIND))) from None


def load_experiments(text: str, source: str = "<input>", *, max_grid: int = MAX_GRID
                     ) -> list[TuningExperiment]:
    """Every TuningExperiment of a multi-document YAML text; all problems reported at once."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise DocumentError([Problem(source, "", f"longer than {MAX_DOCUMENT_BYTES} bytes; an experiment"
                                                 " is a few kilobytes")])
    out: list[TuningExperiment] = []
    problems: list[Problem] = []
    for where, data in load_yaml_documents(text, source):
        try:
            out.append(parse_experiment(data, where, max_grid=max_grid))
        except DocumentError as exc:
            problems.extend(exc.problems)
    if not out and not problems:
        problems.append(Problem(source, "", f"holds no {KIND} document"))
    if problems:
        raise DocumentError(problems)
    return out


# -- at submission, against the chosen device ----------------------------------------
def check_against_device(exp: TuningExperiment, device: Device, beneath: Sequence[Device] = (),
                         where: str = "experiment") -> list[Problem]:
    """What the device (and those beneath it) cannot take: a tunable of another kind of device,
    an attribute this kernel lacks or will not write, a scheduler it does not offer, a value
    above a device bound; each named by its field (``spec.parameters[2].values[1]``)."""
    problems: list[Problem] = []
    for i, p in enumerate(exp.spec.parameters):
        tunable = catalog.get(p.tunable)
        here = f"spec.parameters[{i}]"
        if p.at == "beneath":
            if not beneath:
                problems.append(Problem(where, f"{here}.at", f"nothing lies beneath {device.name}:"
                                                             " set the tunable on the target (at: target)"))
                continue
            devices = [d for d in beneath if d.kind in tunable.applies_to]
            if not devices:
                kinds = sorted({d.kind.value for d in beneath})
                problems.append(Problem(where, f"{here}.tunable", f"{p.tunable} applies to none of the"
                                        f" devices beneath {device.name} ({', '.join(kinds)})"))
                continue
        else:
            devices = [device]
        for dev in devices:
            problems.extend(_check_values(p, dev, here, where))
    return problems


def _check_values(p: Parameter, dev: Device, here: str, where: str) -> list[Problem]:
    state = dev.tunables.get(p.tunable)
    facts = device_facts(dev, state)
    choices = p.choices()
    out: list[Problem] = []
    for j, value in enumerate(choices):
        rejected = catalog.check_on_device(catalog.get(p.tunable), value, facts)
        if rejected is None:
            continue
        path = f"{here}.values[{j}]" if p.values is not None else f"{here}.range"
        if not facts.supported or not facts.writable or dev.kind not in catalog.get(p.tunable).applies_to:
            path = f"{here}.tunable"  # the tunable itself, whatever the value
        out.append(Problem(where, path, f"{dev.name}: {rejected.reason}"))
        if path.endswith(".tunable"):
            break
    if state is not None and state.supported and state.value is None:
        out.append(Problem(where, f"{here}.tunable", f"{dev.name}: the current {p.tunable} could not be"
                                                     " read, so there is no baseline to compare with"))
    return out


def baseline_point(exp: TuningExperiment, device: Device, beneath: Sequence[Device] = ()) -> dict[str, Value]:
    """The values in effect now (the baseline), from discovery; ValueError naming what is missing
    or, beneath, differs between devices (the overlay would give them one value)."""
    point: dict[str, Value] = {}
    for p in exp.spec.parameters:
        tunable = catalog.get(p.tunable)
        devices = [d for d in beneath if d.kind in tunable.applies_to] if p.at == "beneath" else [device]
        seen = {d.name: s.value for d in devices
                if (s := d.tunables.get(p.tunable)) is not None and s.value is not None}
        if len(seen) != len(devices) or not seen:
            missing = [d.name for d in devices if d.name not in seen] or [device.name]
            raise ValueError(f"{p.key}: the current value on {', '.join(missing)} is unknown")
        if len(set(seen.values())) > 1:
            shown = ", ".join(f"{k}: {v}" for k, v in seen.items())
            raise ValueError(f"{p.key}: the devices beneath differ ({shown}); give them one value first")
        point[p.key] = next(iter(seen.values()))
    return point
