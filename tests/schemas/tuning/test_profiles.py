"""The overlay that sets a trial's values, and the recommended profile a repository commits."""

from __future__ import annotations

from stortune.schemas.documents import parse_profile
from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import RecordedOriginal, Topology
from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.overlay import devices_beneath, overlay_conflicts, overlay_profile
from stortune.schemas.tuning.recommend import class_match, recommended_profile
from stortune.schemas.tuning.simulate import Surface, drive, flat
from tests.schemas.topologies import streamer_with_md
from tests.schemas.tuning.docs import experiment


def desired() -> StorageProfile:
    return parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "arrays"},
        "spec": {"priority": 100, "rules": [
            {"name": "md", "match": {"kind": ["md"]}, "settings": {"read_ahead_kb": 4096}},
            {"name": "disks", "match": {"kind": ["disk"]}, "settings": {"scheduler": "mq-deadline"}}]}})


def md_experiment() -> tuple[Topology, list[str]]:
    topo = streamer_with_md()
    return topo, ["sdb", "sdc", "sdd"]


def test_the_overlay_wins_over_the_desired_profiles_and_leaving_it_restores() -> None:
    topo, disks = md_experiment()
    md0 = topo.device("md0")
    assert md0 is not None
    beneath = [d for d in topo.devices if d.name in disks]
    point = {"read_ahead_kb": 512, "stripe_cache_size": 4096, "scheduler@beneath": "none"}
    overlay = overlay_profile("md-stream", point, md0, beneath)
    assert overlay.name == "tune-md-stream"
    assert overlay.metadata.annotations["stortune.io/experiment"] == "md-stream"
    with_trial = plan([desired(), overlay], topo)
    wanted = {(d.device, d.tunable): d.desired for d in with_trial.desired}
    assert wanted[("md0", "read_ahead_kb")] == 512
    assert wanted[("md0", "stripe_cache_size")] == 4096
    assert all(wanted[(disk, "scheduler")] == "none" for disk in disks)
    assert ("sda", "scheduler") in wanted and wanted[("sda", "scheduler")] == "mq-deadline"
    # After the trial: the journal holds the original, the desired profiles alone put it back.
    state = topo.device("md0").tunables["stripe_cache_size"]  # type: ignore[union-attr]
    state.value = 4096
    state.original = RecordedOriginal(value=256)
    after = plan([desired()], topo)
    restored = [(r.device, r.tunable, r.desired) for r in after.restorations]
    assert restored == [("md0", "stripe_cache_size", 256)]


def test_a_desired_profile_that_would_beat_the_overlay_is_named() -> None:
    topo, _ = md_experiment()
    md0 = topo.device("md0")
    assert md0 is not None
    overlay = overlay_profile("md-stream", {"read_ahead_kb": 512}, md0)
    strong = desired().model_copy(update={"spec": desired().spec.model_copy(update={"priority": 1000})})
    assert overlay_conflicts(overlay, [desired(), strong]) == ["arrays"]
    assert overlay_conflicts(overlay, [desired()]) == []


def test_the_recommended_profile_matches_the_device_class_by_stable_facts() -> None:
    topo, disks = md_experiment()
    md0, sdb = topo.device("md0"), topo.device("sdb")
    assert md0 is not None and sdb is not None
    exp = experiment(target={"device": {"kind": ["md"]}}, parameters=[
        {"tunable": "read_ahead_kb", "values": [1024, 4096]},
        {"tunable": "scheduler", "at": "beneath", "values": ["mq-deadline", "none"]}])
    eng = Engine(exp.spec, {"read_ahead_kb": 1024, "scheduler@beneath": "mq-deadline"})

    def better_with_4096(point: object) -> dict[str, float]:
        assert isinstance(point, dict)
        return {"read_bandwidth": 2e8 * (1.5 if point["read_ahead_kb"] == 4096 else 1.0)}

    out = drive(eng, Surface(better_with_4096, seed=1))
    assert not out.recommendation.keepCurrent
    profile = recommended_profile(exp, out, md0, topo, beneath=[d for d in topo.devices if d.name in disks])
    rules = {r.name: r for r in profile.spec.rules}
    assert rules["target"].match.raidLevel == ["raid5"] and rules["target"].match.name is None
    assert rules["target"].values() == {"read_ahead_kb": 4096}
    assert rules["beneath-disk"].match.model is not None and rules["beneath-disk"].match.name is None
    notes = profile.metadata.annotations
    assert notes["stortune.io/experiment"] == exp.name and notes["stortune.io/keep-current"] == "false"
    assert notes["stortune.io/gain"].startswith("+") and ".." in notes["stortune.io/interval"]
    # It is a profile like any other: it parses back, and on this host it sets what was found.
    assert parse_profile(profile.document()) == profile
    wanted = {(d.device, d.tunable): d.desired for d in plan([profile], topo).desired}
    assert wanted[("md0", "read_ahead_kb")] == 4096


def test_keeping_the_current_settings_is_a_profile_of_the_current_values() -> None:
    topo, _ = md_experiment()
    sda = topo.device("sda")
    assert sda is not None
    exp = experiment(target={"device": {"kind": ["disk"]}})
    base = {"read_ahead_kb": 128, "nr_requests": 64}
    out = drive(Engine(exp.spec, base), Surface(flat, seed=2))
    profile = recommended_profile(exp, out, sda, topo)
    assert profile.spec.rules[0].values() == base
    assert profile.metadata.annotations["stortune.io/keep-current"] == "true"
    match = profile.spec.rules[0].match
    assert match.driver is not None and match.model is not None and match.name is None


def test_a_device_without_stable_facts_is_matched_by_name() -> None:
    topo, _ = md_experiment()
    part = topo.device("sdb1")
    assert part is not None
    bare = part.model_copy(update={"roles": [], "kind": topo.device("sdb").kind})  # type: ignore[union-attr]
    assert class_match(bare)["name"] == ["sdb1"]


def test_beneath_an_md_array_are_its_partitions_and_their_disks() -> None:
    topo = streamer_with_md()
    below = devices_beneath(topo, "md0")
    assert [d.name for d in below] == ["sdb1", "sdc1", "sdd1", "sdb", "sdc", "sdd"]
    md0 = topo.device("md0")
    assert md0 is not None
    overlay = overlay_profile("md-stream", {"scheduler@beneath": "none"}, md0, below)
    # By stable id, never by kernel name (issue 26: names move between devices).
    assert [(r.name, r.match.id, r.match.name) for r in overlay.spec.rules] == [
        ("beneath-disk", ["serial:Zb", "serial:Zc", "serial:Zd"], None)]
