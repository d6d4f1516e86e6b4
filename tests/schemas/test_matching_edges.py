"""Match semantics at their edges: a size range includes its bounds, an unknown fact matches no
value, and a selector's labels are an AND. Each of these, broken by hand, passed the whole suite."""

from __future__ import annotations

from typing import Any

import pytest

from stortune.schemas.documents import parse_profile
from stortune.schemas.matching import mismatch
from stortune.schemas.planner import plan
from stortune.schemas.profile import LabelSelector, Match
from stortune.schemas.topology import Device, DeviceKind, Topology, TunableState

GB = 1_000_000_000


def disk(name: str = "sda", **facts: Any) -> Device:
    read_ahead = TunableState(supported=True, value=128, raw="128", writable=True)
    return Device(name=name, kind=DeviceKind.DISK, id=f"wwn:naa.{name}",
                  tunables={"read_ahead_kb": read_ahead}, **facts)


def match(**criteria: Any) -> Match:
    return Match.model_validate(criteria)


def planned(criteria: dict[str, Any], *devices: Device) -> list[str]:
    """The devices a one-rule profile gives read_ahead_kb to, through the planner itself."""
    profile = parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "edges"},
        "spec": {"rules": [{"name": "r", "match": criteria, "settings": {"read_ahead_kb": 4096}}]},
    })
    result = plan([profile], Topology(hostname="h", devices=list(devices)))
    return sorted(c.device for c in result.changes)


# -- size: both bounds are inclusive -------------------------------------------------------------


def test_hostile_one_byte_past_size_max_is_refused() -> None:
    why = mismatch(match(size={"max": "2TB"}), disk(size_bytes=2000 * GB + 1))
    assert why == "size 2.0 TB is outside [None, 2TB]"


def test_a_device_exactly_at_size_max_matches() -> None:
    assert mismatch(match(size={"max": "2TB"}), disk(size_bytes=2000 * GB)) is None
    assert mismatch(match(size={"max": 2000 * GB}), disk(size_bytes=2000 * GB)) is None


def test_a_device_exactly_at_size_min_matches_and_one_byte_below_does_not() -> None:
    assert mismatch(match(size={"min": "1TB"}), disk(size_bytes=1000 * GB)) is None
    assert mismatch(match(size={"min": "1TB"}), disk(size_bytes=1000 * GB - 1)) is not None


def test_a_range_of_one_size_matches_that_size_only() -> None:
    exact = {"size": {"min": "1TB", "max": "1TB"}}
    devices = [disk("sda", size_bytes=1000 * GB - 1), disk("sdb", size_bytes=1000 * GB),
               disk("sdc", size_bytes=1000 * GB + 1)]
    assert planned(exact, *devices) == ["sdb"]


# -- rotational: unknown is neither true nor false ------------------------------------------------


@pytest.mark.parametrize("wanted", [False, True])
def test_hostile_an_unknown_rotational_matches_neither_value(wanted: bool) -> None:
    why = mismatch(match(rotational=wanted), disk(rotational=None))
    assert why == f"rotational is unknown, rule wants {str(wanted).lower()}"
    assert planned({"rotational": wanted}, disk("sda", rotational=None)) == []


def test_a_known_rotational_matches_its_own_value_only() -> None:
    devices = [disk("hdd", rotational=True), disk("ssd", rotational=False), disk("unk", rotational=None)]
    assert planned({"rotational": False}, *devices) == ["ssd"]
    assert planned({"rotational": True}, *devices) == ["hdd"]


# -- label selectors: every label must hold ------------------------------------------------------


@pytest.mark.parametrize("labels", [
    {"role": "streamer", "zone": "b"},   # first holds, second differs
    {"role": "db", "zone": "a"},         # second holds, first differs
    {"role": "streamer"},                # second absent
    {"zone": "a"},                       # first absent
])
def test_hostile_a_selector_with_two_labels_where_only_one_matches_selects_nothing(
        labels: dict[str, str]) -> None:
    selector = LabelSelector(matchLabels={"role": "streamer", "zone": "a"})
    assert selector.matches(labels) is False


def test_a_selector_with_two_labels_selects_a_host_with_both() -> None:
    selector = LabelSelector(matchLabels={"role": "streamer", "zone": "a"})
    assert selector.matches({"role": "streamer", "zone": "a", "extra": "x"}) is True


@pytest.mark.parametrize("labels", [{"role": "streamer", "zone": "b"}, {"role": "db", "zone": "a"}])
def test_hostile_labels_and_expressions_are_an_and(labels: dict[str, str]) -> None:
    selector = LabelSelector.model_validate({
        "matchLabels": {"role": "streamer"},
        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})
    assert selector.matches(labels) is False
    assert selector.matches({"role": "streamer", "zone": "a"}) is True
