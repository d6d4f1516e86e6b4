"""Discovery of the facts the layer model rests on: PCIe links, SAS phys, ATA links, VPD B1
rotation rate, md sync figures and host memory. Hostile text first: an odd attribute is
unknown (None), never an error and never a guess."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stortune.agent import procfs
from stortune.agent.discovery import _rotation_rpm, discover
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.topology import Device, Topology
from tests.fixtures.scenarios import SCENARIOS

Build = Callable[[str], KernelFS]


@pytest.fixture
def build(tmp_path: Path) -> Build:
    def _build(name: str) -> KernelFS:
        return SCENARIOS[name](tmp_path / name)

    return _build


def dev(topo: Topology, name: str) -> Device:
    found = topo.device(name)
    assert found is not None, name
    return found


def sdev_dir(fs: KernelFS, name: str) -> Path:
    return (fs.sysfs / "class/block" / name / "device").resolve()


# -- hostile text --------------------------------------------------------------------


@pytest.mark.parametrize("page", [
    None, b"", b"\x00\xb1", b"\x00\xb1\x00\x3c\x00",  # absent, empty, truncated
    b"\x00\xb0\x00\x3c\x1c\x20",  # another page's bytes
    b"\x00\xb1\x00\x3c\x00\x00",  # 0: not reported
    b"\x00\xb1\x00\x3c\x00\x02", b"\x00\xb1\x00\x3c\x04\x00",  # reserved
    b"\x00\xb1\x00\x3c\xff\xff",  # reserved
])
def test_vpd_b1_that_says_nothing_is_unknown(page: bytes | None) -> None:
    assert _rotation_rpm(page) is None


@pytest.mark.parametrize(("page", "rpm"), [
    (b"\x00\xb1\x00\x3c\x00\x01" + bytes(56), 1),
    (b"\x00\xb1\x00\x3c\x1c\x20" + bytes(56), 7200),
    (b"\x00\xb1\x00\x3c\x3a\x98" + bytes(56), 15000),  # 0x98 is not UTF-8: read as bytes
])
def test_vpd_b1_rotation_rate(page: bytes, rpm: int) -> None:
    assert _rotation_rpm(page) == rpm


@pytest.mark.parametrize("text", [
    "", "garbage", "MemTotal:", "MemTotal: unknown kB", "MemTotal: -5 kB", "MemTotal: 0 kB",
    "MemTotal: 12 MB", "MemTotal: " + "9" * 400 + " kB", "MemFree: 100 kB",
])
def test_meminfo_without_a_sane_total_is_unknown(text: str) -> None:
    assert procfs.parse_meminfo_total(text) is None


def test_meminfo_total_is_kib() -> None:
    assert procfs.parse_meminfo_total("MemFree: 1 kB\nMemTotal:       16318412 kB\n") == 16318412 * 1024


def test_odd_link_attributes_are_kept_as_text_or_unknown(build: Build) -> None:
    """A phy that went away, a garbage width, an ata link without sata_spd: still discovered."""
    fs = build("san_8gfc_24lun")
    phy = fs.sysfs / "class/sas_phy/phy-0:4"
    (phy.resolve() / "negotiated_linkrate").write_text("Phy disabled\n")
    pci = (fs.sysfs / "class/block/sdb").resolve()
    fn = next(p for p in pci.parents if p.name == "0000:04:00.0")
    (fn / "current_link_width").write_text("\xff\xfe wide\n")
    (fn / "current_link_speed").unlink()
    topo = discover(fs)
    assert topo.warnings == []
    sda = dev(topo, "sda")
    assert (sda.link_kind, sda.link_name, sda.link_rate) == ("sas-phy", "phy-0:4", "Phy disabled")
    host = dev(topo, "sdb").scsi_host
    assert host is not None and host.pci is not None
    assert (host.pci.address, host.pci.current_link_speed, host.pci.current_link_width) == (
        "0000:04:00.0", None, None)


def test_missing_vpd_ata_link_and_meminfo_leave_facts_unknown(build: Build) -> None:
    fs = build("md_raid5_fileserver")
    (sdev_dir(fs, "sdb") / "vpd_pgb1").unlink()
    ata = next(p for p in (fs.sysfs / "class/block/sdc").resolve().parents if p.name == "ata3")
    (ata / "link3/ata_link/link3/sata_spd").unlink()
    (fs.procfs / "meminfo").write_text("MemTotal: lots\n")
    topo = discover(fs)
    assert topo.warnings == [] and topo.memory_bytes is None
    assert dev(topo, "sdb").rotation_rpm is None
    sdc = dev(topo, "sdc")
    assert (sdc.link_kind, sdc.link_rate, sdc.rotation_rpm) == (None, None, 7200)


# -- what the hosts show ---------------------------------------------------------------


def test_fileserver_links_rotation_md_figures_and_memory(build: Build) -> None:
    topo = discover(build("md_raid5_fileserver"))
    assert topo.memory_bytes == 32794380 * 1024
    sdb = dev(topo, "sdb")
    assert (sdb.link_kind, sdb.link_name, sdb.link_rate, sdb.rotation_rpm) == (
        "ata-link", "link2", "6.0 Gbps", 7200)
    assert dev(topo, "sda").rotation_rpm == 1  # the SSD
    assert sdb.scsi_host is not None and sdb.scsi_host.pci is not None
    # the chipset AHCI function: an address, no PCIe link attributes
    assert sdb.scsi_host.pci.model_dump() == {
        "address": "0000:00:17.0", "current_link_speed": None, "current_link_width": None,
        "max_link_speed": None, "max_link_width": None}
    md = dev(topo, "md126").md
    assert md is not None
    assert (md.sync_completed, md.sync_speed_min_kib, md.sync_speed_max_kib) == ("none", 1000, 200000)
    assert md.component_bytes is not None and md.component_bytes % (512 * 1024) == 0
    assert dev(topo, "md126").alignment_offset == 0


def test_san_host_pci_links_and_sas_phy(build: Build) -> None:
    topo = discover(build("san_8gfc_24lun"))
    paths = [d for d in topo.devices if d.transport == "fc"]
    assert len(paths) == 48
    hosts = {(d.scsi_host.name, d.scsi_host.fc_speed, d.scsi_host.fc_port_state,
              d.scsi_host.pci.address if d.scsi_host.pci else None)
             for d in paths if d.scsi_host}
    assert hosts == {("host1", "8 Gbit", "Online", "0000:04:00.0"),
                     ("host2", "8 Gbit", "Online", "0000:04:00.1")}
    pci = paths[0].scsi_host.pci if paths[0].scsi_host else None
    assert pci is not None and (pci.current_link_speed, pci.current_link_width) == ("5.0 GT/s PCIe", 8)
    sda = dev(topo, "sda")
    assert (sda.transport, sda.link_kind, sda.link_name, sda.link_rate) == (
        "sas", "sas-phy", "phy-0:4", "12.0 Gbit")


def test_nvme_namespace_has_its_controllers_pci_link(build: Build) -> None:
    topo = discover(build("nvme_ssd"))
    ns = dev(topo, "nvme0n1")
    assert ns.pci is not None
    assert (ns.pci.address, ns.pci.current_link_speed, ns.pci.current_link_width) == (
        "0000:3d:00.0", "8.0 GT/s PCIe", 4)
    assert dev(topo, "nvme0n1p1").pci is None  # a partition rides its disk's link
