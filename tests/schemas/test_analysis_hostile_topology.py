"""An agent may upload any topology: junk stacking (deep chains, cycles, every device on every
other), absurd numbers and odd mount options must give a bounded analysis, never an exception."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stortune.schemas.analysis.host import host_analysis
from stortune.schemas.analysis.layers import MAX_DEVICE_WORK
from stortune.schemas.topology import Topology


def _dm(i: int, slaves: list[str]) -> dict[str, Any]:
    return {"name": f"dm-{i}", "kind": "dm", "id": f"dm:{i}", "slaves": slaves}


def _disk(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "kind": "disk", "id": f"name:{name}", **extra}


def _parts(analysis: Any) -> int:
    return sum(len(p.devices) + 1 for d in analysis.devices for layer in d.layers for p in layer.parts)


#: What the work budget bounds the analysis to: parts and their device lists are each at most
#: about one per unit of work (a bottom device's own part and its name in the part above).
#: A smaller host budget than the real one keeps these tests fast; the walk is the same.
WORK = 20_000
OUTPUT_BOUND = 2 * (WORK + MAX_DEVICE_WORK)


def test_a_chain_deeper_than_the_stack_is_analysed_without_recursion() -> None:
    n = 1200  # deeper than Python's recursion limit
    topology = Topology.model_validate({"devices": [_dm(i, [f"dm-{i + 1}"] if i < n - 1 else [])
                                                    for i in range(n)]})
    analysis = host_analysis(topology, work=WORK)
    assert len(analysis.devices) == n
    bounded = [d for d in analysis.devices if any(c.code == "analysis-bounded" for c in d.checks)]
    assert bounded, "1200 devices each stacked on the next cost more than the host's budget"
    assert _parts(analysis) <= OUTPUT_BOUND


def test_cycles_and_every_device_on_every_other_stay_within_the_budget() -> None:
    n = 300
    topology = Topology.model_validate({"devices": [_dm(i, [f"dm-{k}" for k in range(n) if k != i])
                                                    for i in range(n)]})
    analysis = host_analysis(topology, work=WORK)
    assert len(analysis.devices) == n
    assert _parts(analysis) <= OUTPUT_BOUND
    assert any(c.code == "analysis-bounded" for c in analysis.checks)


def test_a_fan_of_stacked_devices_over_many_disks_is_bounded() -> None:
    disks = [_disk(f"sd{i}") for i in range(2048)]
    fans = [_dm(j, [f"sd{i}" for i in range(2048)]) for j in range(100)]
    analysis = host_analysis(Topology.model_validate({"devices": disks + fans}), work=WORK)
    assert _parts(analysis) <= OUTPUT_BOUND
    assert any(c.code == "analysis-bounded" for c in analysis.checks)


def test_a_wide_array_on_one_port_and_many_pci_functions_is_analysed_whole() -> None:
    n = 1920  # md's most members
    disks = [_disk(f"sd{i}", rotational=True, scsi_host={
        "name": "host1", "fc_speed": "8 Gbit", "fc_port_state": "Online",
        "pci": {"address": f"0000:{i % 256:02x}:{i // 256:02x}.{i % 2}", "current_link_speed": "8.0 GT/s",
                "current_link_width": 8}}) for i in range(n)]
    md = {"name": "md0", "kind": "md", "id": "md0", "slaves": [f"sd{i}" for i in range(n)],
          "md": {"level": "raid0", "raid_disks": n, "members": [{"device": f"sd{i}"} for i in range(n)]}}
    analysis = host_analysis(Topology.model_validate({"devices": [*disks, md]}))
    top = next(d for d in analysis.devices if d.device == "md0")
    port = next(layer for layer in top.layers if layer.kind == "port")
    assert len(port.parts) == 1 and len(port.parts[0].devices) == n
    assert not any(c.code == "analysis-bounded" for c in top.checks)


def _md(**md: Any) -> dict[str, Any]:
    return {"name": "md0", "kind": "md", "id": "md0", "md": {"level": "raid5", **md}}


@pytest.mark.parametrize("options", [["sunit=\u00b2", "swidth=\u0663"], ["sunit=0", "swidth=0"],
                                     ["sunit=-128", "swidth=-512"], ["sunit=" + "9" * 4000, "swidth=1"]])
def test_odd_xfs_stripe_options_are_a_geometry_warning(options: list[str]) -> None:
    dev = _md(raid_disks=4, chunk_bytes=524288) | {"mounts": [
        {"mountpoint": "/x", "fstype": "xfs", "source": "/dev/md0", "options": [], "super_options": options}]}
    analysis = host_analysis(Topology.model_validate({"devices": [dev]}))
    assert [c.code for c in analysis.devices[0].checks] == ["fs-geometry"]


def test_an_odd_ext4_stripe_option_is_a_geometry_warning() -> None:
    dev = _md(raid_disks=4, chunk_bytes=524288) | {"mounts": [
        {"mountpoint": "/x", "fstype": "ext4", "source": "/dev/md0", "options": [],
         "super_options": ["stripe=\u00b2"]}]}
    analysis = host_analysis(Topology.model_validate({"devices": [dev]}))
    assert "no stripe=" in analysis.devices[0].checks[0].message


@pytest.mark.parametrize("progress", ["9" * 4000 + " / 1", "5 / 0", "1 / " + "9" * 4000])
def test_a_resync_progress_of_any_size_is_said(progress: str) -> None:
    dev = _md(sync_action="resync", sync_completed=progress)
    checks = host_analysis(Topology.model_validate({"devices": [dev]})).devices[0].checks
    assert [c.code for c in checks] == ["array-resyncing"]


@pytest.mark.parametrize(("device", "field"), [
    (_md(raid_disks=10**40), "raid_disks"),
    (_md(chunk_bytes=-1), "chunk_bytes"),
    (_md(sync_speed_max_kib=10**30), "sync_speed_max_kib"),
    (_disk("sda", size_bytes=10**30), "size_bytes"),
    (_disk("sda", rotation_rpm=-7200), "rotation_rpm"),
    (_disk("sda", alignment_offset=-2), "alignment_offset"),
    (_disk("nvme0n1", pci={"address": "0000:01:00.0", "current_link_width": 10**20}), "current_link_width"),
    (_disk("sda1", partition={"start_sector": -63, "size_sectors": 8, "aligned": False,
                              "aligned_1mib": False}), "start_sector"),
])
def test_numbers_no_kernel_reports_are_refused_naming_the_field(device: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Topology.model_validate({"devices": [device]})


def test_host_memory_no_kernel_reports_is_refused() -> None:
    with pytest.raises(ValidationError, match="memory_bytes"):
        Topology.model_validate({"memory_bytes": -1})
    with pytest.raises(ValidationError, match="memory_bytes"):
        Topology.model_validate({"memory_bytes": 10**40})


def test_a_stripe_cache_at_the_bounds_of_its_numbers_is_costed() -> None:
    dev = _md(raid_disks=16384) | {"tunables": {"stripe_cache_size": {"value": 2**63 - 1, "supported": True}}}
    second = {**dev, "name": "md1", "id": "md1"}
    analysis = host_analysis(Topology.model_validate({"devices": [dev, second], "memory_bytes": 1}))
    assert [c.code for c in analysis.checks] == ["stripe-cache-ram"]
    assert analysis.devices[0].checks[0].severity == "warning"
