"""Every numeric bound of the catalog at its edge: the limit is taken, one step past it is refused.

Only minima were tested before: with the maximum check off by one, ``nomerges: 3`` (the kernel's
"2 = no merging" is the last meaning it has) passed the whole suite and was applied.
"""

from __future__ import annotations

import json

import pytest

from stortune.schemas import catalog, export
from stortune.schemas.catalog import Tunable, TunableValueError
from stortune.schemas.documents import DocumentError, load_profiles
from stortune.schemas.topology import DeviceKind

_BOUNDED = [t for t in catalog.ordered() if t.maximum is not None]
_FLOORED = [t for t in catalog.ordered() if t.minimum is not None]


def _step(t: Tunable) -> int:
    # read_ahead_kb only takes multiples of 4: max + 1 is refused for that reason already, so
    # the next value its syntax allows is the one that tests the maximum.
    return t.multiple_of or 1


def _profile(t: Tunable, value: int) -> str:
    kind = sorted(k.value for k in t.applies_to)[0]
    return ("apiVersion: stortune/v1\nkind: StorageProfile\nmetadata: {name: edge}\n"
            f"spec:\n  rules:\n    - name: edge\n      match: {{kind: [{kind}]}}\n"
            f"      settings: {{{t.name}: {value}}}\n")


def test_the_bounded_tunables_are_the_numeric_ones() -> None:
    # A tunable that gains a maximum is picked up by the tests below; one that loses it is noticed here.
    assert {t.name for t in _BOUNDED} == {
        t.name for t in catalog.ordered()
        if t.scope != "controller" and not isinstance(t, catalog.ChoiceTunable)}


@pytest.mark.parametrize("t", _BOUNDED, ids=lambda t: t.name)
def test_hostile_one_step_past_a_maximum_is_refused(t: Tunable) -> None:
    assert t.maximum is not None
    past = t.maximum + _step(t)
    with pytest.raises(TunableValueError, match=f"must be <= {t.maximum}\\b"):
        t.validate(past)
    with pytest.raises(DocumentError) as info:
        load_profiles(_profile(t, past), "edge.yaml")
    assert [(p.path, p.message) for p in info.value.problems] == [
        (f"spec.rules[0].settings.{t.name}", f"must be <= {t.maximum}{t._unit_hint()}, got {past}")]


@pytest.mark.parametrize("t", _BOUNDED, ids=lambda t: t.name)
def test_a_maximum_itself_is_accepted(t: Tunable) -> None:
    assert t.maximum is not None
    assert t.validate(t.maximum) == t.maximum
    (profile,) = load_profiles(_profile(t, t.maximum), "edge.yaml")
    assert profile.spec.rules[0].values() == {t.name: t.maximum}


@pytest.mark.parametrize("t", _FLOORED, ids=lambda t: t.name)
def test_a_minimum_is_accepted_and_one_step_below_refused(t: Tunable) -> None:
    assert t.minimum is not None
    assert t.validate(t.minimum) == t.minimum
    with pytest.raises(TunableValueError, match=f"must be >= {t.minimum}\\b"):
        t.validate(t.minimum - _step(t))


def test_nomerges_three_is_refused() -> None:
    """The case the issue names: 0, 1 and 2 are the kernel's meanings, 3 is none of them."""
    nomerges = catalog.get("nomerges")
    assert [nomerges.validate(v) for v in (0, 1, 2)] == [0, 1, 2]
    with pytest.raises(TunableValueError, match="must be <= 2"):
        nomerges.validate(3)


def test_the_exported_schema_states_the_same_maxima() -> None:
    """Editors validate against the exported JSON Schema: its maxima are the catalog's."""
    settings = json.loads(export.render()["storageprofile.schema.json"])["$defs"]["Settings"]["properties"]
    for t in _BOUNDED:
        entry = settings[t.name]
        numeric = next(s for s in entry.get("oneOf", [entry]) if s.get("type") == "integer")
        assert numeric["maximum"] == t.maximum, t.name


def test_hostile_one_past_a_devices_own_bound_is_refused() -> None:
    """max_sectors_kb is also bound by the device's max_hw_sectors_kb: the bound itself is taken."""
    t = catalog.get("max_sectors_kb")
    facts = catalog.DeviceFacts(kind=DeviceKind.DISK, supported=True, writable=True, maximum=1024)
    refused = catalog.check_on_device(t, 1025, facts)
    assert refused is not None and refused.fatal
    assert refused.reason == "max_sectors_kb 1025 exceeds max_hw_sectors_kb = 1024 for this device"
    assert catalog.check_on_device(t, 1024, facts) is None
