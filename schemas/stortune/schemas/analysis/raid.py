"""RAID planning: what a set of disks gives at each RAID level, and what an existing md array can do.

Pure arithmetic over per-disk figures, the textbook model the field plans with:

* random IOPS = N x per-disk IOPS / (read share + write share x write penalty), the penalty
  being the disk operations one random host write costs: RAID0 1, a mirror 2 (an n-way mirror
  n), RAID5/50 4 (read data and parity, write both), RAID6/60 6;
* sequential MB/s from the data disks (full-stripe writes: parity costs a disk, not a penalty);
* a rebuild reads or writes each member's component at md's sync rate: at most
  ``dev.raid.speed_limit_max`` (idle array) and at least down to ``speed_limit_min`` (busy
  array), never faster than the disk streams;
* the chance that a single-redundancy rebuild meets an unrecoverable read error:
  P = 1 - (1 - 1/URE)^(bits read).

Every figure is an estimate from the inputs: measured per-disk figures give a better one than
a device class.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Final, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel

from stortune.schemas import sizes
from stortune.schemas.analysis.diskclass import CLASSES, URE_DESKTOP, URE_SSD, DiskClassName, disk_class
from stortune.schemas.analysis.model import ExistingArray, LevelPlan, MeasuredCeiling
from stortune.schemas.topology import Device, DeviceKind, Topology

RaidLevel = Literal["raid0", "raid1", "raid10", "raid5", "raid6", "raid50", "raid60"]
LEVELS: Final[tuple[RaidLevel, ...]] = ("raid0", "raid1", "raid10", "raid5", "raid6", "raid50", "raid60")
DEFAULT_LEVELS: Final[tuple[RaidLevel, ...]] = ("raid10", "raid5", "raid6")

#: Bounds that no real array reaches and that keep the search for "disks needed" cheap.
MAX_DISKS: Final = 1024
MAX_DISK_IOPS: Final = 100_000_000.0
MAX_DISK_MBPS: Final = 1_000_000.0
#: md's defaults (sysctl dev.raid.speed_limit_min / _max), KiB/s.
SPEED_LIMIT_MIN_KIB: Final = 1_000
SPEED_LIMIT_MAX_KIB: Final = 200_000
MAX_SPEED_KIB: Final = 2_000_000_000
#: Wider RAID5 groups than this: long rebuilds and a high chance of a second failure (HP's rule).
RAID5_MAX_WIDTH: Final = 8
#: A rebuild whose unrecoverable-read-error risk is at least this is warned about.
URE_RISK_WARNING: Final = 0.05
_MB: Final = 1_000_000

_PENALTY: Final[Mapping[str, int]] = {"raid0": 1, "raid1": 2, "raid10": 2, "raid5": 4, "raid6": 6,
                                      "raid50": 4, "raid60": 6}
_PARITY: Final[Mapping[str, int]] = {"raid5": 1, "raid50": 1, "raid6": 2, "raid60": 2}
#: Fewest disks (per group for 50/60) a level is built from.
_MIN_DISKS: Final[Mapping[str, int]] = {"raid0": 2, "raid1": 2, "raid10": 2, "raid5": 3, "raid6": 4,
                                        "raid50": 3, "raid60": 4}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True,
                              serialize_by_alias=True)


def _level(value: object) -> object:
    """'raid10', 'RAID10' and '10' all name RAID10."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str):
        text = value.strip().lower()
        return text if text.startswith("raid") else f"raid{text}"
    return value


Level = Annotated[RaidLevel, BeforeValidator(_level)]
Size = Annotated[int, BeforeValidator(sizes.parse_size),
                 WithJsonSchema(sizes.json_schema("Bytes, or a size text: 4TB, 1.8TiB, 600GB"))]


class Disks(_Model):
    """The disks the array is built from; each given figure overrides the class's."""

    count: int = Field(ge=1, le=MAX_DISKS, strict=True)
    disk_class: DiskClassName | None = Field(default=None, alias="class",
                                         description="Datasheet figures when a figure is not given")
    iops: float | None = Field(default=None, gt=0, le=MAX_DISK_IOPS, description="Random IOPS per disk")
    mbps: float | None = Field(default=None, gt=0, le=MAX_DISK_MBPS,
                               description="Sequential MB/s per disk (10^6 bytes)")
    size_bytes: Size | None = Field(default=None, gt=0, description="Capacity per disk")
    ure_bits: float | None = Field(default=None, ge=1e10, le=1e20,
                                   description="Bits read per unrecoverable read error (1e14 desktop,"
                                               " 1e15 enterprise); default from the class")

    @model_validator(mode="after")
    def _iops_known(self) -> Disks:
        if self.iops is None and self.disk_class is None:
            raise ValueError("give iops (measured random IOPS per disk) or class (datasheet figures)")
        return self

    @property
    def random_iops(self) -> float:
        if self.iops is not None:
            return self.iops
        assert self.disk_class is not None  # (the validator wants one of the two)
        return CLASSES[self.disk_class].iops

    @property
    def sequential_mbps(self) -> float | None:
        if self.mbps is not None:
            return self.mbps
        return CLASSES[self.disk_class].bytes_per_second / _MB if self.disk_class is not None else None

    @property
    def ure(self) -> float:
        if self.ure_bits is not None:
            return self.ure_bits
        if self.disk_class is not None:
            return CLASSES[self.disk_class].ure_bits
        # No class: a disk of spinning-disk IOPS is taken as a desktop one (the careful guess).
        return URE_DESKTOP if self.random_iops < 1000 else URE_SSD


class Workload(_Model):
    read_pct: float = Field(default=70.0, ge=0, le=100, description="Share of reads, percent")
    pattern: Literal["random", "sequential"] = "random"
    block_size: Size = Field(default=4096, ge=512, le=64 * 2**20, description="Bytes per I/O")

    @property
    def read_share(self) -> float:
        return self.read_pct / 100


class Requirements(_Model):
    iops: float | None = Field(default=None, gt=0, le=1e12)
    mbps: float | None = Field(default=None, gt=0, le=1e9, description="MB/s (10^6 bytes)")
    capacity_bytes: Size | None = Field(default=None, gt=0)


class RaidPlanRequest(_Model):
    """The inputs of ``POST /api/v1/raid-plans`` and ``stortune plan raid``."""

    disks: Disks
    levels: list[Level] = Field(default_factory=lambda: list(DEFAULT_LEVELS), min_length=1,
                                max_length=len(LEVELS))
    workload: Workload = Field(default_factory=Workload)
    requirements: Requirements = Field(default_factory=Requirements)
    groups: int | None = Field(default=None, ge=2, le=MAX_DISKS // 3, strict=True,
                               description="RAID50/60: the number of RAID5/6 groups striped together"
                                           " (default: the fewest that keep a group at 8 disks or less)")
    speed_limit_min_kib: int = Field(default=SPEED_LIMIT_MIN_KIB, ge=1, le=MAX_SPEED_KIB,
                                     description="dev.raid.speed_limit_min: the rebuild rate under load")
    speed_limit_max_kib: int = Field(default=SPEED_LIMIT_MAX_KIB, ge=1, le=MAX_SPEED_KIB,
                                     description="dev.raid.speed_limit_max: the rebuild rate when idle")

    @model_validator(mode="after")
    def _consistent(self) -> RaidPlanRequest:
        if len(set(self.levels)) != len(self.levels):
            raise ValueError("levels: each level at most once")
        if self.speed_limit_min_kib > self.speed_limit_max_kib:
            raise ValueError(f"speedLimitMinKib {self.speed_limit_min_kib} is above speedLimitMaxKib "
                             f"{self.speed_limit_max_kib}")
        return self


class RaidPlan(_Model):
    request: RaidPlanRequest
    levels: list[LevelPlan]


# -- the model ----------------------------------------------------------------------------------


def _default_groups(level: str, n: int) -> int | None:
    """RAID50/60: the fewest groups (at least 2) dividing n with groups of at most 8 disks, else
    the fewest that divide n at all; None when n cannot be split."""
    least = _MIN_DISKS[level]
    fits = [g for g in range(2, n // least + 1) if n % g == 0]
    narrow = [g for g in fits if n // g <= RAID5_MAX_WIDTH]
    found = narrow or fits
    return found[0] if found else None


def _geometry(level: str, n: int, groups: int | None) -> tuple[int | None, str | None]:
    """(groups, why not possible)."""
    if level in ("raid50", "raid60"):
        g = groups if groups is not None else _default_groups(level, n)
        least = _MIN_DISKS[level]
        if g is None or n % g or n // g < least:
            how = f"{g} groups" if groups is not None else "at least 2 groups"
            return g, (f"{level} needs {how} of at least {least} disks each, the disks split evenly;"
                       f" {n} disks do not")
        return g, None
    if n < _MIN_DISKS[level]:
        return None, f"{level} needs at least {_MIN_DISKS[level]} disks, got {n}"
    return None, None


def _penalty(level: str, n: int) -> int:
    # An n-way mirror writes every disk: its penalty is n (2 for the usual pair).
    return n if level == "raid1" else _PENALTY[level]


def _random_iops(level: str, n: int, iops: float, read: float) -> float:
    return n * iops / (read + (1 - read) * _penalty(level, n))


def _data_disks(level: str, n: int, g: int) -> float:
    if level == "raid1":
        return 1
    if level == "raid10":
        return n / 2
    return n - g * _PARITY.get(level, 0)


def _degraded_group_iops(level: str, n: int, iops: float, read: float) -> float:
    """One disk of an n-disk array (or group) lost: its reads are served by the others."""
    if level in ("raid1", "raid10"):
        # The lost disk's mirror serves its reads alone; one disk fewer for everything.
        return _random_iops(level, n - 1, iops, read) if level == "raid10" else (
            (n - 1) * iops / (read + (1 - read) * max(n - 1, 1)))
    # Parity: a read of the lost disk's data (1 in n) reads the n-1 others to rebuild it.
    read_cost = (n - 1) / n + (n - 1) / n
    return (n - 1) * iops / (read * read_cost + (1 - read) * _PENALTY[level])


def _ure_risk(bits: float, ure: float) -> float:
    return -math.expm1(bits * math.log1p(-1 / ure))


def _harmonic(read: float, r: float, w: float) -> float:
    return 1 / (read / r + (1 - read) / w) if read < 1 else r


def level_plan(request: RaidPlanRequest, level: RaidLevel, n: int | None = None) -> LevelPlan:
    """The figures of one level with ``n`` disks (default: the request's count)."""
    disks = request.disks
    n = disks.count if n is None else n
    read = request.workload.read_share
    groups, impossible = _geometry(level, n, request.groups)
    estimate = disks.iops is None or (disks.mbps is None and disks.disk_class is not None)
    tolerance = {"raid0": 0, "raid1": n - 1, "raid10": 1, "raid5": 1, "raid50": 1, "raid6": 2,
                 "raid60": 2}[level]
    out = LevelPlan(level=level, disks=n, groups=groups, write_penalty=_penalty(level, n),
                    fault_tolerance=tolerance, estimate=estimate)
    if impossible is not None:
        out.possible = False
        out.warnings.append(impossible)
        return out
    g = groups or 1
    iops = disks.random_iops
    out.random_iops = _random_iops(level, n, iops, read)
    out.random_mbps = out.random_iops * request.workload.block_size / _MB
    data = _data_disks(level, n, g)
    size = disks.size_bytes
    if size is not None:
        out.usable_bytes = int(data * size) if level != "raid10" else n * size // 2
    mbps = disks.sequential_mbps
    if mbps is not None:
        # Reads stream from every disk holding data (a mirror's copies serve reads side by side);
        # writes stream to the data disks, a mirror writing each block twice.
        reads = n * mbps if level in ("raid0", "raid1", "raid10") else data * mbps
        writes = data * mbps
        out.sequential_read_mbps, out.sequential_write_mbps = reads, writes
        out.sequential_mbps = _harmonic(read, reads, writes)
    _rebuild(request, level, n, g, out)
    _warn(request, level, n, g, out)
    return out


def _rebuild(request: RaidPlanRequest, level: str, n: int, g: int, out: LevelPlan) -> None:
    if level == "raid0":
        return  # nothing to rebuild from: the array is lost
    disks = request.disks
    read = request.workload.read_share
    width = n // g
    group = _degraded_group_iops(level if level not in ("raid50", "raid60") else level[:5], width,
                                 disks.random_iops, read)
    # Random I/O spreads evenly over the groups: the degraded group limits the whole array.
    out.degraded_random_iops = group * g if level in ("raid50", "raid60") else group
    mbps = disks.sequential_mbps
    disk_rate = mbps * _MB if mbps is not None else math.inf
    idle = min(request.speed_limit_max_kib * 1024, disk_rate)
    busy = min(request.speed_limit_min_kib * 1024, disk_rate)
    if mbps is not None:
        # The rebuild takes that share of each disk's time away from the workload.
        out.rebuilding_random_iops = out.degraded_random_iops * max(0.0, 1 - busy / disk_rate)
    size = disks.size_bytes
    if size is None:
        return
    out.rebuild_seconds_idle = size / idle
    out.rebuild_seconds_busy = size / busy
    if _PARITY.get(level) == 1 or level in ("raid10",) or (level == "raid1" and n == 2):
        # The rebuild reads every surviving disk of the group (a mirror: the one copy) in full,
        # with no redundancy left to correct a read error.
        sources = 1 if level in ("raid1", "raid10") else width - 1
        out.rebuild_ure_risk = _ure_risk(sources * size * 8, disks.ure)


def human_bytes(value: int) -> str:
    """Decimal units, as disks are sold: 600000000000 -> '600.0 GB'."""
    for unit, scale in (("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if value >= scale:
            return f"{value / scale:,.1f} {unit}"
    return f"{value} B"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def _warn(request: RaidPlanRequest, level: str, n: int, g: int, out: LevelPlan) -> None:
    width = n // g
    if level in ("raid5", "raid50") and width > RAID5_MAX_WIDTH:
        what = "a RAID5 of" if level == "raid5" else "RAID5 groups of"
        out.warnings.append(
            f"{what} {width} disks: more than {RAID5_MAX_WIDTH} lengthens the rebuild and raises the"
            " chance of a second failure during it; prefer RAID6, or RAID50 with narrower groups")
    risk = out.rebuild_ure_risk
    if level in ("raid5", "raid50") and risk is not None and risk >= URE_RISK_WARNING:
        idle = out.rebuild_seconds_idle or 0.0
        out.warnings.append(
            f"a rebuild reads {width - 1} disks of {human_bytes(request.disks.size_bytes or 0)}"
            f" in full: {risk:.0%} chance of an unrecoverable read error (1 per"
            f" {request.disks.ure:.0e} bits) with no parity left to correct it, over at least"
            f" {_hours(idle)}; prefer RAID6 or RAID10 on disks this large")
    if level == "raid0":
        out.warnings.append("no redundancy: one failed disk loses the array")


def _meets(request: RaidPlanRequest, out: LevelPlan) -> bool | None:
    req = request.requirements
    checks: list[bool] = []
    if req.iops is not None:
        checks.append(out.random_iops is not None and out.random_iops >= req.iops)
    if req.mbps is not None:
        got = out.sequential_mbps if request.workload.pattern == "sequential" else out.random_mbps
        checks.append(got is not None and got >= req.mbps)
    if req.capacity_bytes is not None:
        checks.append(out.usable_bytes is not None and out.usable_bytes >= req.capacity_bytes)
    return all(checks) if checks else None


def _disks_needed(request: RaidPlanRequest, level: RaidLevel) -> int | None:
    # Every figure grows with the disks: if the widest array allowed falls short, so do all.
    widest = next((p for n in range(MAX_DISKS, MAX_DISKS - 64, -1)
                   if (p := level_plan(request, level, n)).possible), None)
    if widest is None or not _meets(request, widest):
        return None
    for n in range(1, MAX_DISKS + 1):
        candidate = level_plan(request, level, n)
        if candidate.possible and _meets(request, candidate):
            return n
    return None


def plan_raid(request: RaidPlanRequest) -> RaidPlan:
    """Every requested level with the request's disks, and how many disks would meet the
    requirements."""
    levels: list[LevelPlan] = []
    wanted = request.requirements.model_dump(exclude_none=True)
    for level in request.levels:
        out = level_plan(request, level)
        if wanted and out.possible:
            out.meets_requirements = _meets(request, out)
            out.disks_needed = _disks_needed(request, level)
            if out.disks_needed is None:
                out.warnings.append(f"no {level} of up to {MAX_DISKS} such disks meets the requirements")
        levels.append(out)
    return RaidPlan(request=request, levels=levels)


# -- an existing array ---------------------------------------------------------------------------


def _whole_disk(by_name: Mapping[str, Device], name: str) -> Device | None:
    dev = by_name.get(name)
    if dev is not None and dev.kind is DeviceKind.PARTITION and dev.parent:
        return by_name.get(dev.parent)
    return dev


def existing_array(topology: Topology, md_name: str,
                   measured: Mapping[str, MeasuredCeiling] | None = None,
                   workload: Workload | None = None, *,
                   by_name: Mapping[str, Device] | None = None) -> ExistingArray:
    """What md array ``md_name`` can do: the slowest member's figures (a stripe waits for it),
    measured where a probe measured them (by member or by its whole disk), else its class.
    ``by_name``: the topology's devices by name, when the caller has them (a host's arrays)."""
    by_name = by_name if by_name is not None else {d.name: d for d in topology.devices}
    md = by_name.get(md_name)
    if md is None or md.md is None:
        raise ValueError(f"{md_name!r} is not an md array of this host")
    info = md.md
    members = [m.device for m in info.members]
    measured = measured or {}
    iops: list[float] = []
    mbps: list[float] = []
    sources: set[str] = set()
    classes: list[DiskClassName] = []
    for member in members:
        disk = _whole_disk(by_name, member)
        probe = measured.get(member) or (measured.get(disk.name) if disk is not None else None)
        cls = disk_class(disk) if disk is not None else None
        if cls is not None:
            classes.append(cls.key)
        if probe is not None and probe.read_iops:
            iops.append(probe.read_iops)
            sources.add("measured")
        elif cls is not None:
            iops.append(cls.iops)
            sources.add(f"class {cls.key}")
        if probe is not None and probe.read_bytes_per_second:
            mbps.append(probe.read_bytes_per_second / _MB)
        elif cls is not None:
            mbps.append(cls.bytes_per_second / _MB)
    raw_level = (info.level or "").lower()
    n = info.raid_disks or len(members)
    per_iops = min(iops) if iops and len(iops) == len(members) else None
    per_mbps = min(mbps) if mbps and len(mbps) == len(members) else None
    out = ExistingArray(array=md_name, level=raw_level or "unknown", members=members,
                        per_disk_iops=per_iops, per_disk_mbps=per_mbps,
                        per_disk_source=", ".join(sorted(sources)) or "unknown", plan=None)
    if raw_level not in LEVELS or per_iops is None or n < 1 or n > MAX_DISKS:
        return out
    size = info.component_bytes or _member_size(by_name, members)
    request = RaidPlanRequest(
        disks=Disks(count=n, iops=per_iops, mbps=per_mbps, size_bytes=size or None,
                    disk_class=classes[0] if classes and len(set(classes)) == 1 else None),
        levels=[raw_level], workload=workload or Workload(),
        speed_limit_min_kib=min(info.sync_speed_min_kib or SPEED_LIMIT_MIN_KIB,
                                info.sync_speed_max_kib or SPEED_LIMIT_MAX_KIB),
        speed_limit_max_kib=info.sync_speed_max_kib or SPEED_LIMIT_MAX_KIB)
    plan = level_plan(request, request.levels[0])
    plan.estimate = "measured" not in sources or len(sources) > 1
    if info.degraded:
        plan.warnings.append(f"{md_name} is degraded ({info.degraded} member(s) missing): it runs at"
                             " its degraded figures until rebuilt")
    out.plan = plan
    return out


def _member_size(by_name: Mapping[str, Device], members: list[str]) -> int | None:
    found = [d.size_bytes for m in members if (d := by_name.get(m)) is not None and d.size_bytes]
    return min(found) if found else None
