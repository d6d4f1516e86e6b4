"""Recovery of several interrupted writes of one tunable ends at the oldest "before" value.

Two transactions can be left open on one tunable (an apply killed, then the recovery of it or the
next apply killed too before it archived). Undoing them newest first ends at the value from before
the first; undone oldest first, the tunable was left at the first transaction's own write, which
passed the whole suite.
"""

from __future__ import annotations

from pathlib import Path

from stortune.agent import executor, journal
from stortune.agent.kernelfs import KernelFS
from tests.agent.fakekernel import queue_file, read_queue


def _interrupted(state: Path, *writes: tuple[int, int]) -> str:
    """An open transaction of read_ahead_kb writes (before, after), as a kill -9 leaves it."""
    tx = journal.begin(state, f"apply {len(writes)} change(s)")
    for before, after in writes:
        intent = tx.intent(device="fake0", device_id="name:fake0", tunable="read_ahead_kb",
                           before_raw=str(before), before_value=before, after=after)
        tx.done(intent, after)
    tx.abandon()
    return tx.txid


def test_hostile_two_interrupted_transactions_on_one_tunable_end_at_the_oldest_original(
        fake_kernel: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    older = _interrupted(state, (128, 256))   # the value before stortune: 128
    newer = _interrupted(state, (256, 512))
    queue_file(fake_kernel, "fake0", "read_ahead_kb").write_text("512\n")
    assert [p.txid for p in journal.pending(state)] == [older, newer]  # oldest first on disk

    report = executor.recover(fake_kernel, state)

    assert report is not None and report.ok, report.summary()
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"
    assert report.transactions == [newer, older]  # undone in reverse
    assert journal.pending(state) == []


def test_hostile_two_writes_of_one_tunable_in_one_transaction_end_at_the_first_before(
        fake_kernel: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    _interrupted(state, (128, 256), (256, 512))
    queue_file(fake_kernel, "fake0", "read_ahead_kb").write_text("512\n")

    report = executor.recover(fake_kernel, state)

    assert report is not None and report.ok, report.summary()
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"
