"""A probe's document: the ceilings it measured and how throughput scaled with members.

The agent writes it, the control plane stores it, the CLI shows it; the analysis takes
its ``ceilings`` as measured ceilings. camelCase JSON like the other analysis documents.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from stortune.schemas.analysis.model import ID_MAX, MeasuredCeiling
from stortune.schemas.topology import DEVICE_NAME_MAX, MAX_DEVICES, TEXT_MAX

ProbeState = Literal["queued", "running", "done", "failed", "cancelled"]
PROBE_STATES: Final = ("queued", "running", "done", "failed", "cancelled")
#: Adding members stopped scaling when the next count adds less than this share of throughput.
SCALING_GAIN: Final = 0.10
#: Bounds on what a probe may be asked for: it loads production disks, so it stays short.
MAX_STEP_SECONDS: Final = 60.0


#: 1, 2, 4 ... MAX_DEVICES: the points of one scaling curve.
MAX_SCALING_POINTS: Final = MAX_DEVICES.bit_length() + 1
#: Each member alone, then the set of all at once.
MAX_CEILINGS: Final = MAX_DEVICES + 1

# An agent answers with these documents: every list and string is bounded so the control
# plane refuses junk (naming the field) instead of storing it.
_Name = Annotated[str, Field(min_length=1, max_length=DEVICE_NAME_MAX)]
_Rate = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              serialize_by_alias=True)


class ScalingPoint(_Model):
    """``count`` members read sequentially at once, and what they delivered together."""

    count: int = Field(ge=1, le=MAX_DEVICES)
    devices: list[_Name] = Field(max_length=MAX_DEVICES)
    read_bytes_per_second: _Rate
    gain: float | None = Field(default=None, allow_inf_nan=False,
                               description="Throughput / the previous point's - 1")


class ProbeResult(_Model):
    probe_id: str = Field(min_length=1, max_length=ID_MAX)
    state: ProbeState
    device: _Name | None = Field(default=None, description="The device asked for (None: every disk)")
    members: list[_Name] = Field(default_factory=list, max_length=MAX_DEVICES,
                                 description="The bottom devices read: md members' disks, paths, the device")
    step_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    ceilings: list[MeasuredCeiling] = Field(
        default_factory=list, max_length=MAX_CEILINGS,
        description="Each member alone (sequential MB/s, random IOPS), then"
                    " the set of all members read at once")
    scaling: list[ScalingPoint] = Field(default_factory=list, max_length=MAX_SCALING_POINTS)
    scaling_stops_at: int | None = Field(
        default=None, ge=1, le=MAX_DEVICES,
        description="The member count from which adding members added less than"
                    " 10 % throughput (None: it kept scaling, or one member)")
    message: str = Field(default="", max_length=TEXT_MAX)
    created_at: float | None = Field(default=None, allow_inf_nan=False)
    finished_at: float | None = Field(default=None, allow_inf_nan=False)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed", "cancelled")


def scaling_counts(members: int) -> list[int]:
    """1, 2, 4 ... and ``members`` itself."""
    counts: list[int] = []
    n = 1
    while n < members:
        counts.append(n)
        n *= 2
    if members > 0:
        counts.append(members)
    return counts


def with_gains(points: list[ScalingPoint]) -> tuple[list[ScalingPoint], int | None]:
    """Each point's gain over the previous one, and the count where scaling stopped:
    the first count whose gain was below ``SCALING_GAIN`` (its predecessor is the knee)."""
    out: list[ScalingPoint] = []
    stops: int | None = None
    for i, point in enumerate(points):
        gain = None
        if i and out[i - 1].read_bytes_per_second > 0:
            gain = point.read_bytes_per_second / out[i - 1].read_bytes_per_second - 1
            if stops is None and gain < SCALING_GAIN:
                stops = point.count
        out.append(point.model_copy(update={"gain": gain}))
    return out, stops
