"""Profiles that match hardware RAID facts (``match.controller``): bounds first, then answers."""

from __future__ import annotations

from typing import Any

import pytest

from stortune.schemas.controllers import BackupUnit, VolumeRef
from stortune.schemas.documents import DocumentError, load_profiles, parse_profile
from stortune.schemas.matching import mismatch
from stortune.schemas.patterns import MAX_PATTERN_LENGTH
from stortune.schemas.profile import MAX_PATTERNS_PER_PROFILE, Match, pattern_count
from stortune.schemas.topology import Device, DeviceKind


def profile(controller: str, extra_rules: str = "") -> str:
    return f"""
apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: perc-video}}
spec:
  rules:
    - name: raid5-volumes
      match: {{kind: [disk], controller: {controller}}}
      settings: {{read_ahead_kb: 4096}}
{extra_rules}"""


def problems(text: str) -> list[tuple[str, str]]:
    with pytest.raises(DocumentError) as info:
        load_profiles(text, "p.yaml")
    return [(p.path, p.message) for p in info.value.problems]


def ref(**kw: Any) -> VolumeRef:
    base: dict[str, Any] = dict(adapter="perc", controller=0, virtual_drive=0, mapped_by="wwn",
                                model="PERC H740P Mini", driver="megaraid_sas", raid_level="raid5",
                                strip_size_bytes=64 << 10, physical_drives=4,
                                backup=BackupUnit(kind="bbu"))
    return VolumeRef(**{**base, **kw})


def disk(controller: VolumeRef | None) -> Device:
    return Device(name="sdb", kind=DeviceKind.DISK, id="wwn:naa.600062b2", controller=controller)


# -- hostile ---------------------------------------------------------------------------------


def test_hostile_an_empty_controller_block_is_refused() -> None:
    [(path, message)] = problems(profile("{}"))
    assert path == "spec.rules[0].match.controller"
    assert "at least one criterion" in message


@pytest.mark.parametrize(("block", "path", "words"), [
    ("{adapter: [lsi]}", "spec.rules[0].match.controller.adapter[0]", "megaraid"),
    ("{adapter: []}", "spec.rules[0].match.controller.adapter", "at least 1"),
    ("{adapter: [perc, perc, perc, perc, perc]}", "spec.rules[0].match.controller.adapter",
     "at most 4"),
    ("{raidLevel: [" + ", ".join(["raid5"] * 33) + "]}", "spec.rules[0].match.controller.raidLevel",
     "at most 32"),
    ("{raidLevel: [" + "x" * 33 + "]}", "spec.rules[0].match.controller.raidLevel[0]", "at most 32"),
    ("{model: '(a'}", "spec.rules[0].match.controller.model", "missing )"),
    ("{model: '" + "a" * (MAX_PATTERN_LENGTH + 1) + "'}", "spec.rules[0].match.controller.model",
     f"at most {MAX_PATTERN_LENGTH}"),
    ("{driver: '(x)\\1'}", "spec.rules[0].match.controller.driver", "invalid escape sequence"),
    ("{stripSize: {min: 1MiB, max: 64KiB}}", "spec.rules[0].match.controller.stripSize",
     "larger than max"),
    ("{stripSize: {}}", "spec.rules[0].match.controller.stripSize", "give min, max or both"),
    ("{raid: [raid5]}", "spec.rules[0].match.controller.raid", "unknown field"),
])
def test_hostile_bad_controller_criteria_name_their_field(block: str, path: str, words: str) -> None:
    found = problems(profile(block))
    assert any(p == path and words.lower() in m.lower() for p, m in found), found


def test_hostile_controller_patterns_count_against_the_profiles_budget() -> None:
    rules = [{"name": f"r{i}", "match": {"controller": {"model": "PERC.*", "driver": "megaraid_sas"}},
              "settings": {"read_ahead_kb": 4096}} for i in range(MAX_PATTERNS_PER_PROFILE // 2 + 1)]
    assert pattern_count(rules) == MAX_PATTERNS_PER_PROFILE + 2
    text = profile("{model: x}", "\n".join(
        f"    - {{name: r{i}, match: {{controller: {{model: a, driver: b}}}},"
        f" settings: {{read_ahead_kb: 4096}}}}" for i in range(MAX_PATTERNS_PER_PROFILE // 2)))
    assert any("patterns" in m and "at most 1024" in m for _, m in problems(text))


# -- documents -------------------------------------------------------------------------------


def test_raid_levels_are_kept_in_the_words_devices_carry() -> None:
    [doc] = load_profiles(profile("{adapter: [perc, megaraid], raidLevel: [RAID5, 'RAID 1+0', raid6],"
                                  " stripSize: {min: 64KiB, max: 1MiB}, model: 'PERC H7.*'}"))
    want = doc.spec.rules[0].match.controller
    assert want is not None and want.raidLevel == ["raid5", "raid10", "raid6"]
    assert want.adapter == ["perc", "megaraid"] and want.stripSize is not None
    assert want.stripSize.bounds() == (64 << 10, 1 << 20)
    assert parse_profile(doc.document()) == doc  # round trip, normalised words included


# -- answers ---------------------------------------------------------------------------------


def test_a_device_no_tool_maps_is_not_a_hardware_raid_volume() -> None:
    match = Match(controller={"adapter": ["perc"]})
    assert mismatch(match, disk(None)) == (
        "not a hardware RAID volume (no vendor tool maps this device to a virtual drive)")


@pytest.mark.parametrize(("controller", "volume", "why"), [
    ({"adapter": ["megaraid"]}, {}, "controller adapter perc is not one of ['megaraid']"),
    ({"model": "PERC H3.*"}, {}, "controller model 'PERC H740P Mini' does not match /PERC H3.*/"),
    ({"driver": "megaraid_sas"}, {"driver": None},
     "controller driver is unknown (the vendor tool does not report it), rule wants /megaraid_sas/"),
    ({"raidLevel": ["raid5"]}, {"raid_level": "RAID10"},
     "controller raidLevel raid10 is not one of ['raid5']"),
    ({"stripSize": {"min": "256KiB"}}, {}, "controller strip size 64 KiB is outside [256KiB, any]"),
    ({"stripSize": {"max": 32768}}, {"strip_size_bytes": 1 << 20},
     "controller strip size 1 MiB is outside [0, 32768]"),
    ({"stripSize": {"max": "1MiB"}}, {"strip_size_bytes": None},
     "controller strip size is unknown (the vendor tool does not report it)"),
])
def test_mismatch_says_which_controller_fact_fails(controller: dict[str, Any],
                                                   volume: dict[str, Any], why: str) -> None:
    assert mismatch(Match(controller=controller), disk(ref(**volume))) == why


def test_every_criterion_holding_matches() -> None:
    match = Match(kind=[DeviceKind.DISK], controller={
        "adapter": ["perc", "megaraid"], "model": "PERC H7.*", "driver": "megaraid_sas",
        "raidLevel": ["RAID5"], "stripSize": {"min": "64KiB", "max": "64KiB"}})
    assert mismatch(match, disk(ref())) is None
