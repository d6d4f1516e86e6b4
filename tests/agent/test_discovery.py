"""Discovery against realistic sysfs/procfs trees, and against this machine (read-only)."""

from __future__ import annotations

import builtins
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stortune.agent import discovery
from stortune.agent.discovery import discover, partition_alignment, split_lvm_name
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.topology import Device, DeviceKind, Role, Topology
from tests.conftest import Golden
from tests.fixtures.scenarios import SCENARIOS, large_san

Build = Callable[[str], KernelFS]


@pytest.fixture
def build(tmp_path: Path) -> Build:
    def _build(name: str) -> KernelFS:
        return SCENARIOS[name](tmp_path / name)

    return _build


def dev(topo: Topology, name: str) -> Device:
    found = topo.device(name)
    assert found is not None, f"{name} not discovered; have {[d.name for d in topo.devices]}"
    return found


def device_dir(fs: KernelFS, name: str) -> Path:
    """The real directory under sys/devices, where the attributes live."""
    return (fs.sysfs / "class/block" / name).resolve()


# -- goldens ------------------------------------------------------------------


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_matches_golden(scenario: str, build: Build, golden: Golden) -> None:
    topo = discover(build(scenario))
    assert topo.warnings == []
    golden.check(f"topology/{scenario}.json", topo.model_dump(mode="json"))


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_device_id_agrees_with_discover(scenario: str, build: Build) -> None:
    """The executor re-identifies a device by name before writing: same answer, always."""
    fs = build(scenario)
    for d in discover(fs).devices:
        assert discovery.device_id(fs, d.name) == d.id
    assert discovery.device_id(fs, "sdzz") is None


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fixture_block_entries_are_relative_symlinks_into_devices(scenario: str,
                                                                  build: Build) -> None:
    fs = build(scenario)
    for base in ("block", "class/block"):
        entries = list((fs.sysfs / base).iterdir())
        assert entries
        for entry in entries:
            assert entry.is_symlink(), f"{entry} must be a symlink, as on a real host"
            target = os.readlink(entry)
            assert not os.path.isabs(target) and "/devices/" in f"/{target}", target
            assert entry.resolve().is_relative_to((fs.sysfs / "devices").resolve())


# -- what each host must show -------------------------------------------------


def test_md_raid5_fileserver(build: Build) -> None:
    topo = discover(build("md_raid5_fileserver"))
    md = dev(topo, "md126")
    assert md.kind is DeviceKind.MD
    assert md.md is not None
    assert (md.md.level, md.md.chunk_bytes, md.md.raid_disks) == ("raid5", 524288, 5)
    assert (md.md.metadata_version, md.md.degraded, md.md.array_state) == ("1.2", 0, "clean")
    assert [m.device for m in md.md.members] == ["sdb1", "sdc1", "sdd1", "sde1", "sdf1"]
    assert all(m.state == ["in_sync"] and m.errors == 0 for m in md.md.members)
    assert md.id == "uuid:8c5e2f1a-3b4d-4e6f-9a7b-1c2d3e4f5a6b"
    assert md.slaves == ["sdb1", "sdc1", "sdd1", "sde1", "sdf1"]
    assert [(m.mountpoint, m.fstype) for m in md.mounts] == [("/export", "xfs")]
    assert "swidth=3072" in md.mounts[0].super_options
    assert Role.MOUNTED in md.roles
    assert md.optimal_io_size == 4 * 524288

    sdd1 = dev(topo, "sdd1")
    assert sdd1.partition is not None
    assert sdd1.partition.start_sector == 63
    assert sdd1.partition.aligned_1mib is False
    assert sdd1.partition.aligned_md_chunk is False
    assert sdd1.partition.aligned is False
    assert sdd1.partition.misalignment_bytes == 63 * 512
    assert set(sdd1.roles) == {Role.MD_MEMBER, Role.PARTITION, Role.HAS_HOLDERS}
    for name in ("sdb1", "sdc1", "sde1", "sdf1"):
        part = dev(topo, name).partition
        assert part is not None and part.aligned and part.aligned_md_chunk is True

    sdb = dev(topo, "sdb")
    assert (sdb.vendor, sdb.model, sdb.firmware) == ("ATA", "ST4000NM0033-9ZM", "SN04")
    assert (sdb.transport, sdb.driver, sdb.serial) == ("sata", "ahci", "Z1Z8A1B2")
    assert sdb.partitions == ["sdb1"]
    assert dev(topo, "sdb1").parent == "sdb"
    assert dev(topo, "sdb1").id == f"{sdb.id}-part1"

    t = md.tunables
    assert t["stripe_cache_size"].value == 256 and t["stripe_cache_size"].writable
    assert t["group_thread_cnt"].value == 0
    assert t["sync_speed_min"].value == "system" and t["sync_speed_max"].value == "system"
    assert t["scheduler"].choices == ["none"]
    assert topo.host_tunables["dev.raid.speed_limit_min"].value == 1000
    assert topo.host_tunables["dev.raid.speed_limit_max"].value == 200000


def test_san_multipath(build: Build) -> None:
    topo = discover(build("san_multipath"))
    for dm_name, paths in (("dm-0", ["sdb", "sdc"]), ("dm-1", ["sdd", "sde"])):
        mp = dev(topo, dm_name)
        assert mp.dm is not None and mp.dm.type == "multipath"
        assert mp.dm.paths == paths
        assert mp.id == f"dm:{mp.dm.uuid}" and mp.id.startswith("dm:mpath-3")
        for path in paths:
            sd = dev(topo, path)
            assert Role.MPATH_PATH in sd.roles
            assert sd.holders == [dm_name]
            assert (sd.transport, sd.driver) == ("fc", "qla2xxx")
            assert sd.scsi_host is not None and sd.scsi_host.fc_speed == "8 Gbit"
            assert sd.scsi_host.fc_port_state == "Online"
            assert sd.id == f"wwn:naa.{mp.dm.uuid.removeprefix('mpath-3')}"  # type: ignore[union-attr]
    assert dev(topo, "dm-0").dm.name == "mpatha"  # type: ignore[union-attr]
    assert {dev(topo, "sdb").scsi_host.name, dev(topo, "sdc").scsi_host.name} == {  # type: ignore[union-attr]
        "host1", "host2"}
    assert dev(topo, "sdd").vendor == "3PARdata"
    assert dev(topo, "sdb").scsi_address == "1:0:0:0"
    sda = dev(topo, "sda")
    assert (sda.transport, sda.driver, sda.roles) == ("sata", "ahci", [])
    assert dev(topo, "dm-0").tunables["nr_requests"].value == 256


def test_perc_streamer(build: Build) -> None:
    topo = discover(build("perc_streamer"))
    sda = dev(topo, "sda")
    assert sda.driver == "megaraid_sas"
    assert sda.scsi_host is not None and sda.scsi_host.driver == "megaraid_sas"
    assert (sda.vendor, sda.model, sda.firmware) == ("DELL", "PERC 5/i", "1.03")
    assert sda.scsi_address == "0:2:0:0"
    assert sda.transport == "scsi"  # megaraid_sas hides the SAS fabric
    assert sda.id == "wwn:naa.6001e4f020a1b2001a2b3c4d0e5f6a7b"
    assert sda.rotational is True
    assert sda.tunables["queue_depth"].value == 256 and sda.tunables["queue_depth"].writable
    assert sda.tunables["max_sectors_kb"].maximum == 1024  # bound by max_hw_sectors_kb
    boot, video = dev(topo, "sda1").partition, dev(topo, "sda2").partition
    assert boot is not None and video is not None
    assert boot.aligned_1mib and boot.aligned_optimal_io is False and not boot.aligned
    assert boot.misalignment_bytes == (1 << 20) % 458752
    assert video.aligned and video.aligned_optimal_io
    assert [m.mountpoint for m in dev(topo, "sda2").mounts] == ["/srv/video"]
    assert "swidth=896" in dev(topo, "sda2").mounts[0].super_options
    assert not topo.host_tunables["dev.raid.speed_limit_min"].supported


def test_nvme_ssd(build: Build) -> None:
    topo = discover(build("nvme_ssd"))
    ns = dev(topo, "nvme0n1")
    assert ns.tunables["scheduler"].choices == ["none", "mq-deadline"]
    assert ns.tunables["scheduler"].value == "none"
    assert ns.tunables["nr_requests"].value == 1023
    assert not ns.tunables["queue_depth"].supported  # no SCSI device behind an NVMe namespace
    assert (ns.transport, ns.driver) == ("nvme", "nvme")
    assert ns.model == "Samsung SSD 970 EVO Plus 1TB"  # padding stripped
    assert (ns.serial, ns.firmware) == ("S4EWNX0R123456A", "2B2QEXM7")
    assert ns.id == "wwn:eui.0025388b91b2c5e4"
    assert ns.rotational is False
    assert ns.partitions == ["nvme0n1p1", "nvme0n1p2", "nvme0n1p3"]
    p3 = dev(topo, "nvme0n1p3")
    assert p3.id == "wwn:eui.0025388b91b2c5e4-part3"
    assert [m.mountpoint for m in p3.mounts] == ["/data/fast scratch"]
    loop0 = dev(topo, "loop0")
    assert loop0.id == "loop:/var/lib/snapd/snaps/core22_1380.snap"
    assert loop0.read_only is True and Role.MOUNTED in loop0.roles
    assert topo.device("loop1") is None  # unattached
    assert dev(topo, "zram0").kind is DeviceKind.ZRAM
    assert not dev(topo, "zram0").tunables["scheduler"].supported


def test_lvm_on_md(build: Build) -> None:
    topo = discover(build("lvm_on_md"))
    root = dev(topo, "dm-0")
    assert root.dm is not None
    assert (root.dm.type, root.dm.vg, root.dm.lv) == ("lvm", "vg0", "root")
    assert root.id.startswith("dm:LVM-")
    backup = dev(topo, "dm-2").dm
    assert backup is not None and (backup.vg, backup.lv) == ("vg0", "lv-backup")
    assert not root.tunables["nr_requests"].supported  # bio-based: no request queue
    assert [m.mountpoint for m in root.mounts] == ["/"]
    md0 = dev(topo, "md0")
    assert md0.id == "name:md0"  # this kernel has no md/uuid
    assert md0.md is not None and md0.md.level == "raid10" and md0.md.uuid is None
    assert Role.LVM_PV in md0.roles
    assert md0.holders == ["dm-0", "dm-1", "dm-2"]
    assert md0.slaves == ["sda2", "sdb2", "sdc2", "sdd2"]
    for name in ("sda2", "sdb2", "sdc2", "sdd2"):
        assert Role.MD_MEMBER in dev(topo, name).roles
    assert Role.MD_MEMBER not in dev(topo, "sdb1").roles
    assert dev(topo, "sda").physical_block_size == 4096


def test_devices_are_ordered_by_kind_then_natural_name(tmp_path: Path) -> None:
    topo = discover(large_san(tmp_path, luns=20))
    names = [d.name for d in topo.devices]
    sds = [n for n in names if n.startswith("sd")]
    assert sds[:3] == ["sda", "sdb", "sdc"] and sds[25:28] == ["sdz", "sdaa", "sdab"]
    dms = [n for n in names if n.startswith("dm-")]
    assert dms[:3] == ["dm-0", "dm-1", "dm-2"] and dms[10] == "dm-10"
    assert names.index("sdan") < names.index("dm-0")
    assert all(Role.MPATH_PATH in d.roles for d in topo.devices if d.kind is DeviceKind.DISK)


# -- what the kernel does not show -------------------------------------------


def test_missing_attributes_are_unsupported_not_errors(build: Build) -> None:
    fs = build("san_multipath")
    sdb = device_dir(fs, "sdb")
    (sdb / "queue/read_ahead_kb").unlink()
    (sdb / "queue/optimal_io_size").unlink()
    (sdb / "device/model").unlink()
    (sdb / "device/wwid").unlink()
    shutil.rmtree(device_dir(fs, "dm-0") / "dm")
    topo = discover(fs)
    d = dev(topo, "sdb")
    assert d.tunables["read_ahead_kb"].supported is False
    assert "absent" in (d.tunables["read_ahead_kb"].reason or "")
    assert d.tunables["scheduler"].supported is True
    assert d.model is None and d.optimal_io_size is None and d.wwn is None
    assert d.id == "name:sdb"  # no wwid, and no VPD serial on this LUN
    dm0 = dev(topo, "dm-0")
    assert dm0.dm is not None and dm0.dm.type == "other" and dm0.id == "name:dm-0"
    assert topo.warnings == []


def test_unreadable_dev_falls_back_to_proc_partitions(build: Build) -> None:
    fs = build("md_raid5_fileserver")
    (device_dir(fs, "md126") / "dev").unlink()
    topo = discover(fs)
    md = dev(topo, "md126")
    assert md.devno == "9:126"
    assert [m.mountpoint for m in md.mounts] == ["/export"]


def test_unknown_devno_is_warned_and_the_device_kept(build: Build) -> None:
    fs = build("md_raid5_fileserver")
    (device_dir(fs, "md126") / "dev").unlink()
    table = fs.procfs / "partitions"
    table.write_text("".join(ln for ln in table.read_text().splitlines(True) if "md126" not in ln))
    topo = discover(fs)
    md = dev(topo, "md126")
    assert md.devno is None and md.mounts == [] and md.md is not None
    assert any(w.startswith("md126: major:minor unknown") for w in topo.warnings)


def test_md_level_missing_from_sysfs_comes_from_mdstat(build: Build) -> None:
    fs = build("md_raid5_fileserver")
    (device_dir(fs, "md126") / "md/level").unlink()
    (device_dir(fs, "md126") / "md/metadata_version").unlink()
    md = dev(discover(fs), "md126").md
    assert md is not None and (md.level, md.metadata_version) == ("raid5", "1.2")


def test_device_directory_gone_is_skipped_with_a_warning(build: Build) -> None:
    fs = build("san_multipath")
    shutil.rmtree(device_dir(fs, "sde"))  # the class/block link now dangles
    topo = discover(fs)
    assert topo.device("sde") is None
    assert any(w.startswith("sde: sysfs directory") for w in topo.warnings)
    mp = dev(topo, "dm-1")
    assert mp.dm is not None and mp.dm.paths == ["sdd", "sde"]  # dm still lists it


def test_a_device_whose_name_is_not_a_kernel_name_is_skipped_with_a_warning(build: Build) -> None:
    """Hostile: a block entry named 'sd"x' (it would break a udev rule) held by md126 and in its
    members: skipped everywhere, so the topology still validates on the control plane."""
    fs = build("md_raid5_fileserver")
    odd = 'sd"x'
    sdb = device_dir(fs, "sdb")
    (sdb.parent / odd).mkdir()
    (sdb.parent / odd / "size").write_text("2048\n")
    (fs.sysfs / "class/block" / odd).symlink_to(os.path.relpath(sdb.parent / odd, fs.sysfs / "class/block"))
    md = device_dir(fs, "md126")
    (md / "slaves" / odd).symlink_to(sdb.parent / odd)
    (md / "md" / f"dev-{odd}").mkdir()
    topo = discover(fs)
    assert topo.device(odd) is None
    assert any(w.startswith(repr(odd)) and "device skipped" in w for w in topo.warnings)
    md126 = dev(topo, "md126")
    assert odd not in md126.slaves and md126.md is not None
    assert odd not in [m.device for m in md126.md.members]
    Topology.model_validate_json(topo.model_dump_json())


def test_old_layout_without_class_block(build: Build) -> None:
    fs = build("md_raid5_fileserver")
    expected = discover(fs)
    shutil.rmtree(fs.sysfs / "class/block")
    topo = discover(fs)
    assert [d.name for d in topo.devices] == [d.name for d in expected.devices]
    assert dev(topo, "sdd1").partition == dev(expected, "sdd1").partition


def test_btrfs_anonymous_devno_matches_by_source(build: Build) -> None:
    fs = build("nvme_ssd")
    with (fs.procfs / "self/mountinfo").open("a") as fh:
        fh.write("\n90 22 0:48 /@home /home rw,relatime shared:40 - btrfs /dev/nvme0n1p2"
                 " rw,ssd,space_cache=v2,subvol=/@home\n")
    topo = discover(fs)
    assert [m.mountpoint for m in dev(topo, "nvme0n1p2").mounts] == ["/", "/home"]


def test_an_injected_kernelfs_read_is_honoured(build: Build) -> None:
    """A KernelFS subclass (a fault-injecting fake, say) keeps its read()."""
    fs = build("nvme_ssd")

    class Failing(KernelFS):
        def read(self, path: Path) -> str | None:
            return None if str(path).endswith("/queue/scheduler") else super().read(path)

    topo = discover(Failing(fs.sysfs, fs.procfs))
    assert not dev(topo, "nvme0n1").tunables["scheduler"].supported
    assert dev(topo, "nvme0n1").tunables["nr_requests"].value == 1023


# -- pure helpers ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [("vg0-root", ("vg0", "root")), ("vg--a-lv--b", ("vg-a", "lv-b")),
     ("vg0-lv--backup", ("vg0", "lv-backup")), ("nodash", None), ("-lv", None)],
)
def test_split_lvm_name(name: str, expected: tuple[str, str] | None) -> None:
    assert split_lvm_name(name) == expected


def test_alignment_reports_the_largest_missed_boundary() -> None:
    part = partition_alignment(2048, 1000, 1, optimal_io=458752, md_chunk=None)
    assert (part.aligned_1mib, part.aligned_optimal_io, part.aligned) == (True, False, False)
    assert part.misalignment_bytes == 131072
    part = partition_alignment(63, 1000, 1, optimal_io=0, md_chunk=524288)
    assert part.aligned_optimal_io is None and part.aligned_md_chunk is False
    assert part.misalignment_bytes == 32256
    assert partition_alignment(4096, 1000, 1, None, 0).aligned


# -- this machine ------------------------------------------------------------------


@pytest.fixture
def no_writes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail the test on any open for writing: discovery of a live host is read-only."""
    real_os_open, real_open = os.open, builtins.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def guarded_os_open(path: Any, flags: int, *args: Any, **kw: Any) -> int:
        assert not flags & write_flags, f"discovery opened {path} for writing"
        return real_os_open(path, flags, *args, **kw)

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kw: Any) -> Any:
        assert not set(mode) & set("wax+"), f"discovery opened {file} with mode {mode}"
        return real_open(file, mode, *args, **kw)

    monkeypatch.setattr(os, "open", guarded_os_open)
    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(KernelFS, "write_tunable", lambda *a, **k: pytest.fail("wrote"))
    yield


@pytest.mark.usefixtures("no_writes")
def test_discovers_this_machine_read_only() -> None:
    sysfs = Path("/sys")
    if not (sysfs / "class/block").is_dir():
        pytest.skip("no sysfs here")
    topo = discover(KernelFS.at("/sys", "/proc"))
    assert topo.kernel == os.uname().release
    names = {d.name for d in topo.devices}
    if (sysfs / "class/block/vda").exists():
        vda = dev(topo, "vda")
        assert (vda.kind, vda.transport) == (DeviceKind.DISK, "virtio")
        assert vda.devno is not None and vda.size_bytes
        assert vda.tunables["scheduler"].supported
    for entry in (sysfs / "class/block").iterdir():
        if entry.name.startswith(("loop", "ram", "sr", "nbd")):
            continue
        assert entry.name in names
    mounted = [d for d in topo.devices if d.mounts]
    assert any(m.mountpoint == "/" for d in mounted for m in d.mounts) or not mounted


@pytest.mark.parametrize("scenario", [*sorted(SCENARIOS), "large_san"])
def test_what_discovery_reports_validates_as_the_control_plane_receives_it(
        scenario: str, tmp_path: Path) -> None:
    """The topology model refuses hostile uploads (tests/schemas/test_topology_bounds.py); the JSON
    of a real discovery must still pass it unchanged."""
    build = SCENARIOS.get(scenario, large_san)
    topology = discover(build(tmp_path / scenario))
    assert topology.devices
    assert Topology.model_validate_json(topology.model_dump_json()) == topology
