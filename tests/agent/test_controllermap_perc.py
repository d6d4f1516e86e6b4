"""A PERC as the agent meets it: sysfs from ``perc_host``, the inventory from the fake perccli64,
mapped by schemas.controllermap. Discovery and the adapter run for real; only the tool is fake."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.controllers.discover import discover_controllers
from stortune.agent.discovery import discover
from stortune.agent.tools import ToolRunner
from stortune.schemas.controllermap import attach_controllers, volume_refs
from stortune.schemas.controllers import Controller, ControllerInventory, VirtualDrive
from stortune.schemas.topology import Topology, TunableState
from tests.fixtures.raid_tools import answers_for, legacy, modern, write_megaraid_tool
from tests.fixtures.scenarios import perc_managed


def perccli(bin_dir: Path, *controllers: object) -> ControllerInventory:
    write_megaraid_tool(bin_dir, "perccli64", answers_for(*controllers))  # type: ignore[arg-type]
    return discover_controllers(ToolRunner([bin_dir], timeout=10.0, max_output=1 << 20))


def test_the_fixture_is_what_megaraid_sas_shows(tmp_path: Path) -> None:
    topo = discover(perc_managed(tmp_path / "host"))
    by_name = {d.name: d for d in topo.devices}
    assert (by_name["sda"].scsi_host and by_name["sda"].scsi_host.driver) == "ahci"
    for name, hctl, wwid in (("sdb", "1:2:0:0", "naa.600062b2fake0000"),
                             ("sdc", "1:2:1:0", "naa.600062b2fake0001")):
        dev = by_name[name]
        assert dev.scsi_address == hctl and dev.wwn == wwid
        assert dev.scsi_host is not None and dev.scsi_host.driver == "megaraid_sas"
        assert dev.scsi_host.pci is not None and dev.scsi_host.pci.address == "0000:3b:00.0"


def test_hostile_a_second_perc_fixture_host_without_wwids_or_pci_match_maps_nothing(
        tmp_path: Path) -> None:
    # the card in the tree sits at another PCI address than the tool's and has no NAA ids:
    # it is some other controller, whatever its target ids say
    topo = discover(perc_managed(tmp_path / "host", pci_address="0000:5e:00.0", wwids=None))
    refs, warnings = volume_refs(perccli(tmp_path / "bin", modern()), topo.devices)
    assert refs == {}
    assert any("00:3b:00:00 is none of the megaraid_sas SCSI hosts' (host1 at 0000:5e:00.0)" in w
               for w in warnings)


def test_the_fake_perccli64_maps_onto_the_streaming_server(tmp_path: Path) -> None:
    topo = discover(perc_managed(tmp_path / "host"))
    inv = perccli(tmp_path / "bin", modern())

    def states(c: Controller, vd: VirtualDrive) -> dict[str, TunableState]:
        return {"controller.write_policy": TunableState(supported=True, value=vd.write_policy,
                                                        writable=True)}

    attach_controllers(topo, inv, states)
    sdb, sdc = topo.device("sdb"), topo.device("sdc")
    assert sdb is not None and sdc is not None and topo.device("sda").controller is None  # type: ignore[union-attr]
    assert sdb.controller is not None and sdc.controller is not None
    assert (sdb.controller.adapter, sdb.controller.virtual_drive, sdb.controller.mapped_by) == (
        "perc", 0, "wwn")
    assert (sdb.controller.raid_level, sdb.controller.strip_size_bytes,
            sdb.controller.physical_drives) == ("raid5", 256 << 10, 4)
    assert (sdc.controller.virtual_drive, sdc.controller.raid_level,
            sdc.controller.physical_drives) == (1, "raid10", 4)
    assert sdb.controller.backup.kind == "cachevault" and sdb.controller.driver == "megaraid_sas"
    assert sdb.tunables["controller.write_policy"].value == "write-back"
    assert topo.controllers == inv and topo.warnings == []
    assert Topology.model_validate(topo.model_dump(mode="json")) == topo


def test_old_perc_firmware_without_naa_ids_maps_by_target_id(tmp_path: Path) -> None:
    # perccli 1.x on a PERC H710: no SCSI NAA Id, no PCI Address; one card, one host
    topo = discover(perc_managed(tmp_path / "host", wwids=None))
    refs, warnings = volume_refs(perccli(tmp_path / "bin", legacy()), topo.devices)
    assert {k: (r.virtual_drive, r.mapped_by, r.raid_level) for k, r in refs.items()} == {
        "sdb": (0, "target-id", "raid5")}
    assert warnings == []


def test_discovery_through_the_controller_seam_maps_the_perc(tmp_path: Path) -> None:
    # what the agent does: KernelFS carries the tools, discover() attaches the volumes
    write_megaraid_tool(tmp_path / "bin", "perccli64", answers_for(modern()))
    fs = replace(perc_managed(tmp_path / "host"), controllers=ControllerAccess(
        ToolRunner([tmp_path / "bin"], timeout=10.0, max_output=1 << 20)))
    topo = discover(fs)
    mapped = {d.name: (d.controller.virtual_drive, d.controller.raid_level)
              for d in topo.devices if d.controller is not None}
    assert mapped == {"sdb": (0, "raid5"), "sdc": (1, "raid10")}
    sdb = topo.device("sdb")
    assert sdb is not None and sdb.tunables["controller_write_cache"].value == "write-back"
    assert topo.controllers is not None and [c.model for c in topo.controllers.controllers] == [
        "MegaRAID 9460-8i"]
