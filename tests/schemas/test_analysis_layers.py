"""The layer model on fixture hosts: sums, deduplication, unknowns and the limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent.discovery import discover
from stortune.schemas.analysis.layers import device_analysis, join_names
from stortune.schemas.analysis.model import LayerKind, MeasuredCeiling
from tests.fixtures.scenarios import SCENARIOS


def test_join_names() -> None:
    assert join_names([]) == ""
    assert join_names(["sdb"]) == "sdb"
    assert join_names(["host2", "host1", "host1"]) == "host1+host2"
    assert join_names(["sdf", "sdb", "sdc", "sdd", "sde"]) == "sdb..sdf"


def test_a_port_that_is_down_is_not_counted(tmp_path: Path) -> None:
    """Hostile: host2 lost its link ("unknown" speed, Linkdown): the LUN tops out at one port."""
    fs = SCENARIOS["san_8gfc_24lun"](tmp_path)
    fc2 = (fs.sysfs / "class/fc_host/host2").resolve()
    (fc2 / "speed").write_text("unknown\n")
    (fc2 / "port_state").write_text("Linkdown\n")
    a = device_analysis(discover(fs), "dm-3")
    port = next(la for la in a.layers if la.kind is LayerKind.PORT)
    assert port.ceiling_bytes_per_second == pytest.approx(797e6)
    assert port.source.endswith("1 of 2 parts unknown, not counted")
    assert a.limit == "host1+host2 qla2xxx" and a.ceiling_bytes_per_second == pytest.approx(797e6)


def test_paths_through_one_port_count_it_once(tmp_path: Path) -> None:
    topo = discover(SCENARIOS["san_8gfc_24lun"](tmp_path))
    a = device_analysis(topo, "dm-0")
    port = next(la for la in a.layers if la.kind is LayerKind.PORT)
    assert [(p.name, p.devices) for p in port.parts] == [("host1", ["sdb"]), ("host2", ["sdc"])]
    assert [la.kind for la in a.layers] == [LayerKind.FILESYSTEM, LayerKind.MULTIPATH, LayerKind.DISK,
                                            LayerKind.PORT, LayerKind.CONTROLLER, LayerKind.PCI]


def test_measured_lun_paths_become_the_limit(tmp_path: Path) -> None:
    topo = discover(SCENARIOS["san_8gfc_24lun"](tmp_path))
    measured = {n: MeasuredCeiling(device=n, read_bytes_per_second=300e6) for n in ("sdb", "sdc")}
    a = device_analysis(topo, "dm-0", measured)
    assert a.limit == "sdb+sdc" and a.ceiling_bytes_per_second == pytest.approx(600e6)


def test_unknown_everywhere_has_no_limit(tmp_path: Path) -> None:
    topo = discover(SCENARIOS["nvme_ssd"](tmp_path))
    a = device_analysis(topo, "zram0")
    assert a.ceiling_bytes_per_second is None and a.limit is None
    assert [la.ceiling_bytes_per_second for la in a.layers] == [None]


def test_nvme_is_capped_by_its_pcie_link_when_that_is_lower(tmp_path: Path) -> None:
    fs = SCENARIOS["nvme_ssd"](tmp_path)
    fn = next(p for p in (fs.sysfs / "class/block/nvme0n1").resolve().parents if p.name == "0000:3d:00.0")
    (fn / "current_link_width").write_text("1\n")  # a x4 drive that trained at x1
    a = device_analysis(discover(fs), "nvme0n1p2")
    assert a.limit == "0000:3d:00.0"
    assert a.ceiling_bytes_per_second == pytest.approx(8e9 * 128 / 130 / 8)


def test_the_functions_of_one_hba_share_its_one_pcie_link(tmp_path: Path) -> None:
    """A QLE2562's two ports are PCI functions 04:00.0 and 04:00.1; each shows the card's
    PCIe 2.0 x8 link, which both ports' traffic crosses: counted once, not twice."""
    topology = discover(SCENARIOS["san_8gfc_24lun"](tmp_path))
    lun = next(d for d in topology.devices if d.dm is not None and d.dm.type == "multipath")
    pci = next(layer for layer in device_analysis(topology, lun.name).layers
               if layer.kind is LayerKind.PCI)
    assert [p.name for p in pci.parts] == ["0000:04:00.0"]
    assert sorted(pci.parts[0].devices) == sorted(lun.slaves)
    assert pci.ceiling_bytes_per_second == 4_000_000_000  # 5 GT/s x8, 8b/10b


def test_the_host_analysis_says_what_each_md_array_can_do(tmp_path: Path) -> None:
    """RAID planning's model over the array's members: five 7.2k disks (80 IOPS class figure)
    in RAID5 at the default 70/30 mix give 5 x 80 / (0.7 + 0.3 x 4) = 210.5 IOPS; a probe's
    figure for a member's disk replaces the class figure (the slowest member counts)."""
    from stortune.schemas.analysis.host import host_analysis

    topology = discover(SCENARIOS["md_raid5_fileserver"](tmp_path))
    (array,) = host_analysis(topology).arrays
    assert (array.array, array.level, array.per_disk_source) == ("md126", "raid5", "class hdd-7.2k")
    assert array.plan is not None and array.plan.estimate
    assert array.plan.random_iops == pytest.approx(5 * 80 / (0.7 + 0.3 * 4))
    slow = MeasuredCeiling(device="sdd", read_bytes_per_second=120e6, read_iops=60.0)
    (probed,) = host_analysis(topology, measured=[slow]).arrays
    assert probed.plan is not None and probed.plan.random_iops == pytest.approx(5 * 60 / 1.9)
