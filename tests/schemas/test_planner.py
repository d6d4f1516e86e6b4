"""The planner as data: expected ordered changes, rejections and precedence."""

from __future__ import annotations

import yaml

from stortune.schemas.documents import parse_profile
from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
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


def test_observed_values_override_discovery() -> None:
    topo = streamer_with_md()
    vod = profile("vod", 1, [rule("r", "{name: [sda]}", "{read_ahead_kb: 4096}")])
    observed = {d.name: dict(d.tunables) for d in topo.devices}
    observed["sda"]["read_ahead_kb"] = observed["sda"]["read_ahead_kb"].model_copy(
        update={"value": 4096})
    assert plan([vod], topo, observed).empty
