"""The support bundle of a host whose PERC the agent manages: the controller inventory and
each volume's mapping travel in topology.json (no separate controllers.json), and redaction
masks the controller's serial and the volumes' WWNs wherever they are printed, the kernel's
messages included (found under the tool's keys, then masked everywhere). Only the tools are
fake (perccli64, dmesg)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from stortune.agent.controllers.access import ControllerAccess
from stortune.agent.diagnostics import ToolRunner, collect
from stortune.schemas.bundle import Bundle
from stortune.schemas.controllers import VirtualDrive
from stortune.schemas.redact import redact
from stortune.schemas.topology import Topology
from tests.fixtures.diag_hosts import write_script
from tests.fixtures.raid_tools import answers_for, modern, write_megaraid_tool
from tests.fixtures.scenarios import perc_managed

NOW = datetime(2024, 5, 14, 9, 30, tzinfo=UTC)
SERIAL = "SKFAKE0001"  # the 9460's serial in the fake perccli64's answer
VD_WWN = "600605b00d2e8f102a0e1b2c3d4e5f60"


def perc_bundle(tmp_path: Path) -> Bundle:
    bin_dir = tmp_path / "bin"
    show, vall, sall = modern()
    # a real NAA 6 id on VD 1 (the fixture's are not hex): the tool prints it under "SCSI NAA Id",
    # which names no WWN the detectors know by key
    vall["VD1 Properties"]["SCSI NAA Id"] = VD_WWN
    write_megaraid_tool(bin_dir, "perccli64", answers_for((show, vall, sall)))
    # the kernel names the card by its serial in a line no key introduces
    write_script(bin_dir / "dmesg", f"echo '[    2.1] megaraid_sas 0000:3b:00.0: {SERIAL} FW now in Ready"
                                    f" state'\necho '[    2.2] sd 1:2:1:0: [sdc] {VD_WWN} attached'")
    tools = ToolRunner([bin_dir], timeout=10.0, max_output=1 << 20)
    fs = replace(perc_managed(tmp_path / "host"), controllers=ControllerAccess(tools))
    return collect(fs, tools=tools, now=NOW)


def test_the_inventory_and_the_volume_mapping_land_in_topology_json(tmp_path: Path) -> None:
    bundle = perc_bundle(tmp_path)
    topo = Topology.model_validate_json(bundle.files["topology.json"])
    assert topo.controllers is not None
    [ctl] = topo.controllers.controllers
    assert (ctl.model, ctl.serial) == ("MegaRAID 9460-8i", SERIAL)
    sdb = topo.device("sdb")
    assert sdb is not None and sdb.controller is not None and sdb.controller.raid_level == "raid5"
    assert "controllers.json" not in bundle.files  # one place for it: the topology


def test_redaction_masks_the_controller_serial_and_volume_wwns_everywhere(tmp_path: Path) -> None:
    bundle = perc_bundle(tmp_path)
    assert SERIAL in bundle.files["kernel/storage-messages.txt"].decode()
    redacted, mapping = redact(bundle)
    for path, data in redacted.files.items():
        text = data.decode("utf-8", "replace")
        assert SERIAL not in text, path
        assert VD_WWN not in text.lower(), path
    assert SERIAL in mapping.values["serial"].values()
    assert VD_WWN in {v.lower() for v in mapping.values["wwn"].values()}
    topo = Topology.model_validate_json(redacted.files["topology.json"])
    assert topo.controllers is not None
    vd: VirtualDrive = topo.controllers.controllers[0].virtual_drives[1]
    assert vd.wwn is not None and vd.wwn.startswith("WWN-") and topo.controllers.controllers[0].serial == (
        next(t for t, v in mapping.values["serial"].items() if v == SERIAL))
    kernel = redacted.files["kernel/storage-messages.txt"].decode()
    assert "SERIAL-" in kernel and "WWN-" in kernel
    json.loads(redacted.files["topology.json"])
