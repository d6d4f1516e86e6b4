"""On a real loop device: a value the kernel refuses only when written blocks that setting alone.

A loop queue without a scheduler takes at most 128 requests: ``nr_requests: 256`` is a valid
value the planner cannot know is refused, and the kernel answers EINVAL. The transaction is
rolled back (nothing half-applied), applied again without it, and every other setting is applied
and kept (issue 26, point 9). Every check reads /sys directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from stortune.agent import daemon, journal, local
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.catalog import Tunable
from stortune.schemas.documents import load_profiles
from tests.agent.test_write_refusals import deep_and_streaming, outcomes
from tests.loopdev import queue_attributes

pytestmark = pytest.mark.root

ATTRS = ("scheduler", "nr_requests", "read_ahead_kb")


def _queue(dev: str, attr: str) -> Path:
    return Path("/sys/block") / dev / "queue" / attr


def _read(dev: str, attr: str) -> str:
    return queue_attributes(dev)[attr]


def _snapshot(dev: str) -> dict[str, str]:
    attrs = queue_attributes(dev)
    return {a: attrs[a] for a in ATTRS}


@dataclass(frozen=True)
class Watched(KernelFS):
    """The real kernel; each write is logged with the device's queue as it was just before."""

    writes: list[tuple[str, str, dict[str, str]]] = field(default_factory=list, compare=False)

    def write_tunable(self, tunable: Tunable, device: str | None, text: str) -> None:
        assert device is not None
        self.writes.append((tunable.name, text, _snapshot(device)))
        super().write_tunable(tunable, device, text)


def _profiles(dev: str, queue: str, read_ahead: int) -> str:
    return deep_and_streaming(f"{{name: [{dev}]}}", queue, read_ahead)


def _start(dev: str, scheduler: str) -> tuple[Watched, dict[str, str], int]:
    """The device on ``scheduler`` (set by hand): the kernel watched, the queue now, a read-ahead
    to ask for that differs from it."""
    _queue(dev, "scheduler").write_text(scheduler)
    return (Watched(Path("/sys"), Path("/proc")), _snapshot(dev),
            2048 if _read(dev, "read_ahead_kb") != "2048" else 1024)


def test_hostile_a_refused_nr_requests_on_a_loop_device_blocks_only_itself(
        loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    fs, original, read_ahead = _start(dev, "none")
    profiles = load_profiles(_profiles(dev, "{nr_requests: 256}", read_ahead))

    report = local.converge(fs, profiles, state)

    assert report.ok, report.messages
    assert [(r.tunable, r.status, r.profile) for r in report.rows] == [
        ("read_ahead_kb", "applied", None), ("nr_requests", "rejected", "deep")]
    assert "Invalid argument (EINVAL)" in report.rejected[0].message
    assert _snapshot(dev) == {**original, "read_ahead_kb": str(read_ahead)}
    assert outcomes(state) == [("rolled-back", "nr_requests"), ("commit", None)]
    assert journal.pending(state) == []

    # A hand change: the re-apply puts read_ahead_kb back without trying nr_requests again.
    _queue(dev, "read_ahead_kb").write_text("256")
    fs.writes.clear()
    again = daemon.converge(fs, state)

    assert again is not None and again.ok
    assert [(name, text) for name, text, _ in fs.writes] == [("read_ahead_kb", str(read_ahead))]
    assert [r.tunable for r in again.rejected] == ["nr_requests"]
    assert _read(dev, "read_ahead_kb") == str(read_ahead)

    assert local.restore(fs, state).ok
    assert _snapshot(dev) == original


def test_hostile_a_refusal_in_the_middle_of_three_writes_is_rolled_back_before_the_rest(
        loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    fs, original, read_ahead = _start(dev, "mq-deadline")
    # scheduler none is written, then nr_requests 256 (too many without a scheduler), then read-ahead.
    profiles = load_profiles(_profiles(dev, "{scheduler: none, nr_requests: 256}", read_ahead))

    report = local.converge(fs, profiles, state)

    assert report.ok, report.messages
    assert [(r.tunable, r.status) for r in report.rows] == [
        ("scheduler", "applied"), ("read_ahead_kb", "applied"), ("nr_requests", "rejected")]
    written = [(name, text) for name, text, _ in fs.writes]
    assert written[:2] == [("scheduler", "none"), ("nr_requests", "256")]
    assert written[-2:] == [("scheduler", "none"), ("read_ahead_kb", str(read_ahead))]
    # Nothing half-applied: the second transaction began from the values before the first.
    retry = len(written) - 2
    assert fs.writes[retry][2] == original
    assert ("read_ahead_kb", str(read_ahead)) not in written[:retry]
    assert _snapshot(dev)["scheduler"] == "none" and _read(dev, "read_ahead_kb") == str(read_ahead)
    assert outcomes(state) == [("rolled-back", "nr_requests"), ("commit", None)]

    assert local.restore(fs, state).ok
    assert _snapshot(dev) == original
