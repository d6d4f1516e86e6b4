"""Concrete workload steps: one fio invocation each, every parameter decided.

A BenchmarkSpec's workloads (presets or explicit) expand into steps with
``BenchmarkSpec.steps(facts)``; the fio job renderer, the agent's runner and
the results all speak in steps. Sizes are bytes, times seconds.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Pattern = Literal["read", "write", "randread", "randwrite", "randrw", "rw"]
IoEngine = Literal["libaio", "io_uring", "psync", "sync", "pvsync2", "posixaio"]

WRITING_PATTERNS: frozenset[str] = frozenset({"write", "randwrite", "randrw", "rw"})
SEQUENTIAL_PATTERNS: frozenset[str] = frozenset({"read", "write", "rw"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TargetFacts(_Model):
    """What preset expansion needs to know about the target, from the topology."""

    kind: Literal["device", "file"] = "device"
    #: Distinct drives beneath the target (md members, LVM PVs ...; a multipath
    #: LUN counts once). 1 for a plain disk, loop device or file on one.
    drives: int = Field(default=1, ge=1)
    rotational: bool | None = None
    size_bytes: int | None = Field(default=None, ge=0)


class SplitEntry(_Model):
    size: int = Field(gt=0, description="Block size in bytes")
    percent: int = Field(ge=0, le=100)


class WorkloadStep(_Model):
    name: str = Field(description="Unique in the run: workload name, then /phase parts")
    workload: str = Field(description="The spec workload this step comes from")
    preset: str | None = None
    phase: str | None = Field(default=None, description="write, rewrite, read, reread, randread...")
    pattern: Pattern
    rwmixread: int | None = Field(default=None, ge=0, le=100)
    block_size: int | None = Field(default=None, gt=0)
    block_size_split: list[SplitEntry] | None = None
    iodepth: int = Field(default=1, ge=1)
    numjobs: int = Field(default=1, ge=1)
    direct: bool = True
    ioengine: IoEngine = "libaio"
    #: Bytes per job (fio's meaning); None: the whole target, shared out between
    #: the jobs of a sequential step.
    size: int | None = Field(default=None, gt=0)
    runtime: float | None = Field(default=None, gt=0)
    #: With a runtime: run for it even when the size is done (loop over the region).
    time_based: bool = True
    ramp_time: float = Field(default=0, ge=0)
    repeats: int = Field(default=1, ge=1)
    #: Drop the target's cached pages before the step (fio invalidate=1).
    invalidate: bool = True
    #: Buffered writes: include flushing them in the measurement (iozone -e).
    end_fsync: bool = False
    #: A file target is removed before the step, so the write allocates anew.
    fresh_file: bool = False
    #: fio reports each job apart (no group_reporting), so fairness across jobs can be judged;
    #: the step's figures still add the jobs up.
    per_job: bool = False

    @property
    def writes(self) -> bool:
        return self.pattern in WRITING_PATTERNS

    @property
    def sequential(self) -> bool:
        return self.pattern in SEQUENTIAL_PATTERNS

    @property
    def threads(self) -> int:
        return self.numjobs

    def expected_seconds(self) -> float | None:
        """How long a time-based step takes (for progress); None when its size decides."""
        return self.runtime + self.ramp_time if self.runtime is not None and self.time_based else None
