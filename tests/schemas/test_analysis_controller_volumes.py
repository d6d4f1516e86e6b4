"""Layout analysis of hardware RAID volumes (Device.controller), on hand-built topologies.

A volume's strip and level cannot change in place: the checks hold the partition and the
filesystem to them, and the layer model sums the drives behind the volume as md sums its
members (one code path: layers._array_ceiling)."""

from __future__ import annotations

import pytest

from stortune.schemas.analysis import volumes
from stortune.schemas.analysis.checks import device_checks
from stortune.schemas.analysis.host import host_analysis
from stortune.schemas.analysis.layers import device_analysis
from stortune.schemas.analysis.model import Check, LayerKind, MeasuredCeiling
from stortune.schemas.controllers import (
    BackupUnit,
    Controller,
    ControllerInventory,
    PhysicalDrive,
    VirtualDrive,
)
from stortune.schemas.topology import (
    Device,
    DeviceKind,
    MdInfo,
    MdMember,
    Mount,
    PartitionInfo,
    Topology,
)

from .topologies import perc_volume

KIB = 1024


def checks(topo: Topology, name: str) -> dict[str, Check]:
    return {c.code: c for c in device_checks(topo, name, ram_share=0.25)}


def partition(start: int, parent: str = "sdb", mounts: list[Mount] | None = None) -> Device:
    """A partition as discovery reports it: aligned to 1 MiB when its start is (no md chunk)."""
    aligned = start % 2048 == 0
    return Device(name=f"{parent}1", kind=DeviceKind.PARTITION, id=f"name:{parent}1", parent=parent,
                  mounts=mounts or [],
                  partition=PartitionInfo(start_sector=start, size_sectors=1 << 30, aligned=aligned,
                                          aligned_1mib=aligned,
                                          misalignment_bytes=0 if aligned else (start * 512) % (1 << 20)))


def xfs(options: str, source: str = "/dev/sdb1") -> Mount:
    return Mount(mountpoint="/data", fstype="xfs", source=source, options=["rw"],
                 super_options=options.split(","))


def ext4(options: str) -> Mount:
    return Mount(mountpoint="/data", fstype="ext4", source="/dev/sdb1", options=["rw"],
                 super_options=options.split(","))


def host(*devices: Device, inventory: ControllerInventory | None = None) -> Topology:
    return Topology(hostname="db01", devices=list(devices), controllers=inventory)


# -- geometry ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("level", "drives", "spans", "data"), [
    ("RAID5", 8, None, 7), ("RAID6", 8, None, 6), ("RAID10", 8, 4, 4), ("RAID1", 2, None, 1),
    ("RAID0", 3, None, 3), ("RAID50", 12, 2, 10), ("RAID60", 16, 2, 12), ("RAID 1+0", 4, None, 2),
    ("raid 5", 4, None, 3),
    # not judged: no span depth for RAID50, spans that do not divide the drives, too few drives
    ("RAID50", 12, None, None), ("RAID60", 15, 2, None), ("RAID5", 2, None, None),
    ("RAID6", 3, None, None), ("RAID10", 3, None, None), ("RAID1", 1, None, None),
    ("RAID50", 6, 1, None),
])
def test_data_drives_per_level(level: str, drives: int, spans: int | None, data: int | None) -> None:
    vol = volumes.by_device(host(perc_volume(level=level, drives=drives, span_depth=spans)))["sdb"]
    assert vol.data_drives() == data


@pytest.mark.parametrize("level", ["RAID 1ADM", "Simple", "Simple_volume", "RAID1E", "RAID5EE", "",
                                   "RAID99", "raid5; rm -rf /", "RAID-TP"])
def test_hostile_levels_stortune_does_not_model_are_not_judged_and_say_so(level: str) -> None:
    dev = perc_volume(level=level, mounts=[xfs("sunit=8,swidth=8", source="/dev/sdb")], partitions=["sdb1"])
    topo = host(dev, partition(63))
    found = checks(topo, "sdb")
    assert set(found) == {"volume-not-judged"}  # no fs-geometry, no raid5-wide guessed
    assert f"level {level!r}" in found["volume-not-judged"].message
    assert "not judged" in found["volume-not-judged"].message
    # the partition is still judged against 1 MiB and the strip, which need no level
    part = checks(topo, "sdb1")["partition-misaligned"]
    assert "256 KiB strip" in part.message and "stripe (" not in part.message
    layer = next(la for la in device_analysis(topo, "sdb").layers if la.kind is LayerKind.DISK)
    assert "not modelled: write penalty not judged" in layer.source


def test_xfs_on_a_perc_raid5_partition_is_held_to_strip_and_data_drives() -> None:
    good = xfs("sunit=512,swidth=3584")  # 256 KiB x 7, 512-byte units
    topo = host(perc_volume(partitions=["sdb1"]), partition(2048, mounts=[good]))
    assert "fs-geometry" not in checks(topo, "sdb1")
    topo = host(perc_volume(partitions=["sdb1"]), partition(2048, mounts=[xfs("sunit=128,swidth=1024")]))
    message = checks(topo, "sdb1")["fs-geometry"].message
    assert "not sunit=512,swidth=3584" in message
    assert "a hardware RAID5 of 8 drives (7 data drives x 256 KiB strip)" in message


def test_ext4_stripe_on_a_raid60_of_two_spans() -> None:
    dev = perc_volume(level="RAID60", drives=16, span_depth=2, strip=64 * KIB, mounts=[ext4("stripe=16")])
    message = checks(host(dev), "sdb")["fs-geometry"].message
    assert "not stripe=192" in message and "stride=16" in message  # 12 data x 64 KiB / 4 KiB


def test_a_mirror_has_no_stripe_to_follow() -> None:
    dev = perc_volume(level="RAID1", drives=2, mounts=[xfs("rw", source="/dev/sdb")])
    assert checks(host(dev), "sdb") == {}


def test_partition_at_sector_63_misses_the_strip_and_is_a_warning() -> None:
    found = checks(host(perc_volume(partitions=["sdb1"]), partition(63)), "sdb1")
    check = found["partition-misaligned"]
    assert check.severity == "warning"
    assert "256 KiB strip" in check.message and "1792 KiB stripe (7 data drives x 256 KiB)" in check.message


def test_partition_on_the_strip_but_off_the_full_stripe_is_info() -> None:
    # 1 MiB start on a 7 x 256 KiB stripe: the strip is met, the width no power of two
    check = checks(host(perc_volume(partitions=["sdb1"]), partition(2048)), "sdb1")["partition-misaligned"]
    assert check.severity == "info" and "1792 KiB stripe" in check.message
    assert "256 KiB strip and" not in check.message


def test_partition_on_the_full_stripe_is_fine() -> None:
    # 4 data drives x 256 KiB = 1 MiB: a 1 MiB start is aligned to both
    topo = host(perc_volume(drives=5, partitions=["sdb1"]), partition(2048))
    assert "partition-misaligned" not in checks(topo, "sdb1")


@pytest.mark.parametrize("strip", [512, 16 << 20])
def test_hostile_strip_sizes_at_the_bounds(strip: int) -> None:
    dev = perc_volume(strip=strip, drives=1024, level="RAID0", partitions=["sdb1"],
                      mounts=[xfs("sunit=8,swidth=8", source="/dev/sdb")])
    topo = host(dev, partition(2048))
    found = checks(topo, "sdb")
    want = f"sunit={strip // 512},swidth={strip // 512 * 1024}"
    assert f"not {want}" in found["fs-geometry"].message
    part = checks(topo, "sdb1")
    if strip == 512:
        assert "partition-misaligned" not in part  # everything is a multiple of a sector
    else:
        assert part["partition-misaligned"].severity == "warning"  # 1 MiB is off a 16 MiB strip


def test_volume_without_strip_or_drive_count() -> None:
    topo = host(perc_volume(strip=None, drives=None, partitions=["sdb1"], mounts=[xfs("rw", "/dev/sdb")]),
                partition(2048))
    found = checks(topo, "sdb")
    assert set(found) == {"volume-not-judged"}
    assert "drive count is unknown" in found["volume-not-judged"].message
    assert checks(topo, "sdb1") == {}


# -- width and state --------------------------------------------------------------------------------
def test_raid5_of_more_than_8_drives_is_wide() -> None:
    assert "raid5-wide" not in checks(host(perc_volume(drives=8)), "sdb")
    wide = checks(host(perc_volume(drives=12)), "sdb")["raid5-wide"]
    assert "hardware RAID5 of 12 drives" in wide.message


def test_raid50_is_judged_per_span() -> None:
    assert "raid5-wide" not in checks(host(perc_volume(level="RAID50", drives=16, span_depth=2)), "sdb")
    wide = checks(host(perc_volume(level="RAID50", drives=20, span_depth=2)), "sdb")["raid5-wide"]
    assert "in 2 spans of 10" in wide.message


def test_hostile_1024_drives() -> None:
    found = checks(host(perc_volume(drives=1024)), "sdb")
    assert "1024 drives" in found["raid5-wide"].message
    analysis = device_analysis(host(perc_volume(drives=1024)), "sdb")
    disk = next(la for la in analysis.layers if la.kind is LayerKind.DISK)
    assert disk.ceiling_bytes_per_second == pytest.approx(1024 * 150e6)


@pytest.mark.parametrize(("state", "degraded"), [
    ("Optl", False), ("OK", False), ("Optimal", False), (None, False), ("Dgrd", True), ("Pdgd", True),
    ("Rbld", True), ("Interim Recovery Mode", True), ("OfLn", True),
])
def test_a_volume_not_optimal_is_degraded(state: str | None, degraded: bool) -> None:
    found = checks(host(perc_volume(state=state)), "sdb")
    assert ("array-degraded" in found) is degraded
    if degraded:
        assert found["array-degraded"].severity == "error" and repr(state) in found["array-degraded"].message


def inventory(vd_state: str = "Dgrd", media: str = "SSD", spans: int | None = None) -> ControllerInventory:
    drives = [f"32:{i}" for i in range(8)]
    return ControllerInventory(controllers=[Controller(
        adapter="perc", tool="/opt/dell/perccli64", index=0, model="PERC H710", serial="SKC0123456",
        backup=BackupUnit(kind="cachevault", state="Optimal", optimal=True),
        virtual_drives=[VirtualDrive(id=0, raid_level="RAID50", state=vd_state, span_depth=spans,
                                     strip_size_bytes=256 * KIB, drive_count=8, drives=drives)],
        physical_drives=[PhysicalDrive(slot=s, state="Onln", media=media) for s in drives])])


def test_hostile_an_inventory_listing_a_controller_twice_and_drives_of_mixed_media() -> None:
    twice = inventory(vd_state="Optl", spans=2)
    mixed = twice.model_copy(update={"controllers": [
        twice.controllers[0].model_copy(update={"physical_drives": [
            PhysicalDrive(slot=f"32:{i}", state="Onln", media="SSD" if i % 2 else "HDD") for i in range(8)]}),
        inventory(vd_state="Dgrd").controllers[0]]})
    dev = perc_volume(level="RAID50", state=None, span_depth=None, rotational=None)
    vol = volumes.by_device(host(dev, perc_volume("sdc", id="wwn:x", controller=None),
                                 inventory=mixed))
    assert list(vol) == ["sdb"]
    assert (vol["sdb"].state, vol["sdb"].span_depth, vol["sdb"].media) == ("Optl", 2, None)  # first listing
    disk = next(la for la in device_analysis(host(dev, inventory=mixed), "sdb").layers
                if la.kind is LayerKind.DISK)
    assert disk.ceiling_bytes_per_second is None  # mixed media: no class guessed


def test_state_span_depth_and_media_come_from_the_inventory_when_the_mapping_lacks_them() -> None:
    dev = perc_volume(level="RAID50", state=None, span_depth=None, rotational=None,
                      mounts=[xfs("rw", "/dev/sdb")])
    found = checks(host(dev, inventory=inventory(spans=2)), "sdb")
    assert "array-degraded" in found and "'Dgrd'" in found["array-degraded"].message
    assert "not sunit=512,swidth=3072" in found["fs-geometry"].message  # 8 - 2 spans x 1 parity
    disk = next(la for la in device_analysis(host(dev, inventory=inventory()), "sdb").layers
                if la.kind is LayerKind.DISK)
    assert disk.ceiling_bytes_per_second == pytest.approx(8 * 520e6) and disk.estimate
    # without the inventory, nothing says what the drives are: unknown, not guessed
    bare = next(la for la in device_analysis(host(dev), "sdb").layers if la.kind is LayerKind.DISK)
    assert bare.ceiling_bytes_per_second is None and "unknown until measured" in bare.source


# -- the layer model ---------------------------------------------------------------------------------
def test_a_volume_sums_its_drives_as_md_sums_its_members() -> None:
    topo = host(perc_volume(drives=8))
    disk = next(la for la in device_analysis(topo, "sdb").layers if la.kind is LayerKind.DISK)
    assert disk.ceiling_bytes_per_second == pytest.approx(8 * 150e6) and disk.estimate
    assert disk.ceiling_iops == pytest.approx(8 * 80)
    assert disk.source == ("PERC H710 VD0 RAID5, 8 drives, 256 KiB strip, CacheVault Optimal: raid5 reads:"
                           " the sum of 8 drives (7.2k rpm HDD, estimate) = 1,200 MB/s;"
                           " random writes pay raid5's penalty of 4")
    # an md raid5 of 8 such members reads the same sum through the same code
    members = [Device(name=f"sd{c}", kind=DeviceKind.DISK, id=f"serial:{c}", rotational=True)
               for c in "cdefghij"]
    md = Device(name="md0", kind=DeviceKind.MD, id="uuid:md0", slaves=[m.name for m in members],
                md=MdInfo(level="raid5", raid_disks=8, members=[MdMember(device=m.name) for m in members]))
    md_layer = next(la for la in device_analysis(host(md, *members), "md0").layers if la.kind is LayerKind.MD)
    assert md_layer.ceiling_bytes_per_second == disk.ceiling_bytes_per_second


def test_a_probe_replaces_the_drive_estimate() -> None:
    topo = host(perc_volume())
    probe = MeasuredCeiling(device="sdb", read_bytes_per_second=900e6, read_iops=3000)
    a = device_analysis(topo, "sdb", measured={"sdb": probe})
    disk = next(la for la in a.layers if la.kind is LayerKind.DISK)
    assert disk.ceiling_bytes_per_second == 900e6 and not disk.estimate


def test_a_disk_without_controller_is_unchanged() -> None:
    plain = Device(name="sdc", kind=DeviceKind.DISK, id="serial:c", rotational=True, transport="sata")
    disk = next(la for la in device_analysis(host(plain), "sdc").layers if la.kind is LayerKind.DISK)
    assert disk.source.startswith("estimate: 7.2k rpm HDD class")
    assert checks(host(plain), "sdc") == {}


def test_host_analysis_lists_each_volume_check_once() -> None:
    topo = host(perc_volume(drives=12, state="Dgrd", partitions=["sdb1"]), partition(63))
    found = [c.code for d in host_analysis(topo).devices for c in d.checks]
    assert sorted(found) == ["array-degraded", "partition-misaligned", "raid5-wide"]
