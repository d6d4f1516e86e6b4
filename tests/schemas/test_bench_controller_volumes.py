"""Benchmark presets on hardware RAID volumes: the drives behind a virtual drive count."""

from __future__ import annotations

from stortune.schemas.bench import presets, target
from stortune.schemas.topology import Device, DeviceKind, Topology

from .topologies import perc_volume


def _iometer_depths(topology: Topology, name: str) -> set[int]:
    steps = presets.expand("iometer-4k", "x", presets.Overrides(), target.facts(topology, name))
    return {s.iodepth * s.numjobs for s in steps}


def _plain(name: str) -> Device:
    return Device(name=name, kind=DeviceKind.DISK, id=f"serial:{name}", rotational=True)


def test_an_8_drive_perc_raid5_gets_the_outstanding_ios_of_8_spindles() -> None:
    topo = Topology(devices=[perc_volume("sdb", drives=8), _plain("sdc")])
    assert target.drives(topo, "sdb") == 8
    # the per-spindle rule an md array of 8 members gets: 2 per drive = 16, not the preset's 4
    assert _iometer_depths(topo, "sdb") == {presets.OUTSTANDING_PER_DRIVE * 8} == {16}
    assert _iometer_depths(topo, "sdc") == {4}  # a plain disk: unchanged


def test_same_rule_as_an_md_array_of_as_many_members() -> None:
    members = [_plain(f"sd{c}") for c in "cdefghij"]
    md = Device(name="md0", kind=DeviceKind.MD, id="uuid:md0", slaves=[m.name for m in members])
    topo = Topology(devices=[perc_volume("sdb", drives=8), md, *members])
    assert _iometer_depths(topo, "sdb") == _iometer_depths(topo, "md0")


def test_a_partition_of_a_volume_and_lvm_over_two_volumes_count_their_drives() -> None:
    a = perc_volume("sdb", drives=8, partitions=["sdb1"])
    part = Device(name="sdb1", kind=DeviceKind.PARTITION, id="name:sdb1", parent="sdb")
    b = perc_volume("sdc", drives=4, id="wwn:naa.2")
    lv = Device(name="dm-0", kind=DeviceKind.DM, id="uuid:lv", slaves=["sdb1", "sdc"])
    topo = Topology(devices=[a, part, b, lv])
    assert target.drives(topo, "sdb1") == 8
    assert target.drives(topo, "dm-0") == 12


def test_a_volume_whose_drive_count_is_unknown_counts_as_one() -> None:
    topo = Topology(devices=[perc_volume("sdb", drives=None)])
    assert target.drives(topo, "sdb") == 1


def test_hostile_a_volume_of_1024_drives_stays_within_the_iodepth_bound() -> None:
    topo = Topology(devices=[perc_volume("sdb", drives=1024)])
    steps = presets.expand("iometer-4k", "x", presets.Overrides(), target.facts(topo, "sdb"))
    assert {s.iodepth for s in steps} == {2048}  # WorkloadStep accepts it (le=65536)
