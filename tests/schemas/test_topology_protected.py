"""The protected devices an agent reports with its topology (issue 26, points 6 and 10): bounded by
the topology's own devices, one printable sentence each, so a hostile host can neither make the
control plane store 100k entries nor put control characters into what it shows; and the reasons
the agent derives always fit (schemas.protection.reported)."""

from __future__ import annotations

from typing import Any

from stortune.schemas import protection
from stortune.schemas.topology import MAX_DEVICES, PROTECTION_REASON_MAX, Topology
from tests.schemas.test_topology_bounds import _device, _topology, refused, refused_at


def _entry(name: str = "sda", reason: str = "sda backs swap (/dev/sda)", **fields: Any) -> dict[str, Any]:
    return {"name": name, "id": f"name:{name}", "reason": reason, **fields}


# -- hostile first ---------------------------------------------------------------------------------
def test_hostile_100k_protected_entries_are_refused_naming_the_field() -> None:
    errors = refused(_topology(protected=[_entry()] * 100_000))
    assert [f for f, _ in errors] == ["protected"]
    assert str(MAX_DEVICES) in errors[0][1]


def test_hostile_more_protected_entries_than_devices_are_refused() -> None:
    """Below the list's bound: an entry repeated, or one naming a device the topology lacks."""
    twice = refused(_topology(_device("sda"), _device("sdb"), protected=[_entry(), _entry()]))
    assert "protected[1].name 'sda' is listed twice" in twice[0][1]
    absent = refused(_topology(_device("sda"), protected=[_entry(), _entry("zram0")]))
    assert "protected[1]: 'zram0'" in absent[0][1] and "not one of devices[]" in absent[0][1]
    other_id = refused(_topology(_device("sda"), protected=[_entry(id="wwn:0x5000")]))
    assert "protected[0]: 'sda' with id 'wwn:0x5000'" in other_id[0][1]


def test_hostile_a_reason_with_control_characters_is_refused_naming_it() -> None:
    message = refused_at(_topology(protected=[_entry(reason="sda holds /\x1b[2J\x1b[H")]),
                         "protected[0].reason")
    assert "control characters" in message


def test_hostile_an_over_long_reason_or_a_path_for_a_name_is_refused() -> None:
    refused_at(_topology(protected=[_entry(reason="x" * (PROTECTION_REASON_MAX + 1))]), "protected[0].reason")
    refused_at(_topology(protected=[_entry(name="../../sda")]), "protected[0].name")


def test_the_reasons_the_agent_derives_are_made_printable_and_cut_to_the_bound() -> None:
    topology = Topology.model_validate(_topology(_device("sda"), _device("loop7")))
    sent = protection.reported(topology, {"sda": "sda holds the swap file /srv/a\x1bb",
                                          "loop7": "loop7 is on " * 100})
    again = Topology.model_validate(sent.model_dump(mode="json"))  # what the control plane stores
    assert again.protected is not None
    reasons = {p.name: p.reason for p in again.protected}
    assert reasons["sda"] == "sda holds the swap file /srv/a?b"
    assert len(reasons["loop7"]) == PROTECTION_REASON_MAX and reasons["loop7"].endswith("…")


# -- what hosts report -----------------------------------------------------------------------------
def test_a_topology_reporting_nothing_differs_from_one_reporting_none_protected() -> None:
    older = Topology.model_validate(_topology())
    assert older.protected is None and "protected" not in older.model_dump(mode="json")
    newer = Topology.model_validate(_topology(protected=[]))
    assert newer.protected == [] and newer.model_dump(mode="json")["protected"] == []
    assert older.structure_hash() == newer.structure_hash()  # the device graph, as before


def test_the_last_device_of_a_full_topology_may_be_protected() -> None:
    devices = [_device(f"loop{i}") for i in range(3)]
    assert Topology.model_validate(_topology(*devices, protected=[_entry("loop2")])).protected
