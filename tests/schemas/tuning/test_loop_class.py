"""A recommended profile for a loop device matches it by its backing file, never all loops."""

from __future__ import annotations

from stortune.schemas.matching import mismatch
from stortune.schemas.profile import Match
from stortune.schemas.topology import Device, DeviceKind
from stortune.schemas.tuning.recommend import class_match


def loop(name: str, backing: str) -> Device:
    return Device(name=name, kind=DeviceKind.LOOP, id=f"loop:{backing}", size_bytes=1 << 30,
                  rotational=False)


def test_a_loop_device_is_matched_by_its_backing_file_name() -> None:
    demo = loop("loop3", "/home/me/stortune/state/stortune-demo.img")
    match = Match.model_validate(class_match(demo))
    assert mismatch(match, demo) is None
    assert mismatch(match, loop("loop9", "/srv/other/state/stortune-demo.img")) is None  # another checkout
    assert mismatch(match, loop("loop4", "/var/lib/snapd/snaps/core_1.snap")) is not None
    assert mismatch(match, loop("loop5", "/tmp/not-stortune-demo.img")) is not None


def test_glob_characters_in_the_file_name_are_literal() -> None:
    odd = loop("loop1", "/var/tmp/x[1]*.img")
    match = Match.model_validate(class_match(odd))
    assert mismatch(match, odd) is None
    assert mismatch(match, loop("loop2", "/var/tmp/x1-anything.img")) is not None
