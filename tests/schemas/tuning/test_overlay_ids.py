"""Issue 26, point 2: an experiment's overlay names its devices by stable id, so trial values
never follow a kernel name onto another device (loop devices re-attached in another order)."""

from __future__ import annotations

import pytest

from stortune.schemas.matching import mismatch
from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device, DeviceKind, Topology
from stortune.schemas.trialprofile import is_overlay
from stortune.schemas.tuning.engine import Engine
from stortune.schemas.tuning.overlay import id_glob, other_device, overlay_profile, shared_ids
from stortune.schemas.tuning.recommend import recommended_profile
from stortune.schemas.tuning.simulate import Surface, drive, flat
from tests.schemas.topologies import num
from tests.schemas.tuning.docs import experiment


def _loop(name: str, backing: str) -> Device:
    return Device(name=name, kind=DeviceKind.LOOP, id=f"loop:{backing}", tunables={"read_ahead_kb": num(128)})


def _host(*pairs: tuple[str, str]) -> Topology:
    return Topology(hostname="h", devices=[_loop(name, backing) for name, backing in pairs])


def _tuned(overlay: StorageProfile, topology: Topology) -> list[str]:
    return sorted(c.device for c in plan([overlay], topology).desired if c.tunable == "read_ahead_kb")


def test_hostile_swapped_loop_names_keep_the_trial_on_its_device() -> None:
    before = _host(("loop1", "/srv/a.img"), ("loop2", "/srv/b.img"))
    target = before.device("loop1")
    assert target is not None
    overlay = overlay_profile("ra", {"read_ahead_kb": 0}, target)
    # Detached and re-attached in the other order: loop1 is b.img now, a.img is loop2.
    swapped = _host(("loop1", "/srv/b.img"), ("loop2", "/srv/a.img"))
    assert _tuned(overlay, swapped) == ["loop2"]
    assert _tuned(overlay, _host(("loop1", "/srv/b.img"))) == []  # a.img gone: nothing is tuned
    assert _tuned(overlay, before) == ["loop1"]


@pytest.mark.parametrize("backing", ["/srv/[a]*?.img", "/srv/a b\\c]-!.img", "/x/" + "d" * 4090])
def test_hostile_ids_with_glob_characters_or_past_a_glob_s_length_match_only_themselves(backing: str) -> None:
    target = _loop("loop1", backing)
    glob = id_glob(target.id)
    assert len(glob) <= 256
    overlay = overlay_profile("ra", {"read_ahead_kb": 0}, target)
    neighbours = [_loop("loop1", backing[:-1] + "X"), _loop("loop1", "/srv/a.img"),
                  _loop("loop1", backing + "x"), _loop("loop1", "/srv/ab.img")]
    assert all(mismatch(overlay.spec.rules[0].match, d) is not None for d in neighbours)
    assert mismatch(overlay.spec.rules[0].match, target) is None


def test_hostile_two_loop_devices_over_one_file_are_named_since_one_id_would_tune_both() -> None:
    host = _host(("loop1", "/srv/a.img"), ("loop2", "/srv/a.img"), ("loop3", "/srv/b.img"))
    target = host.device("loop1")
    assert target is not None
    assert shared_ids(host, [target]) == ["loop2 has the id of loop1 (loop:/srv/a.img)"]
    assert shared_ids(host, [host.device("loop3")]) == []  # type: ignore[list-item]


def test_the_device_fio_read_must_be_the_one_tuned() -> None:
    target = _loop("loop1", "/srv/a.img")
    assert other_device(target, "loop:/srv/a.img") is None
    why = other_device(target, "loop:/srv/b.img")
    assert why is not None and "loop:/srv/b.img" in why and "loop1" in why
    assert other_device(target, None) is not None  # unknown is not the same device


def test_only_the_trial_overlay_is_an_overlay_not_the_recommendation() -> None:
    exp = experiment(parameters=[{"tunable": "read_ahead_kb", "values": [0, 128, 1024]}])
    target = _loop("loop1", "/srv/a.img")
    assert is_overlay(overlay_profile(exp.name, {"read_ahead_kb": 0}, target))
    outcome = drive(Engine(exp.spec, {"read_ahead_kb": 128}), Surface(flat, seed=2))
    assert not is_overlay(recommended_profile(exp, outcome, target))
