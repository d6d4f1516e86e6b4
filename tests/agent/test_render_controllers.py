"""`stortune-agent topology` on a host with hardware RAID controllers: each volume on its
disk, then the controllers, their tool errors and the adapters not managed, kept short."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.discovery import discover
from stortune.agent.render import topology_table
from stortune.agent.tools import ToolRunner
from stortune.schemas.analysis.host import host_analysis
from stortune.schemas.controllers import (
    BackupUnit,
    Controller,
    ControllerError,
    ControllerInventory,
    VirtualDrive,
)
from stortune.schemas.topology import Device, DeviceKind, Topology
from tests.fixtures.raid_tools import answers_for, modern, write_megaraid_tool
from tests.fixtures.scenarios import perc_managed
from tests.schemas.topologies import perc_volume

STORCLI_FAILED = "`storcli64 /c1 show all J nolog` exited with status 255: controller 1 not found"


def inventory(message: str = STORCLI_FAILED) -> ControllerInventory:
    return ControllerInventory(
        controllers=[Controller(
            adapter="perc", tool="/opt/dell/srvadmin/sbin/perccli64", index=0, model="PERC H710",
            firmware_version="21.3.5-0002",
            backup=BackupUnit(kind="cachevault", state="Optimal", optimal=True),
            virtual_drives=[VirtualDrive(id=0, raid_level="RAID5", state="Optl"),
                            VirtualDrive(id=1, raid_level="RAID1", state="Dgrd")])],
        errors=[ControllerError(adapter="megaraid", tool="/usr/sbin/storcli64", index=1, message=message)],
        unmanaged=["smartarray", "arcconf"])


def shown(topo: Topology) -> str:
    out = io.StringIO()  # not a terminal: plain aligned text
    topology_table(topo, out)
    return out.getvalue()


def test_a_volume_is_shown_on_its_disk_and_the_controllers_below() -> None:
    plain = Device(name="sda", kind=DeviceKind.DISK, id="serial:a", rotational=False, transport="sata")
    text = shown(Topology(hostname="db01", devices=[plain, perc_volume("sdb")], controllers=inventory()))
    sdb = next(line for line in text.splitlines() if line.startswith("sdb "))
    assert sdb.endswith("PERC H710 VD0 RAID5, 8 drives, 256 KiB strip, CacheVault Optimal")
    sda = next(line for line in text.splitlines() if line.startswith("sda "))
    assert "PERC" not in sda
    tail = text.split("hardware RAID controllers:\n", 1)[1].splitlines()
    assert tail == [
        "  perc 0: PERC H710, firmware 21.3.5-0002, 2 virtual drives, 0 physical, not optimal: VD1 Dgrd,"
        " CacheVault Optimal",
        "  error: megaraid controller 1 (/usr/sbin/storcli64): `storcli64 /c1 show all J nolog` exited with"
        " status 255: controller 1 not found",
        "  not managed (no tool on the tool path): arcconf, smartarray",
    ]


def test_a_degraded_volume_says_so_on_its_disk() -> None:
    text = shown(Topology(devices=[perc_volume("sdb", state="Dgrd", backup_state="Failed")]))
    assert "PERC H710 VD0 RAID5, 8 drives, 256 KiB strip, state Dgrd, CacheVault Failed" in text
    assert "hardware RAID controllers" not in text  # no inventory: no list to show


def test_a_host_without_controllers_shows_no_section() -> None:
    plain = Device(name="sda", kind=DeviceKind.DISK, id="serial:a")
    assert "controllers" not in shown(Topology(devices=[plain]))
    assert "hardware RAID controllers:\n  none found\n" in shown(
        Topology(devices=[plain], controllers=ControllerInventory()))


def test_hostile_a_tool_error_of_many_lines_is_one_short_line() -> None:
    text = shown(Topology(devices=[], controllers=inventory("line one\nline two\r\n" + "x" * 1900)))
    error = next(line for line in text.splitlines() if line.startswith("  error:"))
    assert "line one line two x" in error and error.endswith("...")
    assert len(error) < 260


def discovered_perc(tmp_path: Path, vd0_state: str = "Optl") -> Topology:
    """perc_managed discovered through the controller seam with the fake perccli64."""
    show, vall, sall = modern()
    vall["/c0/v0"][0]["State"] = vd0_state
    write_megaraid_tool(tmp_path / "bin", "perccli64", answers_for((show, vall, sall)))
    tools = ToolRunner([tmp_path / "bin"], timeout=10.0, max_output=1 << 20)
    return discover(replace(perc_managed(tmp_path / "host"), controllers=ControllerAccess(tools)))


def test_a_discovered_perc_end_to_end(tmp_path: Path) -> None:
    """The mapping leaves state and span depth to the inventory: both still reach the output."""
    topo = discovered_perc(tmp_path)
    lines = shown(topo).splitlines()
    assert next(line for line in lines if line.startswith("sdb ")).endswith(
        "MegaRAID 9460-8i VD0 RAID5, 4 drives, 256 KiB strip, CacheVault Optimal; /srv/video(xfs)")
    assert next(line for line in lines if line.startswith("sdc ")).endswith(
        "MegaRAID 9460-8i VD1 RAID10, 4 drives, 2 spans, 64 KiB strip, CacheVault Optimal")
    # the fixture's XFS has sunit=512,swidth=1536: 256 KiB x 3 data drives, as the check wants
    assert all(d.checks == [] for d in host_analysis(topo).devices)


def test_a_discovered_degraded_perc_volume_is_an_error(tmp_path: Path) -> None:
    topo = discovered_perc(tmp_path, vd0_state="Dgrd")
    assert "VD0 RAID5, 4 drives, 256 KiB strip, state Dgrd" in shown(topo)
    found = [(c.device, c.code, c.severity) for d in host_analysis(topo).devices for c in d.checks]
    assert found == [("sdb", "array-degraded", "error")]
