"""The BenchmarkSpec document (apiVersion stortune/v1): what to run, where, and what passes.

A spec names one target (a device chosen with the same ``match`` as profile
rules, or a file on a mounted filesystem), one or more workloads (a preset by
name, or an explicit fio-like workload) and optional thresholds that turn the
measurements into a pass/fail verdict. Quantities are written the way people
write them (``1M``, ``30s``, ``386MB/s``, ``20ms``; see ``units``) and held in
canonical units, so ``document()`` round-trips through ``parse_benchmark``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
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
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from stortune.schemas import sizes, yamlsafe
from stortune.schemas.bench import metrics, presets, units
from stortune.schemas.bench.preset_names import PresetName
from stortune.schemas.bench.presets import Overrides
from stortune.schemas.bench.steps import (
    WRITING_PATTERNS,
    IoEngine,
    Pattern,
    SplitEntry,
    TargetFacts,
    WorkloadStep,
)
from stortune.schemas.documents import (
    DocumentError,
    Problem,
    check_header,
    labelled,
    validation_problems,
    without_tags,
)
from stortune.schemas.patterns import glob_matches
from stortune.schemas.profile import Glob, LabelSelector, Match, Metadata

KIND = "BenchmarkSpec"
_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
_NAME = re.compile(_NAME_PATTERN)
_TIME_TEXT = r"^\s*(\d+(\.\d+)?|\.\d+)\s*(ns|us|µs|ms|s|sec|m|min|h)?\s*$"
#: Direct I/O moves whole logical blocks; no device has blocks smaller than this.
SECTOR = 512
#: Device nodes and kernel trees are never a file target.
_SYSTEM_TREES = ("/dev", "/proc", "/sys")
#: Linux's PATH_MAX (without the NUL) and NAME_MAX, in bytes.
_PATH_MAX, _NAME_MAX = 4095, 255
#: The longest runtime (and ramp time) of one step, in seconds: a day. A step runs this long on
#: every repeat and, in an experiment, on every trial; longer is a typo, not a measurement.
RUNTIME_MAX = 86400.0

Size = Annotated[
    int,
    BeforeValidator(sizes.parse_size),
    WithJsonSchema(sizes.json_schema("Bytes, or with a unit (docs/profiles.md, Sizes): 4k = 4KiB = 4096,"
                                     " 4KB = 4000, 1M = 1MiB, 1GB = 10^9")),
]
Duration = Annotated[
    float,
    BeforeValidator(units.parse_duration),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0}, {"type": "string", "pattern": _TIME_TEXT}],
                    "description": "Seconds, or with a unit: 500ms, 30s, 2m, 1h"}),
]


def at_most(limit: float, span: str, what: str, examples: str) -> AfterValidator:
    """A Duration's upper bound, refused saying what it bounds and what to write instead."""
    def check(seconds: float) -> float:
        if seconds > limit:
            raise ValueError(f"{seconds:.10g}s is longer than {span} ({limit:g}s), the most {what}:"
                             f" give a shorter time ({examples})")
        return seconds
    return AfterValidator(check)


#: A step's runtime or ramp time: a Duration of at most RUNTIME_MAX.
StepTime = Annotated[Duration, at_most(RUNTIME_MAX, "a day", "one step may run", "30s, 10m, 2h")]
_Threshold = Annotated[
    float | None,
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string"}],
                    "description": "In the metric's unit: 386MB/s, 25k, 20ms, 35%; a bare number is"
                                   " bytes/s, IO/s, microseconds or percent"}),
]


_PER_JOB = ("Report each concurrent job's figures apart (fairness across jobs); the step's figures"
            " still add them up")


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _check_name(value: str, what: str) -> str:
    if not _NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be a DNS label (a-z, 0-9, '-', at most 63)")
    return value


class FileTarget(_Doc):
    path: str = Field(description="Absolute path of the file to create (or reuse) on a mounted filesystem")
    size: Size = Field(gt=0, description="How large the file is made")
    keep: StrictBool = Field(default=False, description="Keep the file after the run (default: remove"
                                                  " a file the run created)")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        shown = v if len(v) <= 160 else v[:160] + "..."
        if not v.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in v):
            raise ValueError(f"{shown!r} must be an absolute path without NUL or control characters")
        try:
            encoded = v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{shown!r} is not valid UTF-8 text") from None
        if len(encoded) > _PATH_MAX:
            raise ValueError(f"{shown!r} is longer than {_PATH_MAX} bytes")
        parts = v.split("/")[1:]
        if any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"{shown!r} must name a file plainly, without '.', '..' or empty components")
        if any(len(p.encode("utf-8")) > _NAME_MAX for p in parts):
            raise ValueError(f"{shown!r} has a component longer than {_NAME_MAX} bytes")
        if any(v == t or v.startswith(t + "/") for t in _SYSTEM_TREES):
            raise ValueError(f"{v!r} is under {', '.join(_SYSTEM_TREES)}; to benchmark a device,"
                             " use target.device with a match")
        return v


class Target(_Doc):
    device: Match | None = Field(default=None, description="The one device to benchmark, chosen like"
                                                           " a profile rule's match")
    file: FileTarget | None = None

    @model_validator(mode="after")
    def _one(self) -> Target:
        if (self.device is None) == (self.file is None):
            raise ValueError("give exactly one of device (a match) or file {path, size}")
        return self


def _split(value: object) -> object:
    """'4k/50:64k/50' (fio's bssplit) -> [{size, percent}, ...]; lists pass through."""
    if not isinstance(value, str):
        return value
    if len(value) > 1024:
        raise ValueError(f"a block size split is at most 1024 characters, got {len(value)}")
    out = []
    for part in value.split(":"):
        size, sep, pct = part.partition("/")
        if not sep:
            raise ValueError(f"{part!r} in {value!r} is not SIZE/PERCENT (4k/50:64k/50)")
        pct = pct.strip()
        if not (pct.isascii() and pct.isdigit() and len(pct) <= 3):
            raise ValueError(f"{part!r} in {value!r}: the percentage {pct!r} is not a whole number")
        out.append({"size": size, "percent": int(pct)})
    return out


class SplitItem(_Doc):
    size: Size = Field(gt=0)
    percent: StrictInt = Field(ge=0, le=100)


class Workload(_Doc):
    """An explicit workload; fio's option names in camelCase."""

    name: str = Field(json_schema_extra={"pattern": _NAME_PATTERN})
    pattern: Pattern
    rwmixread: StrictInt | None = Field(default=None, ge=0, le=100,
                                  description="Percent reads of rw/randrw (default 50)")
    blockSize: Size | None = Field(default=None, gt=0, description="Default 4k")
    blockSizeSplit: Annotated[list[SplitItem] | None, BeforeValidator(_split)] = Field(
        default=None, max_length=64, description="Block sizes with their share: 4k/50:64k/50 or a list")
    iodepth: StrictInt = Field(default=1, ge=1, le=65536)
    numjobs: StrictInt = Field(default=1, ge=1, le=1024)
    direct: StrictBool = Field(default=True, description="O_DIRECT; false for buffered I/O")
    ioengine: IoEngine | None = Field(default=None, description="Default libaio, psync when buffered")
    size: Size | None = Field(default=None, gt=0, description="Bytes per job; default the whole target")
    runtime: StepTime | None = Field(default=None, gt=0,
                                     description="Run this long (time based; at most a day)")
    rampTime: StepTime = Field(default=0.0, ge=0)
    repeats: StrictInt | None = Field(default=None, ge=1, le=100)
    perJob: StrictBool = Field(default=False, description=_PER_JOB)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _check_name(v, "workload name")

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
        if self.rwmixread is not None and self.pattern not in ("rw", "randrw"):
            raise ValueError(f"rwmixread applies to rw and randrw, not {self.pattern}")
        if self.blockSize is not None and self.blockSizeSplit is not None:
            raise ValueError("give blockSize or blockSizeSplit, not both")
        if self.blockSizeSplit is not None and sum(e.percent for e in self.blockSizeSplit) != 100:
            raise ValueError("blockSizeSplit percentages must add up to 100")
        if self.iodepth > 1 and self.ioengine in ("psync", "sync", "pvsync2"):
            raise ValueError(f"iodepth {self.iodepth} needs an asynchronous ioengine"
                             f" (libaio, io_uring); {self.ioengine} has one I/O in flight")
        if self.direct:
            sizes = [("blockSize", self.blockSize)] + [
                (f"blockSizeSplit[{i}].size", e.size) for i, e in enumerate(self.blockSizeSplit or [])]
            for field, size in sizes:
                if size is not None and size % SECTOR:
                    raise ValueError(
                        f"{field} is {size} bytes, not a multiple of {SECTOR}: direct I/O moves whole"
                        f" sectors (KB is 1000 bytes, KiB and a bare k 1024: 4KiB or 4k is {4 * 1024})")
        return self

    def step(self, repeats: int) -> WorkloadStep:
        mixed = self.pattern in ("rw", "randrw")
        split = ([SplitEntry(size=e.size, percent=e.percent) for e in self.blockSizeSplit]
                 if self.blockSizeSplit else None)
        return WorkloadStep(
            name=self.name, workload=self.name, phase=self.pattern, pattern=self.pattern,
            rwmixread=(50 if self.rwmixread is None else self.rwmixread) if mixed else None,
            block_size=None if split else (self.blockSize or 4096), block_size_split=split,
            iodepth=self.iodepth, numjobs=self.numjobs, direct=self.direct,
            ioengine=self.ioengine or ("libaio" if self.direct else "psync"), size=self.size,
            runtime=self.runtime, time_based=self.runtime is not None, ramp_time=self.rampTime,
            repeats=self.repeats or repeats,
            end_fsync=self.pattern in WRITING_PATTERNS and not self.direct, per_job=self.perJob,
        )


class PresetRef(_Doc):
    """A preset by name, with what this spec changes about it."""

    preset: PresetName = Field(description="; ".join(f"{k}: {v}" for k, v in presets.DESCRIPTIONS.items()))
    name: str | None = Field(default=None, description="Step-name prefix (default: the preset's name)",
                             json_schema_extra={"pattern": _NAME_PATTERN})
    size: Size | None = Field(default=None, gt=0, description="Bytes per job")
    runtime: StepTime | None = Field(default=None, gt=0)
    rampTime: StepTime | None = Field(default=None, ge=0)
    direct: StrictBool | None = None
    repeats: StrictInt | None = Field(default=None, ge=1, le=100)
    perJob: StrictBool = Field(default=False, description=_PER_JOB)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else _check_name(v, "workload name")

    @property
    def label(self) -> str:
        return self.name or self.preset

    def steps(self, facts: TargetFacts, repeats: int) -> list[WorkloadStep]:
        ov = Overrides(size=self.size, runtime=self.runtime, ramp_time=self.rampTime,
                       direct=self.direct, repeats=self.repeats or repeats)
        steps = presets.expand(self.preset, self.label, ov, facts)
        return [s.model_copy(update={"per_job": True}) for s in steps] if self.perJob else steps


def _workload_kind(value: Any) -> str:
    if isinstance(value, PresetRef) or (isinstance(value, dict) and "preset" in value):
        return "preset"
    return "workload"


WorkloadItem = Annotated[
    Annotated[PresetRef, Tag("preset")] | Annotated[Workload, Tag("workload")],
    Discriminator(_workload_kind),
]


class Threshold(_Doc):
    """A bound on one metric's mean over the repeats of the steps named by ``step``."""

    metric: str = Field(json_schema_extra={"enum": list(metrics.METRICS)})
    step: Glob = Field(default="*", description="Glob over step names: seq-1m/read, iozone-seq/t10/*")
    min: _Threshold = None
    max: _Threshold = None

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        metrics.get(v)
        return v

    @field_validator("min", "max", mode="before")
    @classmethod
    def _value(cls, v: object, info: ValidationInfo) -> float | None:
        if v is None:
            return None
        name = info.data.get("metric")
        if name is None:
            raise ValueError("cannot read the bound without a valid metric")
        # Twelve digits: the unit conversion's last bit would not survive document() and back.
        return float(f"{metrics.get(name).parse(v):.12g}")

    @model_validator(mode="after")
    def _bounded(self) -> Threshold:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError("min is larger than max")
        return self

    def describe(self) -> str:
        metric = metrics.get(self.metric)
        bounds = [f">= {metric.human(self.min)}" if self.min is not None else "",
                  f"<= {metric.human(self.max)}" if self.max is not None else ""]
        return f"{self.metric} {' and '.join(b for b in bounds if b)} ({self.step})"


class BenchmarkSpecBody(_Doc):
    hostSelector: LabelSelector | None = Field(
        default=None, description="Hosts to run on (used by the control plane)")
    target: Target
    allowDestructive: StrictBool = Field(
        default=False, description="Allow write workloads on a raw device, destroying its contents")
    workloads: list[WorkloadItem] = Field(min_length=1, max_length=64)
    repeats: StrictInt = Field(default=1, ge=1, le=100, description="Runs of each step (for mean and spread)")
    thresholds: list[Threshold] = Field(default_factory=list, max_length=256)

    def steps(self, facts: TargetFacts) -> list[WorkloadStep]:
        """Every step of every workload, in the order written."""
        out: list[WorkloadStep] = []
        for item in self.workloads:
            if isinstance(item, PresetRef):
                out.extend(item.steps(facts, self.repeats))
            else:
                out.append(item.step(self.repeats))
        return out

    @model_validator(mode="after")
    def _coherent(self) -> BenchmarkSpecBody:
        steps = self.steps(TargetFacts())
        seen: set[str] = set()
        for step in steps:
            if step.name in seen:
                raise ValueError(f"step {step.name!r} appears twice: give repeated presets"
                                 " distinct names (name: ...)")
            seen.add(step.name)
        for index, threshold in enumerate(self.thresholds):
            if not any(glob_matches(threshold.step, s.name) for s in steps):
                raise ValueError(f"thresholds[{index}].step {threshold.step!r} matches no step;"
                                 f" steps are {', '.join(sorted(seen))}")
        if self.target.device is not None and not self.allowDestructive:
            writing = [s.name for s in steps if s.writes]
            if writing:
                raise ValueError(
                    f"allowDestructive is not true, but {', '.join(writing[:4])}"
                    f"{' ...' if len(writing) > 4 else ''} write to the raw device, destroying"
                    " its contents: set allowDestructive: true, or benchmark a file target")
        return self


class BenchmarkSpec(_Doc):
    apiVersion: Literal["stortune/v1"] = "stortune/v1"
    kind: Literal["BenchmarkSpec"] = "BenchmarkSpec"
    metadata: Metadata
    spec: BenchmarkSpecBody
    status: SkipJsonSchema[dict[str, Any] | None] = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def steps(self, facts: TargetFacts) -> list[WorkloadStep]:
        return self.spec.steps(facts)

    def document(self) -> dict[str, Any]:
        """Canonical JSON form (quantities in canonical units); parses back to an equal spec."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# -- reading -------------------------------------------------------------------------
_TAGS = ("preset", "workload")


def parse_benchmark(data: Any, where: str = "document") -> BenchmarkSpec:
    data = check_header(data, where, KIND)
    try:
        return BenchmarkSpec.model_validate(data)
    except ValidationError as exc:
        found = validation_problems(exc, labelled(data, where, KIND))
        raise DocumentError(without_tags(found, "workloads", _TAGS)) from None


def load_benchmark(text: str, source: str = "<input>") -> BenchmarkSpec:
    """The one BenchmarkSpec in a YAML (or JSON) text."""
    try:
        docs = [d for d in yamlsafe.load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise DocumentError([Problem(source, "", f"not valid YAML: {exc}")]) from None
    if len(docs) != 1:
        raise DocumentError([Problem(source, "", f"expected one {KIND} document, found {len(docs)}")])
    return parse_benchmark(docs[0], source)
