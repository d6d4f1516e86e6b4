"""At submission: the experiment against the chosen device, every problem named by its field."""

from __future__ import annotations

import pytest

from stortune.schemas.topology import Device, DeviceKind, TunableState
from stortune.schemas.tuning.experiment import baseline_point, check_against_device
from tests.schemas.topologies import streamer_with_md
from tests.schemas.tuning.docs import experiment


def md_and_disks() -> tuple[Device, list[Device]]:
    topo = streamer_with_md()
    md0 = topo.device("md0")
    assert md0 is not None
    return md0, [d for d in topo.devices if d.name in ("sdb", "sdc", "sdd")]


def paths(problems: list) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(p.path, p.message) for p in problems]


def test_a_scheduler_the_kernel_does_not_offer_names_the_value() -> None:
    md0, disks = md_and_disks()
    exp = experiment(target={"device": {"kind": ["md"]}}, parameters=[
        {"tunable": "read_ahead_kb", "values": [1024, 4096]},
        {"tunable": "stripe_cache_size", "values": [256, 4096]},
        {"tunable": "scheduler", "values": ["none", "mq-deadline"]}])
    found = paths(check_against_device(exp, md0, disks))
    assert len(found) == 1
    assert found[0][0] == "spec.parameters[2].values[1]" and "not offered" in found[0][1]


def test_beneath_needs_devices_beneath_of_a_kind_that_takes_the_tunable() -> None:
    md0, disks = md_and_disks()
    exp = experiment(target={"device": {"kind": ["md"]}}, parameters=[
        {"tunable": "scheduler", "at": "beneath", "values": ["none", "bfq", "kyber"]}])
    assert check_against_device(exp, md0, disks) == []
    [nothing] = check_against_device(exp, md0, [])
    assert nothing.path == "spec.parameters[0].at" and "nothing lies beneath md0" in nothing.message
    parts = [d.model_copy(update={"kind": DeviceKind.PARTITION, "name": d.name + "1"}) for d in disks]
    [wrong] = check_against_device(exp, md0, parts)
    assert wrong.path == "spec.parameters[0].tunable" and "none of the devices beneath" in wrong.message


def test_a_tunable_of_another_kind_or_absent_names_the_tunable() -> None:
    sda = streamer_with_md().device("sda")
    assert sda is not None
    exp = experiment(target={"device": {"kind": ["md", "disk"]}}, parameters=[
        {"tunable": "wbt_lat_usec", "values": [0, 2000]}, {"tunable": "stripe_cache_size", "values": [512]}])
    found = paths(check_against_device(exp, sda))
    assert [p for p, _ in found] == ["spec.parameters[0].tunable", "spec.parameters[1].tunable"]
    assert "not supported" in found[0][1] and "does not apply to disk" in found[1][1]


def test_a_value_above_the_devices_bound_names_the_value() -> None:
    topo = streamer_with_md()
    sda = topo.device("sda")
    assert sda is not None
    exp = experiment(target={"device": {"kind": ["disk"]}}, parameters=[
        {"tunable": "max_sectors_kb", "values": [256, 512, 2048]}])
    [(path, message)] = paths(check_against_device(exp, sda))
    assert path == "spec.parameters[0].values[2]" and "exceeds max_hw_sectors_kb = 1024" in message


def test_the_baseline_is_read_from_the_devices() -> None:
    md0, disks = md_and_disks()
    exp = experiment(target={"device": {"kind": ["md"]}}, parameters=[
        {"tunable": "read_ahead_kb", "values": [4096]},
        {"tunable": "scheduler", "at": "beneath", "values": ["none"]}])
    assert baseline_point(exp, md0, disks) == {"read_ahead_kb": 1024, "scheduler@beneath": "mq-deadline"}
    disks[1].tunables["scheduler"] = TunableState(supported=True, value="bfq", writable=True)
    with pytest.raises(ValueError, match="differ"):
        baseline_point(exp, md0, disks)
    md0.tunables.pop("read_ahead_kb")
    with pytest.raises(ValueError, match="read_ahead_kb: the current value on md0 is unknown"):
        baseline_point(exp, md0, disks[:1])
