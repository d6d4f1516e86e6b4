"""Properties on a real loop device: after a successful apply the plan is empty,
and apply then restore leaves every value as it was."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stortune.agent import local
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.documents import parse_profile
from stortune.schemas.planner import plan

TUNED = ("scheduler", "nr_requests", "max_sectors_kb", "read_ahead_kb", "rq_affinity",
         "nomerges", "add_random", "wbt_lat_usec")


def snapshot(dev: str) -> dict[str, str]:
    return {a: (Path("/sys/block") / dev / "queue" / a).read_text().strip() for a in TUNED}


@st.composite
def loop_settings(draw: st.DrawFn, offered: list[str], hw_max: int) -> dict[str, object]:
    chosen: dict[str, object] = {}
    sched = draw(st.none() | st.sampled_from(offered))
    if sched is not None:
        chosen["scheduler"] = sched
    # Without an elevator a loop queue holds at most its tag depth (128).
    nr_max = 128 if sched in (None, "none") else 2048
    options: dict[str, st.SearchStrategy[object]] = {
        "nr_requests": st.integers(4, nr_max),
        "max_sectors_kb": st.integers(4, hw_max),
        "read_ahead_kb": st.integers(0, 16384).map(lambda v: v - v % 4),
        "rq_affinity": st.integers(0, 2),
        "nomerges": st.integers(0, 2),
        "add_random": st.integers(0, 1),
        "wbt_lat_usec": st.integers(0, 1_000_000),
    }
    for name, strategy in options.items():
        if draw(st.booleans()):
            chosen[name] = draw(strategy)
    if not chosen:
        chosen["read_ahead_kb"] = draw(options["read_ahead_kb"])
    return chosen


def test_apply_then_plan_is_empty_and_restore_is_exact(
    loop_devices: Callable[[int], list[str]],
) -> None:
    (dev,) = loop_devices(1)
    queue = Path("/sys/block") / dev / "queue"
    offered = queue.joinpath("scheduler").read_text().replace("[", "").replace("]", "").split()
    hw_max = int(queue.joinpath("max_hw_sectors_kb").read_text())
    fs = KernelFS.at()

    @settings(max_examples=40, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(values=loop_settings(offered, hw_max))
    def check(values: dict[str, object]) -> None:
        # A scheduler switch may reset nr_requests, which only the elevator
        # did: start each example from the same state.
        before = snapshot(dev)
        doc = parse_profile({
            "apiVersion": "stortune/v1", "kind": "StorageProfile",
            "metadata": {"name": "prop"},
            "spec": {"rules": [{"name": "r", "match": {"kind": ["loop"], "name": [dev]},
                                "settings": values}]},
        })
        with tempfile.TemporaryDirectory() as state:
            report = local.apply(fs, [doc], Path(state))
            assert report.ok, report.messages
            again = plan([doc], local.discover(fs))
            assert again.changes == [], again.changes
            restored = local.restore(fs, Path(state))
            assert restored.ok, restored.messages
        assert snapshot(dev) == before

    check()


