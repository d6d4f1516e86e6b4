"""What a topology may hold: the model every consumer validates (the control plane's uploads and
gRPC answers, the planner, the CLI) refuses names that are paths, traversal in ``sysfs_path``, NUL
bytes, over-long text and absurd counts, naming the field; while what hosts really report (the
golden topologies, kernel names of every family) still validates. Discovery's own output:
tests/agent/test_discovery.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from stortune.schemas.documents import field_path
from stortune.schemas.topology import MAX_DEVICES, Topology, is_device_name

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "topology"


def _device(name: str = "sda", **fields: Any) -> dict[str, Any]:
    return {"name": name, "kind": "disk", "id": f"name:{name}", **fields}


def _topology(*devices: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"hostname": "h1", "devices": list(devices) or [_device()], **fields}


def refused(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(field, message) of every error; fails the test if the topology is accepted."""
    with pytest.raises(ValidationError) as caught:
        Topology.model_validate(data)
    return [(field_path(e["loc"]), e["msg"]) for e in caught.value.errors(include_url=False)]


def refused_at(data: dict[str, Any], field: str) -> str:
    errors = refused(data)
    assert [f for f, _ in errors] == [field], errors
    return errors[0][1]


# -- hostile first ---------------------------------------------------------------------------------
HOSTILE_NAMES = ["..", ".", "/tmp/x", "../../x", "a/b", "sda\x00", "", "x" * 65, "sda b", 'sd"a',
                 "-sda", ".hidden", "a..b", "sda\n", "sda;rm"]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=repr)
def test_a_device_name_that_is_not_a_kernel_name_is_refused(name: str) -> None:
    """Hostile: '..', '/tmp/x', '../../x', NUL, over-long, quotes and newlines (udev rules)."""
    message = refused_at(_topology(_device("sda"), _device("sdb"), _device(name)), "devices[2].name")
    assert "kernel block device name" in message or "at most 64" in message


@pytest.mark.parametrize(("where", "fields", "field"), [
    ("parent", {"parent": "../../x"}, "devices[0].parent"),
    ("partitions", {"partitions": ["sda1", "/tmp/x"]}, "devices[0].partitions[1]"),
    ("slaves", {"slaves": [".."]}, "devices[0].slaves[0]"),
    ("holders", {"holders": ["dm-0", "../../x"]}, "devices[0].holders[1]"),
    ("dm paths", {"dm": {"paths": ["sdb", "/dev/sdc"]}}, "devices[0].dm.paths[1]"),
    ("md members", {"md": {"members": [{"device": "../../x"}]}}, "devices[0].md.members[0].device"),
])
def test_every_name_that_refers_to_a_device_is_checked(
        where: str, fields: dict[str, Any], field: str) -> None:
    assert "kernel block device name" in refused_at(_topology(_device(**fields)), field)


@pytest.mark.parametrize("path", ["../../x", "/sys/block/sda", "devices/../../x", "devices//block/sda",
                                  "devices/./block", "devices/pci0000:00/\x00/sda", "devices/\nblock",
                                  "", "devices/" + "a" * 1100])
def test_a_sysfs_path_outside_the_sysfs_root_is_refused(path: str) -> None:
    """Hostile: traversal, an absolute path, empty and dot components, NUL and control bytes,
    over-long."""
    refused_at(_topology(_device(sysfs_path=path)), "devices[0].sysfs_path")


@pytest.mark.parametrize(("data", "field"), [
    (_topology(_device(model="x" * 5000)), "devices[0].model"),
    (_topology(_device(mounts=[{"mountpoint": "/" + "a" * 5000, "fstype": "xfs", "source": "/dev/sda",
                                "options": []}])), "devices[0].mounts[0].mountpoint"),
    (_topology(_device(mounts=[{"mountpoint": "srv", "fstype": "xfs", "source": "/dev/sda",
                                "options": []}])), "devices[0].mounts[0].mountpoint"),
    (_topology(_device(mounts=[{"mountpoint": "/srv\x00", "fstype": "xfs", "source": "/dev/sda",
                                "options": []}])), "devices[0].mounts[0].mountpoint"),
    (_topology(_device(tunables={"read_ahead_kb": {"supported": True, "raw": "1" * 5000}})),
     "devices[0].tunables.read_ahead_kb.raw"),
    (_topology(warnings=["w" * 10_000]), "warnings[0]"),
    (_topology(hostname="h" * 5000), "hostname"),
])
def test_over_long_text_is_refused(data: dict[str, Any], field: str) -> None:
    """Hostile: megabyte strings in any text field; a mountpoint that is not absolute or holds NUL."""
    refused_at(data, field)


def test_a_hundred_thousand_devices_are_refused() -> None:
    message = refused_at(_topology(*(_device(f"sd{i}") for i in range(100_000))), "devices")
    assert f"at most {MAX_DEVICES}" in message


@pytest.mark.parametrize(("fields", "field"), [
    ({"holders": [f"dm-{i}" for i in range(MAX_DEVICES + 1)]}, "devices[0].holders"),
    ({"mounts": [{"mountpoint": "/m", "fstype": "xfs", "source": "s", "options": ["ro"] * 1000}]},
     "devices[0].mounts[0].options"),
    ({"tunables": {f"t{i}": {"supported": False} for i in range(1000)}}, "devices[0].tunables"),
    ({"roles": ["mounted"] * 100}, "devices[0].roles"),
])
def test_absurd_counts_are_refused(fields: dict[str, Any], field: str) -> None:
    assert "at most" in refused_at(_topology(_device(**fields)), field)


def test_two_devices_with_one_name_are_refused() -> None:
    message = refused_at(_topology(_device("sda"), _device("sdb"), _device("sda")), "devices")
    assert "devices[2].name" in message and "devices[0]" in message


# -- what hosts really report ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sda", "sdaa1", "nvme0n1p1", "nvme0n1", "dm-3", "md126", "md126p2",
                                  "cciss!c0d0", "cciss!c0d0p1", "loop7", "zram0", "vda", "xvdb", "sr0",
                                  "mmcblk0p1", "pmem0.1", "nbd15", "rbd0", "bcache0", "zd16", "host",
                                  "x" * 64])
def test_kernel_names_of_every_family_are_accepted(name: str) -> None:
    assert is_device_name(name)
    Topology.model_validate(_topology(_device(name, parent="sda", holders=[name], sysfs_path=(
        "devices/pci0000:00/0000:00:17.0/ata1/host0/target0:0:0/0:0:0:0/block/" + name))))


@pytest.mark.parametrize("path", [
    "devices/pci0000:00/0000:00:1d.0/0000:3b:00.0/nvme/nvme0/nvme0n1/nvme0n1p1",
    "devices/virtual/block/md126", "devices/platform/host3/session1/target3:0:0/3:0:0:0/block/sdb",
    "devices/pci0000:00/0000:00:02.0/0000:04:00.1/host2/rport-2:0-0/target2:0:0/2:0:0:0/block/sdc",
    "block/sda",  # a tree where /sys/block/X is a plain directory (old kernels, containers)
    "devices/platform/Fixed MDIO bus.0/x",
])
def test_real_sysfs_paths_are_accepted(path: str) -> None:
    Topology.model_validate(_topology(_device(sysfs_path=path)))


@pytest.mark.parametrize("golden", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_the_golden_topologies_validate(golden: str) -> None:
    Topology.model_validate(json.loads((GOLDEN / golden).read_text()))
