"""RAID planning: the known answers of the issue, hostile inputs first, then the model's shape."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from stortune.schemas.analysis.diskclass import CLASSES, DiskClassName
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.raid import (
    LEVELS,
    Disks,
    RaidPlanRequest,
    existing_array,
    level_plan,
    plan_raid,
)
from stortune.schemas.topology import Device, DeviceKind, MdInfo, MdMember, Topology


def request(**body: Any) -> RaidPlanRequest:
    return RaidPlanRequest.model_validate(body)


def by_level(req: RaidPlanRequest) -> dict[str, Any]:
    return {p.level: p for p in plan_raid(req).levels}


# -- hostile -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("body", "field"), [
    ({"disks": {"count": 0, "iops": 180}}, "disks.count"),
    ({"disks": {"count": 1025, "iops": 180}}, "disks.count"),
    ({"disks": {"count": 10**30, "iops": 180}}, "disks.count"),
    ({"disks": {"count": True, "iops": 180}}, "disks.count"),
    ({"disks": {"count": 4, "iops": -1}}, "disks.iops"),
    ({"disks": {"count": 4, "iops": float("nan")}}, "disks.iops"),
    ({"disks": {"count": 4, "iops": float("inf")}}, "disks.iops"),
    ({"disks": {"count": 4, "iops": 180, "mbps": 0}}, "disks.mbps"),
    ({"disks": {"count": 4, "iops": 180, "sizeBytes": "1.3k"}}, "disks.sizeBytes"),
    ({"disks": {"count": 4, "iops": 180, "sizeBytes": "-1TB"}}, "disks.sizeBytes"),
    ({"disks": {"count": 4, "iops": 180, "sizeBytes": "x" * 10_000}}, "disks.sizeBytes"),
    ({"disks": {"count": 4, "iops": 180, "class": "floppy"}}, "disks.class"),
    ({"disks": {"count": 4}}, "disks"),  # neither iops nor a class
    ({"disks": {"count": 4, "iops": 180, "colour": "red"}}, "disks.colour"),
    ({"disks": {"count": 4, "iops": 180}, "levels": ["raid7"]}, "levels.0"),
    ({"disks": {"count": 4, "iops": 180}, "levels": []}, "levels"),
    ({"disks": {"count": 4, "iops": 180}, "levels": ["raid5"] * 1000}, "levels"),
    ({"disks": {"count": 4, "iops": 180}, "levels": ["raid5", "5"]}, ""),
    ({"disks": {"count": 4, "iops": 180}, "workload": {"readPct": 101}}, "workload.readPct"),
    ({"disks": {"count": 4, "iops": 180}, "workload": {"readPct": -1}}, "workload.readPct"),
    ({"disks": {"count": 4, "iops": 180}, "workload": {"pattern": "zigzag"}}, "workload.pattern"),
    ({"disks": {"count": 4, "iops": 180}, "workload": {"blockSize": "1GiB"}}, "workload.blockSize"),
    ({"disks": {"count": 4, "iops": 180}, "requirements": {"iops": 0}}, "requirements.iops"),
    ({"disks": {"count": 4, "iops": 180}, "groups": 1}, "groups"),
    ({"disks": {"count": 4, "iops": 180}, "speedLimitMinKib": 300000}, ""),
    ({"disks": {"count": 4, "iops": 180}, "speedLimitMaxKib": 0}, "speedLimitMaxKib"),
])
def test_bad_inputs_are_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        RaidPlanRequest.model_validate(body)
    locs = [".".join(str(p) for p in e["loc"]) for e in caught.value.errors()]
    assert field in locs, locs


def test_impossible_geometries_are_said_per_level_not_raised() -> None:
    plans = by_level(request(disks={"count": 5, "iops": 100}, levels=["raid6", "raid50", "raid60", "raid0"],
                             groups=2))
    assert plans["raid6"].possible and plans["raid0"].possible
    assert not plans["raid50"].possible and "5 disks do not" in plans["raid50"].warnings[0]
    assert not plans["raid60"].possible and plans["raid60"].random_iops is None
    assert not by_level(request(disks={"count": 2, "iops": 100}, levels=["raid5"]))["raid5"].possible


# -- known answers --------------------------------------------------------------------------------
def test_sixteen_15k_disks_at_70_30_give_2215_iops_in_raid10_and_1516_in_raid5() -> None:
    plans = by_level(request(disks={"count": 16, "iops": 180}, levels=["raid10", "raid5"],
                             workload={"readPct": 70}))
    assert plans["raid10"].random_iops == pytest.approx(16 * 180 / (0.7 + 0.3 * 2))
    assert round(plans["raid10"].random_iops) == 2215
    assert round(plans["raid5"].random_iops) == 1516
    assert plans["raid10"].write_penalty == 2 and plans["raid5"].write_penalty == 4


def test_for_pure_random_writes_raid5_delivers_half_of_raid10() -> None:
    plans = by_level(request(disks={"count": 16, "iops": 180}, levels=["raid10", "raid5", "raid6", "raid0"],
                             workload={"readPct": 0}))
    assert plans["raid5"].random_iops == pytest.approx(plans["raid10"].random_iops / 2)
    assert plans["raid6"].random_iops == pytest.approx(16 * 180 / 6)
    assert plans["raid0"].random_iops == pytest.approx(16 * 180)


def test_a_nine_disk_raid5_warns_and_an_eight_disk_one_does_not() -> None:
    nine = by_level(request(disks={"count": 9, "iops": 180}, levels=["raid5", "raid6"]))
    assert any("9 disks" in w and "more than 8" in w for w in nine["raid5"].warnings)
    assert not any("more than 8" in w for w in nine["raid6"].warnings)
    eight = by_level(request(disks={"count": 8, "iops": 180}, levels=["raid5"]))
    assert eight["raid5"].warnings == []
    # RAID50 of 2 groups of 9: each group too wide
    wide = by_level(request(disks={"count": 18, "iops": 180}, levels=["raid50"], groups=2))
    assert any("groups of 9 disks" in w for w in wide["raid50"].warnings)


def test_capacity_and_fault_tolerance_per_level() -> None:
    tb = 10**12
    plans = by_level(request(disks={"count": 12, "iops": 100, "sizeBytes": "4TB"}, levels=list(LEVELS)))
    assert {k: p.usable_bytes for k, p in plans.items()} == {
        "raid0": 48 * tb, "raid1": 4 * tb, "raid10": 24 * tb, "raid5": 44 * tb, "raid6": 40 * tb,
        "raid50": 40 * tb, "raid60": 32 * tb}  # 50/60: 2 groups of 6
    assert {k: p.fault_tolerance for k, p in plans.items()} == {
        "raid0": 0, "raid1": 11, "raid10": 1, "raid5": 1, "raid6": 2, "raid50": 1, "raid60": 2}
    assert plans["raid50"].groups == 2 and plans["raid60"].groups == 2


def test_rebuild_time_follows_the_md_sync_limits_and_the_disk_rate() -> None:
    # 4 TB at the default max (200,000 KiB/s) when the disk streams faster: 4e12 / 204.8e6 s
    fast = level_plan(request(disks={"count": 6, "iops": 180, "mbps": 500, "sizeBytes": "4TB"}), "raid6")
    assert fast.rebuild_seconds_idle == pytest.approx(4e12 / (200_000 * 1024))
    assert fast.rebuild_seconds_busy == pytest.approx(4e12 / (1000 * 1024))
    # a disk slower than the max: the disk's rate
    slow = level_plan(request(disks={"count": 6, "iops": 180, "mbps": 150, "sizeBytes": "4TB"}), "raid6")
    assert slow.rebuild_seconds_idle == pytest.approx(4e12 / 150e6)
    # raised limits (sysctl) shorten the busy rebuild
    raised = level_plan(request(disks={"count": 6, "iops": 180, "mbps": 150, "sizeBytes": "4TB"},
                                speedLimitMinKib=50_000), "raid6")
    assert raised.rebuild_seconds_busy == pytest.approx(4e12 / (50_000 * 1024))
    assert level_plan(request(disks={"count": 6, "iops": 180, "sizeBytes": "4TB"}), "raid0"
                      ).rebuild_seconds_idle is None  # nothing to rebuild from


def test_performance_while_degraded_and_rebuilding_is_below_the_healthy_figure() -> None:
    req = request(disks={"count": 8, "iops": 180, "mbps": 150, "sizeBytes": "4TB"}, workload={"readPct": 100},
                  speedLimitMinKib=50_000)
    raid5 = level_plan(req, "raid5")
    assert raid5.random_iops == pytest.approx(8 * 180)
    # 7 disks left; a read of the lost disk's data (1 in 8) reads the 7 others
    assert raid5.degraded_random_iops == pytest.approx(7 * 180 / (7 / 8 + 7 / 8))
    assert raid5.rebuilding_random_iops == pytest.approx(
        raid5.degraded_random_iops * (1 - 50_000 * 1024 / 150e6))
    raid10 = level_plan(req, "raid10")
    assert raid10.degraded_random_iops == pytest.approx(7 * 180)


def test_the_ure_risk_of_a_raid5_rebuild_on_large_desktop_disks_warns() -> None:
    big = level_plan(request(disks={"count": 6, "class": "hdd-7.2k", "sizeBytes": "8TB"}), "raid5")
    bits = 5 * 8e12 * 8
    # 1 - (1 - 1/URE)^bits, computed without the rounding of 1 - 1e-14 in floating point
    assert big.rebuild_ure_risk == pytest.approx(1 - math.exp(bits * math.log1p(-1e-14)), rel=1e-9)
    assert big.rebuild_ure_risk == pytest.approx(1 - math.exp(-bits / 1e14), rel=1e-6)
    assert big.rebuild_ure_risk > 0.9
    assert any("unrecoverable read error" in w for w in big.warnings)
    # the same on enterprise disks (1e15) of 300 GB: small, no warning
    small = level_plan(request(disks={"count": 6, "class": "hdd-15k", "sizeBytes": "300GB"}), "raid5")
    assert small.rebuild_ure_risk == pytest.approx(-math.expm1(5 * 300e9 * 8 * math.log1p(-1e-15)))
    assert not any("unrecoverable" in w for w in small.warnings)
    # RAID6 still has parity to correct a read error during a single rebuild
    assert level_plan(request(disks={"count": 6, "class": "hdd-7.2k", "sizeBytes": "8TB"}),
                      "raid6").rebuild_ure_risk is None


def test_the_disks_needed_to_meet_the_requirements() -> None:
    plans = by_level(request(disks={"count": 8, "iops": 180, "sizeBytes": "1TB"}, levels=["raid10", "raid5"],
                             workload={"readPct": 70}, requirements={"iops": 2000, "capacityBytes": "6TB"}))
    # RAID10: 2000 <= n x 180 / 1.3 -> n >= 14.4 -> 15 disks; RAID5: n x 180 / 1.9 -> 22 disks
    assert plans["raid10"].disks_needed == 15 and plans["raid10"].meets_requirements is False
    assert plans["raid5"].disks_needed == 22
    capacity = by_level(request(disks={"count": 4, "iops": 180, "sizeBytes": "1TB"}, levels=["raid6"],
                                requirements={"capacityBytes": "10TB"}))
    assert capacity["raid6"].disks_needed == 12
    never = by_level(request(disks={"count": 2, "iops": 180, "sizeBytes": "1TB"}, levels=["raid1"],
                             requirements={"capacityBytes": "2TB"}))
    assert never["raid1"].disks_needed is None and any("no raid1" in w for w in never["raid1"].warnings)


def test_a_class_fills_what_is_not_measured_and_marks_the_estimate() -> None:
    disks = Disks.model_validate({"count": 4, "class": "hdd-15k"})
    assert disks.random_iops == 180 and disks.sequential_mbps == 250
    assert level_plan(RaidPlanRequest(disks=disks), "raid10").estimate
    measured = Disks.model_validate({"count": 4, "class": "hdd-15k", "iops": 370, "mbps": 240})
    plan = level_plan(RaidPlanRequest(disks=measured), "raid10")
    assert not plan.estimate and plan.random_iops == pytest.approx(4 * 370 / 1.3)


# -- an existing array ------------------------------------------------------------------------------
def _raid5_host(rpm: int | None = 7200) -> Topology:
    disks = [Device(name=f"sd{c}", kind=DeviceKind.DISK, id=f"name:sd{c}", size_bytes=2 * 10**12,
                    rotational=True, rotation_rpm=rpm, partitions=[f"sd{c}1"]) for c in "bcdef"]
    parts = [Device(name=f"sd{c}1", kind=DeviceKind.PARTITION, id=f"name:sd{c}1", parent=f"sd{c}",
                    size_bytes=2 * 10**12 - 2**20) for c in "bcdef"]
    md = Device(name="md0", kind=DeviceKind.MD, id="uuid:x", md=MdInfo(
        level="raid5", raid_disks=5, chunk_bytes=512 * 1024, component_bytes=10**12,
        members=[MdMember(device=f"sd{c}1") for c in "bcdef"], sync_speed_min_kib=1000,
        sync_speed_max_kib=100_000))
    return Topology(hostname="fs", devices=[*disks, *parts, md])


def test_an_existing_array_from_its_members_classes() -> None:
    found = existing_array(_raid5_host(), "md0")
    assert found.level == "raid5" and found.per_disk_iops == 80 and found.per_disk_source == "class hdd-7.2k"
    assert found.plan is not None and found.plan.estimate
    assert found.plan.random_iops == pytest.approx(5 * 80 / (0.7 + 0.3 * 4))
    assert found.plan.rebuild_seconds_idle == pytest.approx(10**12 / min(100_000 * 1024, 150e6))


def test_an_existing_array_from_measured_figures_takes_the_slowest_member() -> None:
    measured = {f"sd{c}": MeasuredCeiling(device=f"sd{c}", read_iops=200.0, read_bytes_per_second=180e6)
                for c in "bcdf"}
    measured["sde1"] = MeasuredCeiling(device="sde1", read_iops=120.0, read_bytes_per_second=90e6)
    found = existing_array(_raid5_host(rpm=None), "md0", measured)
    assert found.per_disk_iops == 120 and found.per_disk_mbps == 90 and found.per_disk_source == "measured"
    assert found.plan is not None and not found.plan.estimate
    assert found.plan.random_iops == pytest.approx(5 * 120 / 1.9)


def test_an_existing_array_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="not an md array"):
        existing_array(_raid5_host(), "sdb")
    with pytest.raises(ValueError, match="not an md array"):
        existing_array(_raid5_host(), "md9")


def test_an_array_of_san_luns_has_no_class_figures() -> None:
    # A LUN is an array's volume, not a drive: no 7.2k estimate, as in the layer analysis.
    topo = _raid5_host(rpm=None)
    for dev in topo.devices:
        if dev.kind is DeviceKind.DISK:
            dev.transport = "fc"
    found = existing_array(topo, "md0")
    assert found.per_disk_iops is None and found.per_disk_source == "unknown" and found.plan is None


@pytest.mark.parametrize("name", list(CLASSES))
def test_planning_by_class_uses_the_analysis_figures(name: DiskClassName) -> None:
    cls = CLASSES[name]
    disks = Disks.model_validate({"count": 4, "class": name})
    assert (disks.random_iops, disks.sequential_mbps, disks.ure) == (
        cls.iops, cls.bytes_per_second / 1e6, cls.ure_bits)
