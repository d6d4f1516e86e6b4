"""The planner as data: expected ordered changes, rejections and precedence."""

from __future__ import annotations

import yaml

from stortune.schemas.documents import parse_profile
from stortune.schemas.plan import Plan
from stortune.schemas.planner import observed_of, plan, releases
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import RecordedOriginal, Topology, TunableState
from tests.schemas.topologies import streamer_with_md


def profile(name: str, priority: int, rules: list[dict[str, object]],
            mode: str = "enforce") -> StorageProfile:
    return parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile",
        "metadata": {"name": name},
        "spec": {"hostSelector": {"matchLabels": {"a": "b"}}, "priority": priority,
                 "mode": mode, "rules": rules},
    })


def rule(name: str, match: str, settings: str) -> dict[str, object]:
    return {"name": name, "match": yaml.safe_load(match), "settings": yaml.safe_load(settings)}


def changes(p: object) -> list[tuple[str, str, object, object]]:
    return [(c.device, c.tunable, c.current, c.desired) for c in p.changes]  # type: ignore[attr-defined]


def test_changes_in_catalog_order_then_device_order() -> None:
    vod = profile("vod", 100, [
        rule("raid", "{kind: [disk], model: 'PERC.*'}",
             "{read_ahead_kb: 4096, nr_requests: 128, scheduler: bfq}"),
        rule("arrays", "{kind: [md], raidLevel: [raid5]}", "{stripe_cache_size: 4096}"),
        rule("members", "{role: [md-member]}", "{scheduler: mq-deadline}"),
        rule("resync", "{kind: [host]}", "{dev.raid.speed_limit_min: 50000}"),
    ])
    result = plan([vod], streamer_with_md())
    assert changes(result) == [
        ("sda", "scheduler", "mq-deadline", "bfq"),      # scheduler first: it resets nr_requests
        ("sda", "nr_requests", 64, 128),
        ("sda", "read_ahead_kb", 128, 4096),
        ("md0", "stripe_cache_size", 256, 4096),
        ("host", "dev.raid.speed_limit_min", 1000, 50000),
    ]
    # scheduler on md members is a partition setting: skipped, not fatal
    skipped = {(r.device, r.tunable, r.fatal) for r in result.rejections}
    assert skipped == {(f"sd{x}1", "scheduler", False) for x in "bcd"}
    assert "set it on the parent disk" in result.rejections[0].reason


def test_rejections_name_the_reason() -> None:
    bad = profile("bad", 1, [
        rule("a", "{name: [sda]}", "{scheduler: kyberx, max_sectors_kb: 4096, wbt_lat_usec: 0}"),
        rule("b", "{name: ['md*']}", "{scheduler: mq-deadline, nr_requests: 64}"),
    ])
    result = plan([bad], streamer_with_md())
    reasons = {(r.device, r.tunable): (r.fatal, r.reason) for r in result.rejections}
    assert reasons[("sda", "scheduler")] == (
        True, "scheduler 'kyberx' is not offered by this kernel for this device;"
              " offered: mq-deadline, kyber, bfq, none")
    assert reasons[("sda", "max_sectors_kb")] == (
        True, "max_sectors_kb 4096 exceeds max_hw_sectors_kb = 1024 for this device")
    assert reasons[("md0", "scheduler")][0] is True
    assert reasons[("md0", "nr_requests")] == (
        False, "nr_requests does not apply to md devices, only to disk, dm, loop")
    assert reasons[("sda", "wbt_lat_usec")] == (
        False, "wbt_lat_usec is not supported on this device: not reported by discovery")
    assert result.changes == [] and len(result.fatal) == 3


def test_precedence_priority_then_name_then_later_rule() -> None:
    low = profile("aaa-low", 10, [rule("r", "{name: [sda]}", "{read_ahead_kb: 512}")])
    high = profile("zzz-high", 20, [
        rule("general", "{kind: [disk]}", "{read_ahead_kb: 1024}"),
        rule("specific", "{name: [sda]}", "{read_ahead_kb: 2048}"),
    ])
    tie = profile("bbb-tie", 20, [rule("r", "{name: [sda]}", "{read_ahead_kb: 8192}")])
    result = plan([low, high, tie], streamer_with_md())
    (sda,) = [d for d in result.desired if d.device == "sda"]
    assert (sda.source.profile, sda.source.rule, sda.desired) == ("bbb-tie", "r", 8192)
    assert any("equal priority, profile name 'bbb-tie' sorts first" in o for o in sda.overridden)
    assert any("aaa-low/r (priority 10) wanted 512" in o and "priority 20 > 10" in o
               for o in sda.overridden)
    # the same inputs in any order give the same plan
    assert plan([tie, low, high], streamer_with_md()) == result
    without_tie = plan([low, high], streamer_with_md())
    (sda,) = [d for d in without_tie.desired if d.device == "sda"]
    assert (sda.source.rule, sda.desired) == ("specific", 2048)
    assert any("a later rule of the same profile wins" in o for o in sda.overridden)


def test_explanations_say_why_a_rule_did_not_match() -> None:
    vod = profile("vod", 1, [rule("raid", "{kind: [disk], model: 'PERC.*', rotational: true}",
                                  "{read_ahead_kb: 4096}")])
    result = plan([vod], streamer_with_md())
    why = {e.device: e.rules[0].reason for e in result.explanations}
    assert why["sda"] == "all criteria hold"
    assert why["sdb"] == "model 'ST4000NM0033-9ZM' does not match /PERC.*/"
    assert why["md0"] == "kind md is not one of ['disk']"


def test_in_sync_is_empty_and_audit_is_not_enforced() -> None:
    synced = profile("s", 1, [rule("r", "{name: [sda]}", "{read_ahead_kb: 128, nr_requests: 64}")])
    result = plan([synced], streamer_with_md())
    assert result.empty and all(d.in_sync for d in result.desired)
    audit = profile("a", 1, [rule("r", "{name: [sda]}", "{read_ahead_kb: 256}")], mode="audit")
    result = plan([audit], streamer_with_md())
    assert len(result.changes) == 1 and result.enforced().changes == []


def test_a_wanted_value_in_place_is_written_again_after_a_change_that_resets_it() -> None:
    """sda has nr_requests 64 as wanted, but the scheduler switch the profile also wants resets
    it: the plan writes it again after the switch (the executor writes only if it did change).
    Found on loop devices: from bfq (which turns the writeback throttle off, wbt_lat_usec 0) to
    none, a wanted wbt_lat_usec 0 was "in sync" and the switch turned the throttle back on."""
    both = profile("p", 1, [rule("r", "{name: [sda]}", "{scheduler: bfq, nr_requests: 64}")])
    assert changes(plan([both], streamer_with_md())) == [
        ("sda", "scheduler", "mq-deadline", "bfq"),
        ("sda", "nr_requests", 64, 64),
    ]
    # Nothing to switch: nothing to write again, the plan stays empty.
    kept = profile("p", 1, [rule("r", "{name: [sda]}", "{scheduler: mq-deadline, nr_requests: 64}")])
    assert plan([kept], streamer_with_md()).empty


def test_observed_values_override_discovery() -> None:
    topo = streamer_with_md()
    vod = profile("vod", 1, [rule("r", "{name: [sda]}", "{read_ahead_kb: 4096}")])
    observed = {d.name: dict(d.tunables) for d in topo.devices}
    observed["sda"]["read_ahead_kb"] = observed["sda"]["read_ahead_kb"].model_copy(
        update={"value": 4096})
    assert plan([vod], topo, observed).empty


# -- restorations: recorded originals no profile wants any more ------------------------


def recorded(topo: Topology, device: str, tunable: str, now: int | str, **original: object) -> None:
    """Mark a tunable as the agent reports one stortune changed: its journal's original on the state."""
    dev = topo.device(device)
    states = topo.host_tunables if dev is None else dev.tunables
    states[tunable] = states[tunable].model_copy(update={
        "value": now, "raw": str(now), "original": RecordedOriginal.model_validate(original)})


def restorations(p: Plan) -> list[tuple[str, str, object, object, str]]:
    return [(r.device, r.tunable, r.current, r.desired, r.to) for r in p.restorations]


def test_a_removed_setting_is_a_restoration_and_the_plan_is_not_empty() -> None:
    topo = streamer_with_md()
    recorded(topo, "sda", "read_ahead_kb", 4096, value=128)
    recorded(topo, "host", "dev.raid.speed_limit_min", 50000, value=1000)
    recorded(topo, "md0", "stripe_cache_size", 256, value=256)  # already back: nothing to do
    other = profile("other", 1, [rule("r", "{name: [sda]}", "{nr_requests: 64}")])
    result = plan([other], topo)
    assert result.changes == []
    assert restorations(result) == [
        ("sda", "read_ahead_kb", 4096, 128, "original"),
        ("host", "dev.raid.speed_limit_min", 50000, 1000, "original"),
    ]
    assert result.restorations[0].device_id == "wwn:naa.6001"
    assert not result.empty
    # Restorations are made whatever the profiles' mode: no profile wants those values.
    assert result.enforced().restorations == result.restorations
    # What converge settles includes the one already in place (its record is forgotten).
    assert [(r.device, r.tunable) for r in releases(result, topo)] == [
        ("sda", "read_ahead_kb"), ("md0", "stripe_cache_size"), ("host", "dev.raid.speed_limit_min")]


def test_a_wanted_or_rejected_setting_is_no_restoration() -> None:
    topo = streamer_with_md()
    recorded(topo, "sda", "read_ahead_kb", 4096, value=128)
    recorded(topo, "sda", "max_sectors_kb", 512, value=256)
    wanted = profile("p", 1, [rule("r", "{name: [sda]}", "{read_ahead_kb: 8192, max_sectors_kb: 4096}")])
    result = plan([wanted], topo)
    assert changes(result) == [("sda", "read_ahead_kb", 4096, 8192)]
    # max_sectors_kb 4096 exceeds the device's limit: the apply is refused, nothing is put back.
    assert [r.tunable for r in result.fatal] == ["max_sectors_kb"]
    assert result.restorations == []


def test_side_effect_originals_are_no_restoration_while_their_cause_is_wanted() -> None:
    """Switching the scheduler reset nr_requests; the profile sets only the scheduler."""
    topo = streamer_with_md()
    recorded(topo, "sda", "scheduler", "bfq", value="mq-deadline")
    recorded(topo, "sda", "nr_requests", 256, value=64, direct=False, cause="scheduler", cause_left=256)
    only_scheduler = profile("p", 1, [rule("r", "{name: [sda]}", "{scheduler: bfq}")])
    result = plan([only_scheduler], topo)
    assert result.empty and result.restorations == []
    assert releases(result, topo) == []
    # The scheduler no longer wanted: both go back, the scheduler first (it resets the other).
    result = plan([], topo)
    assert restorations(result) == [
        ("sda", "scheduler", "bfq", "mq-deadline", "original"),
        ("sda", "nr_requests", 256, 64, "original"),
    ]


def test_a_setting_removed_while_its_cause_stays_goes_back_to_what_the_cause_left() -> None:
    topo = streamer_with_md()
    recorded(topo, "sda", "scheduler", "bfq", value="mq-deadline")
    recorded(topo, "sda", "nr_requests", 512, value=64, direct=True, cause="scheduler", cause_left=256)
    result = plan([profile("p", 1, [rule("r", "{name: [sda]}", "{scheduler: bfq}")])], topo)
    (back,) = result.restorations
    assert (back.tunable, back.current, back.desired, back.to, back.cause) == (
        "nr_requests", 512, 256, "cause", "scheduler")
    # A cause that stortune never changed (no original recorded) holds nothing.
    topo = streamer_with_md()
    recorded(topo, "sda", "nr_requests", 512, value=64, direct=True, cause="scheduler", cause_left=256)
    result = plan([profile("p", 1, [rule("r", "{name: [sda]}", "{scheduler: mq-deadline}")])], topo)
    assert restorations(result) == [("sda", "nr_requests", 512, 64, "original")]


def test_hostile_recorded_originals_are_ignored_not_fatal() -> None:
    """A state naming a tunable this version does not know (a newer agent), or a device the
    topology does not have, plans like any other: the rest is still planned."""
    topo = streamer_with_md()
    recorded(topo, "sda", "read_ahead_kb", 4096, value=128)
    observed = observed_of(topo)
    observed["sda"]["future_knob"] = TunableState(
        supported=True, value=1, original=RecordedOriginal(value=0))
    observed["sdz"] = {"read_ahead_kb": TunableState(supported=True, value=1,
                                                     original=RecordedOriginal(value=2))}
    result = plan([], topo, observed)
    assert restorations(result) == [("sda", "read_ahead_kb", 4096, 128, "original")]
