"""Layout checks on fixture hosts (discovered from their sysfs trees) and on hand-built corner cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent.discovery import discover
from stortune.schemas.analysis.checks import device_checks, host_checks
from stortune.schemas.analysis.model import Check
from stortune.schemas.topology import (
    Device,
    DeviceKind,
    DmInfo,
    MdInfo,
    MdMember,
    Mount,
    Topology,
    TunableState,
)
from tests.fixtures.scenarios import SCENARIOS

GIB = 2**30


def all_checks(topo: Topology, ram_share: float = 0.25) -> dict[tuple[str | None, str], Check]:
    found = {(c.device, c.code): c for d in topo.devices
             for c in device_checks(topo, d.name, ram_share=ram_share)}
    found.update({(None, c.code): c for c in host_checks(topo, ram_share=ram_share)})
    return found


def md(name: str = "md0", *, level: str = "raid5", disks: int = 5, chunk: int = 512 * 1024,
       mounts: list[Mount] | None = None, stripe_cache: int | None = None, **info: object) -> Device:
    tunables = {} if stripe_cache is None else {"stripe_cache_size": TunableState(
        supported=True, value=stripe_cache, writable=True)}
    return Device(name=name, kind=DeviceKind.MD, id=f"uuid:{name}", mounts=mounts or [], tunables=tunables,
                  md=MdInfo(level=level, raid_disks=disks, chunk_bytes=chunk,
                            members=[MdMember(device=f"sd{chr(98 + i)}1") for i in range(disks)],
                            **info))  # type: ignore[arg-type]


def xfs(options: str, mountpoint: str = "/data") -> Mount:
    return Mount(mountpoint=mountpoint, fstype="xfs", source="/dev/md0", options=["rw"],
                 super_options=options.split(","))


# -- hostile and corner cases ------------------------------------------------------------------------
def test_an_unknown_device_has_no_checks() -> None:
    assert device_checks(Topology(), "sdz", ram_share=0.25) == []
    assert host_checks(Topology(), ram_share=0.25) == []


def test_fs_options_that_are_not_numbers_count_as_absent() -> None:
    dev = md(mounts=[xfs("rw,sunit=abc,swidth=-4096")])
    [check] = device_checks(Topology(devices=[dev]), "md0", ram_share=0.25)
    assert check.code == "fs-geometry" and "no stripe geometry" in check.message


def test_a_degraded_resyncing_wide_array() -> None:
    dev = md(level="raid6", disks=12, degraded=1, sync_action="recover", sync_completed="500 / 2000",
             sync_speed_min_kib=1000, sync_speed_max_kib=200000)
    checks = {c.code: c for c in device_checks(Topology(devices=[dev]), "md0", ram_share=0.25)}
    assert set(checks) == {"raid5-wide", "array-degraded", "array-resyncing"}
    assert checks["array-degraded"].severity == "error"
    assert "raid6 of 12 disks" in checks["raid5-wide"].message
    assert "recover, 25.0% done at 1,000 to 200,000 KiB/s" in checks["array-resyncing"].message
    # a corrupt progress text is left out, not a crash
    odd = md(sync_action="resync", sync_completed="x / 0")
    [resync] = device_checks(Topology(devices=[odd]), "md0", ram_share=0.25)
    assert resync.code == "array-resyncing" and "done" not in resync.message


def test_eight_disks_are_not_wide_and_an_idle_clean_array_is_quiet() -> None:
    dev = md(disks=8, chunk=64 * 1024, mounts=[xfs("sunit=128,swidth=896")], sync_action="idle", degraded=0)
    assert device_checks(Topology(devices=[dev]), "md0", ram_share=0.25) == []


def test_ext4_stripe_against_the_chunk_times_data_disks() -> None:
    ext4 = Mount(mountpoint="/srv", fstype="ext4", source="/dev/md0", options=["rw"],
                 super_options=["rw", "stripe=256"])
    dev = md(level="raid6", disks=6, mounts=[ext4])  # 4 data disks x 512 KiB = 2 MiB = 512 blocks
    [check] = device_checks(Topology(devices=[dev]), "md0", ram_share=0.25)
    assert check.code == "fs-geometry" and "has stripe=256, not stripe=512" in check.message
    ext4.super_options = ["rw", "stripe=512"]
    assert device_checks(Topology(devices=[dev]), "md0", ram_share=0.25) == []


def test_lvm_off_its_alignment() -> None:
    lv = Device(name="dm-0", kind=DeviceKind.DM, id="uuid:LVM-x", alignment_offset=3584,
                dm=DmInfo(type="lvm", vg="vg", lv="data"))
    [check] = device_checks(Topology(devices=[lv]), "dm-0", ram_share=0.25)
    assert check.code == "lvm-misaligned" and "3584 bytes off" in check.message
    lv.alignment_offset = 0
    assert device_checks(Topology(devices=[lv]), "dm-0", ram_share=0.25) == []


def test_stripe_cache_ram_is_info_then_a_warning_above_the_share_and_said_when_ram_is_unknown() -> None:
    arrays = [md("md0", stripe_cache=32768, disks=8), md("md1", stripe_cache=4096, disks=5)]
    topo = Topology(devices=arrays, memory_bytes=3 * GIB)
    checks = all_checks(topo)
    assert checks[("md0", "stripe-cache-ram")].severity == "warning"  # 1 GiB of 3: above 25 %
    assert "1,024 MiB" in checks[("md0", "stripe-cache-ram")].message
    assert checks[("md1", "stripe-cache-ram")].severity == "info"
    assert "80 MiB" in checks[("md1", "stripe-cache-ram")].message
    assert "2 arrays' stripe caches cost 1,104 MiB" in checks[(None, "stripe-cache-ram")].message
    assert checks[(None, "stripe-cache-ram")].severity == "warning"
    unknown = all_checks(Topology(devices=arrays))
    assert unknown[("md0", "stripe-cache-ram")].severity == "info"
    assert "RAM is unknown" in unknown[("md0", "stripe-cache-ram")].message


# -- the fixture hosts --------------------------------------------------------------------------------
def test_the_md_file_server_shows_its_misaligned_member_and_its_xfs_swidth(tmp_path: Path) -> None:
    topo = discover(SCENARIOS["md_raid5_fileserver"](tmp_path / "fs"))
    checks = all_checks(topo)
    assert set(checks) == {("sdd1", "partition-misaligned"), ("md126", "fs-geometry"),
                           ("md126", "stripe-cache-ram")}
    assert "sdd1 starts at sector 63, 32256 bytes off 1 MiB and the md chunk" in \
        checks[("sdd1", "partition-misaligned")].message
    geometry = checks[("md126", "fs-geometry")].message
    assert "/export (xfs) has sunit=1024,swidth=3072" in geometry
    assert "not sunit=1024,swidth=4096" in geometry and "(4 data disks x 512 KiB)" in geometry
    assert checks[("md126", "stripe-cache-ram")].severity == "info"


@pytest.mark.parametrize("scenario", ["san_multipath", "nvme_ssd", "lvm_on_md"])
def test_hosts_without_layout_problems_have_no_warnings(tmp_path: Path, scenario: str) -> None:
    topo = discover(SCENARIOS[scenario](tmp_path / scenario))
    assert [c for c in all_checks(topo).values() if c.severity != "info"] == []
