"""The md stripe cache's RAM cost: said in the plan, refused above a share of the host's RAM."""

from __future__ import annotations

import pytest
import yaml

from stortune.schemas.documents import parse_profile
from stortune.schemas.planner import plan
from stortune.schemas.profile import StorageProfile
from stortune.schemas.stripecache import StripeCacheCost
from stortune.schemas.topology import Topology
from tests.schemas.topologies import streamer_with_md

GIB = 2**30


def arrays(entries: int) -> StorageProfile:
    return parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "arrays"},
        "spec": {"hostSelector": {"matchLabels": {"a": "b"}}, "rules": [
            {"name": "md", "match": yaml.safe_load("{kind: [md]}"),
             "settings": {"stripe_cache_size": entries, "read_ahead_kb": 4096}}]},
    })


def host(memory: int | None) -> Topology:
    topo = streamer_with_md()
    topo.memory_bytes = memory
    return topo


def raid_disks(topo: Topology) -> int:
    md = topo.device("md0")
    assert md is not None and md.md is not None and md.md.raid_disks
    return md.md.raid_disks


def test_a_stripe_cache_above_a_quarter_of_the_ram_is_refused_naming_the_cost() -> None:
    topo = host(1 * GIB)
    n = raid_disks(topo)
    too_big = 32768  # 32768 x 4 KiB x n disks
    assert too_big * 4096 * n > GIB // 4
    result = plan([arrays(too_big)], topo)
    [refused] = result.rejections
    assert (refused.device, refused.tunable, refused.value, refused.fatal) == (
        "md0", "stripe_cache_size", too_big, True)
    assert f"costs {too_big * 4 * n // 1024:,} MiB of RAM ({too_big} x 4 KiB x {n} disks)" in refused.reason
    assert "more than the 25 % allowed" in refused.reason
    fits = GIB // 4 // (4096 * n)
    assert f"at most {fits} entries fit" in refused.reason
    # the other setting of the rule is not held up on the plan's data: only the stripe cache is refused
    assert [(c.device, c.tunable) for c in result.changes] == [("md0", "read_ahead_kb")]
    # the largest size that fits is accepted, one more is not
    assert not plan([arrays(fits)], topo).rejections
    assert plan([arrays(fits + 1)], topo).rejections


def test_the_share_is_configurable() -> None:
    topo = host(64 * GIB)
    assert not plan([arrays(32768)], topo).rejections
    refused = plan([arrays(32768)], topo, stripe_cache_ram_share=0.005).rejections
    assert refused and "more than the 0.5 % allowed" in refused[0].reason


def test_the_cost_is_said_for_a_value_in_place_and_unknown_ram_is_not_refused_but_said() -> None:
    topo = host(None)
    result = plan([arrays(32768)], topo)
    assert not result.rejections
    [desired] = [d for d in result.desired if d.tunable == "stripe_cache_size"]
    assert desired.note is not None and "RAM is unknown" in desired.note
    known = plan([arrays(256)], host(16 * GIB))  # 256 is the fixture's value: in sync, still costed
    [cache] = [d for d in known.desired if d.tunable == "stripe_cache_size"]
    n = raid_disks(topo)
    assert cache.in_sync and cache.note == (
        f"costs {256 * 4 * n / 1024:,.0f} MiB of RAM (256 x 4 KiB x {n} disks), "
        f"{256 * 4096 * n / (16 * GIB):.1%} of the host's 16.0 GiB")


@pytest.mark.parametrize(("entries", "disks", "mib"), [(4096, 5, 80), (32768, 24, 3072), (256, 3, 3)])
def test_cost_is_entries_times_a_page_times_the_disks(entries: int, disks: int, mib: int) -> None:
    assert StripeCacheCost(entries, disks, None).bytes == mib * 2**20
