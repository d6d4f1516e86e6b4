"""Every write is read back before the next one: a value the kernel clamps stops the apply there.

Drivers clamp ``nr_requests`` to what the hardware queue takes, and the write itself succeeds. With
the per-write read-back removed, the writes after it went ahead and the final pass blamed the
clamped value on "a later write"; the whole suite passed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from stortune.agent import executor
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.catalog import Tunable
from stortune.schemas.plan import Plan
from tests.agent.fakekernel import FAKE_QUEUE, change, make_fake_kernel, read_queue

CLAMP = 128  # the most requests this fake queue takes, and its current value


@dataclass(frozen=True)
class ClampingKernel(KernelFS):
    """Takes any nr_requests without an error but keeps at most CLAMP, as drivers do."""

    writes: list[tuple[str, str]] = field(default_factory=list, compare=False)

    def write_tunable(self, tunable: Tunable, device: str | None, text: str) -> None:
        self.writes.append((tunable.name, text))
        if tunable.name == "nr_requests":
            text = str(min(int(text), CLAMP))
        super().write_tunable(tunable, device, text)


def _kernel(tmp_path: Path) -> ClampingKernel:
    plain = make_fake_kernel(tmp_path / "kernel", {"fake0": dict(FAKE_QUEUE)})
    return ClampingKernel(plain.sysfs, plain.procfs)


PLAN = Plan(changes=[
    change("fake0", "scheduler", "none", "mq-deadline"),
    change("fake0", "nr_requests", 128, 256),      # clamped to 128: the write "succeeds"
    change("fake0", "max_sectors_kb", 1280, 512),
    change("fake0", "read_ahead_kb", 128, 4096),
])


def test_hostile_a_clamped_nr_requests_is_blamed_on_itself_and_stops_the_writes_after_it(
        tmp_path: Path) -> None:
    fs = _kernel(tmp_path)

    report = executor.apply(fs, PLAN, tmp_path / "state")

    # Its transaction stopped at it and was rolled back; run again without it, the rest applies.
    assert report.ok, report.messages
    assert [(r.tunable, r.status) for r in report.results] == [
        ("scheduler", "applied"), ("max_sectors_kb", "applied"), ("read_ahead_kb", "applied")]
    assert [(r.tunable, r.reason.split(";")[0]) for r in report.rejections] == [
        ("nr_requests", "the kernel refused it: read back 128, expected 256")]
    assert report.messages[0] == (
        "fake0 nr_requests: read back 128, expected 256;"
        " rolled back the 1 other change(s) this apply had made")
    assert not any("later write" in m for m in report.messages)
    # The writes after the clamped one never reached the kernel before the scheduler was put back.
    assert fs.writes == [("scheduler", "mq-deadline"), ("nr_requests", "256"), ("scheduler", "none"),
                         ("scheduler", "mq-deadline"), ("max_sectors_kb", "512"),
                         ("read_ahead_kb", "4096")]
    assert {a: read_queue(fs, "fake0", a) for a in ("scheduler", "nr_requests", "max_sectors_kb",
                                                    "read_ahead_kb")} == {
        "scheduler": "mq-deadline", "nr_requests": "128", "max_sectors_kb": "512",
        "read_ahead_kb": "4096"}


def test_a_value_within_the_clamp_applies(tmp_path: Path) -> None:
    fs = _kernel(tmp_path)
    plan = Plan(changes=[change("fake0", "nr_requests", 128, 64),
                         change("fake0", "read_ahead_kb", 128, 4096)])

    report = executor.apply(fs, plan, tmp_path / "state")

    assert report.ok, report.messages
    assert [(r.tunable, r.status) for r in report.results] == [
        ("nr_requests", "applied"), ("read_ahead_kb", "applied")]
    assert read_queue(fs, "fake0", "nr_requests") == "64"
