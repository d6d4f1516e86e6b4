"""Mapping virtual drives to block devices (schemas.controllermap): hostile cases first."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import pytest
from pydantic import ValidationError

from stortune.schemas.controllermap import (
    attach_controllers,
    normalise_pci,
    normalise_raid_level,
    normalise_wwn,
    physical_drive_count,
    volume_refs,
)
from stortune.schemas.controllers import (
    BackupUnit,
    Controller,
    ControllerError,
    ControllerInventory,
    VirtualDrive,
)
from stortune.schemas.topology import (
    Device,
    DeviceKind,
    PciLink,
    ScsiHost,
    Topology,
    TunableState,
)


def disk(name: str, *, wwn: str | None = None, hctl: str | None = None, host: str | None = None,
         driver: str | None = "megaraid_sas", pci: str | None = None,
         kind: DeviceKind = DeviceKind.DISK) -> Device:
    scsi_host = None
    if host is not None:
        scsi_host = ScsiHost(name=host, driver=driver, pci=PciLink(address=pci) if pci else None)
    return Device(name=name, kind=kind, id=f"name:{name}", wwn=wwn, scsi_address=hctl,
                  scsi_host=scsi_host, driver=driver)


def vd(vid: int, *, wwn: str | None = None, raid: str = "RAID5", block_device: str | None = None,
       drives: int = 4) -> VirtualDrive:
    return VirtualDrive(id=vid, raid_level=raid, state="Optl", wwn=wwn, block_device=block_device,
                        strip_size_bytes=256 << 10, drive_count=drives)


def ctl(*vds: VirtualDrive, adapter: str = "perc", index: int = 0, pci: str | None = None,
        driver: str | None = "megaraid_sas") -> Controller:
    return Controller(adapter=adapter, tool=f"/opt/{adapter}", index=index, model="PERC H740P Mini",
                      pci_address=pci, driver=driver, firmware_version="51.14.0",
                      backup=BackupUnit(kind="bbu", state="Optimal", optimal=True),
                      virtual_drives=list(vds))


def inventory(*controllers: Controller, errors: list[ControllerError] | None = None
              ) -> ControllerInventory:
    return ControllerInventory(controllers=list(controllers), errors=errors or [])


# -- hostile ---------------------------------------------------------------------------------


def test_hostile_a_wwn_two_disks_share_maps_neither_and_says_so() -> None:
    inv = inventory(ctl(vd(0, wwn="600062B2AAAA0000")))
    devices = [disk("sdb", wwn="naa.600062b2aaaa0000"), disk("sdc", wwn="naa.600062b2aaaa0000")]
    refs, warnings = volume_refs(inv, devices)
    assert refs == {}
    assert any("600062b2aaaa0000 is on 2 disks (sdb, sdc)" in w for w in warnings)
    assert any("virtual drive(s) 0 match no block device" in w for w in warnings)


def test_hostile_a_wwn_two_virtual_drives_report_maps_neither() -> None:
    inv = inventory(ctl(vd(0, wwn="600062b2aaaa0000"), vd(1, wwn="0x600062B2AAAA0000")))
    refs, warnings = volume_refs(inv, [disk("sdb", wwn="naa.600062b2aaaa0000")])
    assert refs == {}
    assert sum("reported for more than one virtual drive" in w for w in warnings) == 2


@pytest.mark.parametrize("path", ["/dev/../etc/passwd", "/dev/sdb/../sda", "/etc/passwd"])
def test_hostile_a_tool_naming_a_path_outside_dev_maps_nothing(path: str) -> None:
    # the model refuses it already; a document built around validation still maps nothing
    with pytest.raises(ValidationError):
        vd(0, block_device=path)
    bad = VirtualDrive.model_construct(id=0, raid_level="RAID5", state="OK", wwn=None,
                                       block_device=path, drives=[], drive_count=3)
    inv = inventory(Controller.model_construct(**{**ctl(adapter="arcconf", driver=None).__dict__,
                                                  "virtual_drives": [bad]}))
    devices = [disk("sda", host="host0", driver="aacraid"), disk("sdb", host="host0", driver="aacraid")]
    refs, warnings = volume_refs(inv, devices)
    assert refs == {}
    assert any("not a /dev disk" in w for w in warnings)


def test_hostile_a_tool_naming_a_partition_maps_nothing() -> None:
    inv = inventory(ctl(vd(0, block_device="/dev/sdb1"), adapter="arcconf", driver=None))
    devices = [disk("sdb", host="host0", driver="aacraid"),
               disk("sdb1", kind=DeviceKind.PARTITION)]
    refs, warnings = volume_refs(inv, devices)
    assert refs == {}
    assert any("/dev/sdb1, a partition, not a whole disk" in w for w in warnings)


def test_hostile_a_tool_naming_a_disk_behind_another_driver_maps_nothing() -> None:
    # ssacli says /dev/sda, but sda is the AHCI boot disk: a stale or wrong answer
    inv = inventory(ctl(vd(1, block_device="/dev/sda"), adapter="smartarray", driver=None))
    refs, warnings = volume_refs(inv, [disk("sda", host="host0", driver="ahci")])
    assert refs == {}
    assert any("sda sits behind driver ahci, not ['cciss', 'hpsa', 'smartpqi']" in w for w in warnings)


def test_hostile_a_tool_naming_a_disk_this_host_does_not_have_maps_nothing() -> None:
    inv = inventory(ctl(vd(1, block_device="/dev/sdq"), adapter="smartarray", driver=None))
    refs, warnings = volume_refs(inv, [disk("sda", host="host0", driver="hpsa")])
    assert refs == {}
    assert any("/dev/sdq, which this host does not have" in w for w in warnings)


def test_hostile_two_megaraid_hosts_without_pci_addresses_are_never_guessed() -> None:
    inv = inventory(ctl(vd(0), index=0), ctl(vd(0), index=1))
    devices = [disk("sdb", hctl="1:2:0:0", host="host1"), disk("sdc", hctl="2:2:0:0", host="host2")]
    refs, warnings = volume_refs(inv, devices)
    assert refs == {}
    assert sum("cannot tell which of the megaraid_sas SCSI hosts (host1, host2)" in w
               for w in warnings) == 2


def test_hostile_one_megaraid_host_but_a_second_controller_unread_is_not_guessed() -> None:
    # the unread card could own the one host we see: its disks, not this controller's
    err = ControllerError(adapter="perc", tool="/opt/perccli64", index=1, message="timed out")
    inv = inventory(ctl(vd(0)), errors=[err])
    refs, warnings = volume_refs(inv, [disk("sdb", hctl="1:2:0:0", host="host1")])
    assert refs == {}
    assert any("cannot tell which" in w for w in warnings)


def test_hostile_a_pci_address_no_host_has_maps_nothing() -> None:
    inv = inventory(ctl(vd(0), pci="00:3c:00:00"))
    refs, warnings = volume_refs(inv, [disk("sdb", hctl="1:2:0:0", host="host1", pci="0000:3b:00.0")])
    assert refs == {}
    assert any("00:3c:00:00 is none of the megaraid_sas SCSI hosts' (host1 at 0000:3b:00.0)" in w
               for w in warnings)


def test_hostile_a_disk_two_virtual_drives_claim_maps_to_neither() -> None:
    # VD 0's WWN and VD 1's tool name both point at sdb
    inv = inventory(ctl(vd(0, wwn="600062b2aaaa0000"), vd(1, block_device="/dev/sdb"),
                        adapter="arcconf", driver=None))
    refs, warnings = volume_refs(inv, [disk("sdb", wwn="naa.600062b2aaaa0000", host="host0",
                                            driver="aacraid")])
    assert refs == {}
    assert any(w.startswith("sdb: claimed by 2 virtual drives") for w in warnings)


def test_hostile_duplicate_controller_index_and_vd_ids_map_nothing() -> None:
    inv = inventory(ctl(vd(0, wwn="600062b2aaaa0000")), ctl(vd(1, wwn="600062b2aaaa0001")),
                    ctl(vd(3, wwn="600062b2aaaa0003"), vd(3), index=2))
    devices = [disk(f"sd{c}", wwn=f"naa.600062b2aaaa000{i}") for i, c in enumerate("bcde")]
    refs, warnings = volume_refs(inv, devices)
    assert refs == {}
    assert sum("two controllers with this index" in w for w in warnings) == 2
    assert any("virtual drive id(s) 3 listed more than once" in w for w in warnings)


@pytest.mark.parametrize("wwn", ["", "0", "N/A", "0000000000000000", "naa.0000000000000000", "  "])
def test_hostile_ids_that_identify_nothing_never_match(wwn: str) -> None:
    assert normalise_wwn(wwn) is None
    inv = inventory(ctl(vd(0, wwn=wwn), pci="00:3b:00:00"))
    refs, _ = volume_refs(inv, [disk("sdb", wwn=wwn, host="host9", hctl="9:0:0:0",
                                     pci="0000:3b:00.0")])
    assert refs == {}


def test_hostile_an_uploaded_inventory_beyond_its_bounds_is_refused_naming_the_field() -> None:
    one = ctl()
    with pytest.raises(ValidationError, match="controllers"):
        ControllerInventory(controllers=[one] * 1025)
    with pytest.raises(ValidationError, match="unmanaged"):
        ControllerInventory.model_validate({"unmanaged": ["perc"] * 5})
    with pytest.raises(ValidationError, match="errors"):
        ControllerInventory(errors=[ControllerError(adapter="perc", tool="perccli64", message="x")] * 1029)


T = TypeVar("T")


def _lines_run(call: Callable[[], T]) -> tuple[int, T]:
    """How many lines of Python ``call`` executes (a loop's every pass counts), and its result:
    a count of work done that, unlike a clock, a busy machine cannot change."""
    lines = 0

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        lines += event == "line"
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        result = call()
    finally:
        sys.settrace(previous)
    return lines, result


def test_hostile_1024_virtual_drives_map_in_linear_time() -> None:
    """Hostile: a host with 1024 virtual drives and as many disks. Four times the drives take
    about four times the work (3.2 here), where pairing every drive with every disk would take
    sixteen; the work is counted in lines of Python run, not timed."""
    def run(n: int) -> tuple[int, int]:
        vds = [vd(i, wwn=f"600062b2{i:08x}" if i % 2 else None) for i in range(n)]
        inv = inventory(ctl(*vds[:256], pci="00:3b:00:00"),
                        *(ctl(*vds[k:k + 256], index=k // 256, adapter="smartarray", driver=None)
                          for k in range(256, n, 256)))
        devices = [disk(f"sd{i}", wwn=f"naa.600062b2{i:08x}" if i % 2 else None,
                        hctl=f"1:{2 + i // 128}:{i % 128}:0", host="host1", pci="0000:3b:00.0")
                   for i in range(n)]
        work, (refs, _) = _lines_run(lambda: volume_refs(inv, devices))
        return work, len(refs)

    small, mapped_small = run(256)
    large, mapped_large = run(1024)
    # the first 256 on the PERC by WWN or target id; the Smart Array ones only by WWN (odd ids)
    assert mapped_small == 256 and mapped_large == 256 + 384
    assert large < 6 * small, (small, large)  # linear: about 4x; quadratic: about 16x


# -- evidence --------------------------------------------------------------------------------


def test_wwn_maps_whatever_the_spelling() -> None:
    inv = inventory(ctl(vd(0, wwn="600062B2AAAA0000"), vd(1, wwn="0x600062b2aaaa0001")))
    refs, warnings = volume_refs(inv, [disk("sdc", wwn="naa.600062b2aaaa0001"),
                                       disk("sdb", wwn="NAA.600062B2AAAA0000")])
    assert {k: (r.virtual_drive, r.mapped_by) for k, r in refs.items()} == {
        "sdb": (0, "wwn"), "sdc": (1, "wwn")}
    assert warnings == []


def test_target_ids_map_on_the_host_at_the_controllers_pci_address() -> None:
    inv = inventory(ctl(vd(0), vd(1), vd(130), pci="00:3b:00:00"),
                    ctl(vd(0), index=1, pci="00:5e:00:00"))
    devices = [disk("sdb", hctl="1:2:0:0", host="host1", pci="0000:3b:00.0"),
               disk("sdc", hctl="1:2:1:0", host="host1", pci="0000:3b:00.0"),
               disk("sdd", hctl="1:3:2:0", host="host1", pci="0000:3b:00.0"),  # VD 130
               disk("sde", hctl="2:2:0:0", host="host2", pci="0000:5e:00.0"),
               disk("sdf", hctl="1:0:4:0", host="host1", pci="0000:3b:00.0")]  # a JBOD drive
    refs, warnings = volume_refs(inv, devices)
    assert {k: (r.controller, r.virtual_drive, r.mapped_by) for k, r in refs.items()} == {
        "sdb": (0, 0, "target-id"), "sdc": (0, 1, "target-id"), "sdd": (0, 130, "target-id"),
        "sde": (1, 0, "target-id")}
    assert warnings == []


def test_one_controller_and_one_host_need_no_pci_address() -> None:
    refs, warnings = volume_refs(inventory(ctl(vd(0), driver=None)),
                                 [disk("sda", hctl="0:2:0:0", host="host0")])
    assert refs["sda"].mapped_by == "target-id" and refs["sda"].driver == "megaraid_sas"
    assert warnings == []


def test_tool_names_map_behind_the_adapters_driver_cciss_included() -> None:
    inv = inventory(ctl(vd(1, block_device="/dev/cciss/c0d0"), adapter="smartarray", driver=None),
                    ctl(vd(0, block_device="/dev/sdb"), adapter="arcconf", driver=None))
    devices = [disk("cciss!c0d0", host="host0", driver="cciss"),
               disk("sdb", host="host1", driver="aacraid")]
    refs, warnings = volume_refs(inv, devices)
    assert {k: (r.adapter, r.mapped_by) for k, r in refs.items()} == {
        "cciss!c0d0": ("smartarray", "tool"), "sdb": ("arcconf", "tool")}
    assert warnings == []


def test_the_reference_carries_the_facts_profiles_match() -> None:
    inv = inventory(ctl(vd(0, wwn="600062b2aaaa0000", raid="RAID1+0", drives=8)))
    refs, _ = volume_refs(inv, [disk("sdb", wwn="naa.600062b2aaaa0000")])
    ref = refs["sdb"]
    assert (ref.adapter, ref.model, ref.driver, ref.firmware_version) == (
        "perc", "PERC H740P Mini", "megaraid_sas", "51.14.0")
    assert (ref.raid_level, ref.strip_size_bytes, ref.physical_drives) == ("raid10", 256 << 10, 8)
    assert ref.backup.kind == "bbu"


@pytest.mark.parametrize(("text", "level"), [
    ("RAID5", "raid5"), ("RAID 1+0", "raid10"), ("RAID1+0", "raid10"), ("RAID10", "raid10"),
    ("5", "raid5"), ("RAID 6", "raid6"), ("ADG", "raid6"),
    ("RAID50", "raid50"), ("RAID 5+0", "raid50"), ("Simple_volume", "simplevolume"),
])
def test_raid_levels_in_profile_words(text: str, level: str) -> None:
    assert normalise_raid_level(text) == level


@pytest.mark.parametrize(("text", "address"), [
    ("0000:3b:00.0", (0, 0x3B, 0, 0)), ("00:3b:00:00", (0, 0x3B, 0, 0)),
    ("0000:5C:00.0", (0, 0x5C, 0, 0)), ("3b:00.1", (0, 0x3B, 0, 1)), ("10000:01:00.0", None),
    ("zz:00:00:00", None), ("", None), ("00:3b:20:00", None),
])
def test_pci_addresses_in_one_form(text: str, address: tuple[int, int, int, int] | None) -> None:
    assert normalise_pci(text) == address


def test_physical_drives_count_every_span() -> None:
    spans = VirtualDrive(id=1, raid_level="RAID10", state="Optl", drive_count=4, span_depth=2)
    assert physical_drive_count(spans) == 4  # the adapters' count already covers all spans
    listed = VirtualDrive(id=1, raid_level="RAID10", state="Optl", drives=["64:4", "64:5", "64:6"])
    assert physical_drive_count(listed) == 3


# -- attach ----------------------------------------------------------------------------------


def test_attach_fills_devices_tunables_inventory_and_warnings() -> None:
    inv = inventory(ctl(vd(0, wwn="600062b2aaaa0000"), vd(1, wwn="600062b2aaaa0001")))
    topo = Topology(devices=[
        disk("sdb", wwn="naa.600062b2aaaa0000").model_copy(update={"tunables": {
            "read_ahead_kb": TunableState(supported=True, value=128)}}),
        disk("sdc")])
    seen: list[tuple[int, int]] = []

    def states(c: Controller, v: VirtualDrive) -> dict[str, TunableState]:
        seen.append((c.index, v.id))
        return {"controller.read_policy": TunableState(supported=True, value="read-ahead"),
                "read_ahead_kb": TunableState(supported=True, value=4096)}

    attach_controllers(topo, inv, states)
    sdb, sdc = topo.devices
    assert sdb.controller is not None and sdb.controller.virtual_drive == 0
    assert sdc.controller is None
    assert seen == [(0, 0)]
    assert sdb.tunables["controller.read_policy"].value == "read-ahead"
    assert sdb.tunables["read_ahead_kb"].value == 128  # the kernel's is kept
    assert topo.controllers == inv
    assert any("controller tunable read_ahead_kb has the name" in w for w in topo.warnings)
    assert any("virtual drive(s) 1 match no block device" in w for w in topo.warnings)
    # what an agent uploads round-trips
    assert Topology.model_validate(topo.model_dump(mode="json")) == topo
