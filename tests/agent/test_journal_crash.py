"""kill -9 in the middle of an apply, then recovery.

The apply runs in a child process over a fake sysfs tree whose KernelFS (the
seam) never returns from the write of the attribute written last: the child
journals its intent, then blocks; at that moment the test knows exactly which
writes happened, and kills the child. (A FIFO attribute did this once; reads
now refuse anything but a regular file, so a FIFO can no longer be read first.)
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stortune.agent import executor, journal
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tunables import read_state
from stortune.schemas import catalog
from stortune.schemas.plan import Plan
from tests.agent.fakekernel import FAKE_QUEUE, change, make_fake_kernel, queue_file, read_queue

CHILD = """
import sys
import threading
from stortune.agent import executor
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.plan import Plan

class WriteHangs(KernelFS):
    def write_tunable(self, tunable, device, text):
        if tunable.name == "read_ahead_kb":
            threading.Event().wait()  # the test kills the process here
        super().write_tunable(tunable, device, text)

sysfs, procfs, plan, state = sys.argv[1:]
with open(plan) as fh:
    executor.apply(WriteHangs.at(sysfs, procfs), Plan.model_validate_json(fh.read()), state)
"""

PLAN = Plan(
    changes=[
        change("fake0", "scheduler", "none", "mq-deadline"),
        change("fake0", "nr_requests", 128, 64),
        change("fake0", "max_sectors_kb", 1280, 512),
        change("fake0", "read_ahead_kb", 128, 4096),
    ]
)
ORIGINAL = {"scheduler": "none", "nr_requests": 128, "max_sectors_kb": 1280, "read_ahead_kb": 128}


def value(fs: KernelFS, tunable: str) -> object:
    return read_state(fs, catalog.get(tunable), "fake0").value


def values(fs: KernelFS) -> dict[str, object]:
    return {t: value(fs, t) for t in ORIGINAL}


def crash_during_last_write(tmp_path: Path) -> tuple[KernelFS, Path]:
    """Run the apply in a child and SIGKILL it once the last write is journaled."""
    fs = make_fake_kernel(tmp_path / "kernel", {"fake0": dict(FAKE_QUEUE)})
    state = tmp_path / "state"
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(PLAN.model_dump_json())
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(fs.sysfs), str(fs.procfs), str(plan_file), str(state)],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        # The planned write's intent, not the side record of read_ahead_kb that the
        # max_sectors_kb write journals first (it resets read-ahead): waiting for that
        # one would kill the child before max_sectors_kb is written.
        while not any(i.tunable == "read_ahead_kb" and i.cause is None
                      for p in journal.pending(state) for i in p.intents):
            if child.poll() is not None:
                pytest.fail(f"apply exited ({child.returncode}) before blocking: {child.stderr!r}")
            if time.monotonic() > deadline:
                pytest.fail("apply never journaled the read_ahead_kb intent")
            time.sleep(0.01)
        # It is now inside the hanging write, or about to be: the write cannot happen.
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        if child.stderr:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    return fs, state


def test_recovery_after_kill_restores_the_earlier_writes(tmp_path: Path) -> None:
    fs, state = crash_during_last_write(tmp_path)
    # The crash left the device half-applied and the transaction open.
    assert values(fs) == {
        "scheduler": "mq-deadline",
        "nr_requests": 64,
        "max_sectors_kb": 512,
        "read_ahead_kb": 128,
    }
    (open_tx,) = journal.pending(state)
    assert open_tx.outcome is None

    report = journal.recover(fs, state)

    assert report is not None and report.ok, report
    assert report.transactions == [open_tx.txid]
    assert values(fs) == ORIGINAL
    assert journal.pending(state) == []
    (archived,) = (state / "journal" / "done").glob("*.jsonl")
    assert '"type":"recovered"' in archived.read_text()
    # The originals survive the crash, so a later restore still knows them.
    originals = journal.load_originals(state)
    assert {t: o.value for (_, t), o in originals.items()} == ORIGINAL
    assert journal.recover(fs, state) is None
    assert executor.restore(fs, state).ok
    assert journal.load_originals(state) == {}


def test_recovery_is_idempotent(tmp_path: Path) -> None:
    fs, state = crash_during_last_write(tmp_path)
    (open_tx,) = journal.pending(state)
    saved = tmp_path / "journal-copy"
    shutil.copy(open_tx.path, saved)

    assert executor.recover(fs, state) is not None
    assert values(fs) == ORIGINAL
    # As if the first recovery had been killed after some writes, before
    # archiving: one value is still the applied one, the journal still open.
    queue_file(fs, "fake0", "nr_requests").write_text("64\n")
    shutil.copy(saved, open_tx.path)

    report = executor.recover(fs, state)

    assert report is not None and report.ok
    assert values(fs) == ORIGINAL
    assert journal.pending(state) == []
    assert executor.recover(fs, state) is None


def test_torn_last_record_is_ignored(tmp_path: Path) -> None:
    fs, state = crash_during_last_write(tmp_path)
    (open_tx,) = journal.pending(state)
    with open(open_tx.path, "ab") as fh:
        fh.write(b'{"type":"intent","seq":9,"device":"fa')

    report = executor.recover(fs, state)

    assert report is not None and report.ok
    assert any("unreadable journal line" in m for m in report.messages)
    assert values(fs) == ORIGINAL


def test_next_apply_recovers_first(tmp_path: Path) -> None:
    fs, state = crash_during_last_write(tmp_path)

    report = executor.apply(fs, Plan(changes=[change("fake0", "read_ahead_kb", 128, 256)]), state)

    assert report.ok
    assert report.recovery is not None and report.recovery.ok
    assert values(fs) == {**ORIGINAL, "read_ahead_kb": 256}


def test_a_reboot_since_the_crash_means_nothing_to_undo(tmp_path: Path) -> None:
    fs = make_fake_kernel(tmp_path / "kernel", {"fake0": dict(FAKE_QUEUE)})
    state = tmp_path / "state"
    tx = journal.begin(state, "apply 1 change(s)", boot_id="boot-before")
    tx.intent(
        device="fake0",
        device_id="name:fake0",
        tunable="read_ahead_kb",
        before_raw="4096",
        before_value=4096,
        after=128,
    )
    tx.abandon()
    boot_id = fs.procfs / "sys" / "kernel" / "random" / "boot_id"
    boot_id.parent.mkdir(parents=True)
    boot_id.write_text("boot-after\n")

    report = executor.recover(fs, state)

    assert report is not None and report.ok
    assert "rebooted" in report.messages[0]
    assert read_queue(fs, "fake0", "read_ahead_kb") == "128"
    assert journal.pending(state) == []
