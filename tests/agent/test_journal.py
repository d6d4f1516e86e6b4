"""The state directory: originals, desired state, atomic files, the lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stortune.agent import executor, journal
from stortune.agent.journal import Original, StateCorruptError, StateLockedError
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.plan import Plan, Rejection, Source
from tests.agent.fakekernel import change, read_queue


def original(value: int, device: str = "sdb") -> Original:
    return Original(
        device_id="wwn:0x1",
        device=device,
        tunable="read_ahead_kb",
        raw=str(value),
        value=value,
        recorded_at=0.0,
    )


def test_an_original_is_never_replaced(tmp_path: Path) -> None:
    assert journal.record_original(tmp_path, original(128))
    assert not journal.record_original(tmp_path, original(4096, device="sdc"))

    (stored,) = journal.load_originals(tmp_path).values()
    assert stored.value == 128
    assert stored.device == "sdc"  # the name follows the device; the value does not


def test_second_apply_does_not_record_its_own_value(fake_kernel: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert executor.apply(fake_kernel, Plan(changes=[change("fake0", "read_ahead_kb", 128, 1024)]), state).ok
    assert executor.apply(fake_kernel, Plan(changes=[change("fake0", "read_ahead_kb", 1024, 2048)]), state).ok

    assert {o.value for o in journal.load_originals(state).values()} == {128}
    assert executor.restore(fake_kernel, state).ok
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"


def test_a_side_effect_original_becomes_direct_when_stortune_sets_it_itself(tmp_path: Path) -> None:
    side = original(128).model_copy(update={"tunable": "nr_requests", "direct": False,
                                            "cause": "scheduler"})
    assert journal.record_original(tmp_path, side)
    journal.note_causes(tmp_path, [(side.key, "scheduler", 256)])
    (stored,) = journal.load_originals(tmp_path).values()
    assert (stored.value, stored.direct, stored.cause, stored.cause_left) == (128, False, "scheduler", 256)

    assert not journal.record_original(tmp_path, side.model_copy(update={"value": 256, "direct": True}))
    (stored,) = journal.load_originals(tmp_path).values()
    assert (stored.value, stored.direct, stored.cause_left) == (128, True, 256)
    # Its own setting removed while the scheduler stays: a side effect only again, still kept.
    journal.settle_originals(tmp_path, drop=[], indirect=[side.key])
    (stored,) = journal.load_originals(tmp_path).values()
    assert (stored.value, stored.direct) == (128, False)


def test_plain_originals_are_stored_as_before(tmp_path: Path) -> None:
    """A store older agents wrote reads as direct originals; plain ones are written the same way."""
    journal.record_original(tmp_path, original(128))
    text = (tmp_path / "originals.json").read_text()
    assert "direct" not in text and "cause" not in text
    (stored,) = journal.load_originals(tmp_path).values()
    assert stored.direct and stored.cause is None


def test_an_unreadable_state_directory_is_a_state_error(tmp_path: Path) -> None:
    (tmp_path / "originals.json").mkdir()  # EISDIR: read fails, and not because it is absent
    with pytest.raises(journal.StateError, match="cannot read the originals store"):
        journal.load_originals(tmp_path)


def test_drop_originals(tmp_path: Path) -> None:
    journal.record_original(tmp_path, original(128))
    journal.drop_originals(tmp_path, iter([("wwn:0x1", "read_ahead_kb")]))
    assert journal.load_originals(tmp_path) == {}


def test_a_corrupt_originals_store_is_an_error_and_left_alone(tmp_path: Path) -> None:
    store = tmp_path / "originals.json"
    store.write_text('{"version": 1, "originals": [{"device": "sdb"')

    with pytest.raises(StateCorruptError, match="left untouched"):
        journal.record_original(tmp_path, original(128))
    assert store.read_text() == '{"version": 1, "originals": [{"device": "sdb"'


def test_atomic_write_keeps_the_old_content_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "desired.json"
    journal.save_desired(tmp_path, {"profiles": ["old"]})

    def crash(*args: object) -> None:
        raise OSError("simulated crash before the rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        journal.save_desired(tmp_path, {"profiles": ["new"]})
    monkeypatch.undo()

    assert journal.load_desired(tmp_path) == {"profiles": ["old"]}
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]  # no temp file left


def test_desired_state_round_trip(tmp_path: Path) -> None:
    assert journal.load_desired(tmp_path) is None
    doc = {"profiles": [{"name": "db", "rules": []}], "generation": 7}
    journal.save_desired(tmp_path, doc)
    assert journal.load_desired(tmp_path) == doc
    journal.clear_desired(tmp_path)
    assert journal.load_desired(tmp_path) is None


def test_the_lock_excludes_a_second_holder(tmp_path: Path) -> None:
    with (
        journal.lock(tmp_path),
        pytest.raises(StateLockedError, match=f"pid {os.getpid()}"),
        journal.lock(tmp_path),
    ):
        pass
    with journal.lock(tmp_path):  # released on exit
        pass


def test_the_lock_is_held_across_processes_and_freed_when_the_holder_dies(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from stortune.agent import journal\n"
            "with journal.lock(sys.argv[1]):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(60)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(StateLockedError, match=f"pid {holder.pid}"),
            journal.lock(tmp_path, timeout=0.2),
        ):
            pass
    finally:
        holder.kill()  # kill -9: flock is released by the kernel, no stale lock
        holder.wait(timeout=30)
        if holder.stdout:
            holder.stdout.close()
    # The holder is dead and reaped: the kernel released its flock, so the lock is taken at once
    # (no waiting: timeout 0), with no stale lock to clear by hand.
    with journal.lock(tmp_path):
        assert (tmp_path / "lock").read_text() == f"{os.getpid()}\n"


def test_apply_refuses_while_locked(fake_kernel: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with journal.lock(state), pytest.raises(StateLockedError):
        executor.apply(fake_kernel, Plan(changes=[change("fake0", "read_ahead_kb", 128, 1024)]), state)
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "128"


def test_hostile_a_fatal_rejection_blocks_only_its_own_setting(fake_kernel: KernelFS,
                                                                 tmp_path: Path) -> None:
    plan = Plan(
        changes=[change("fake0", "read_ahead_kb", 128, 1024)],
        rejections=[
            Rejection(
                device="fake0",
                device_id="name:fake0",
                tunable="nr_requests",
                value=99999,
                reason="exceeds the maximum",
                fatal=True,
                source=Source(profile="p", rule="r"),
            )
        ],
    )

    report = executor.apply(fake_kernel, plan, tmp_path / "state")

    # The other change is made; the error is reported with the rule that wants the value.
    assert report.ok and [(r.tunable, r.status) for r in report.results] == [("read_ahead_kb", "applied")]
    assert [r.tunable for r in report.rejections] == ["nr_requests"]
    assert report.messages[0] == "error: p/r: fake0 nr_requests=99999 not set: exceeds the maximum"
    assert read_queue(fake_kernel, "fake0", "read_ahead_kb") == "1024"


@pytest.mark.parametrize(
    "case",
    [
        ("fake0", "no_such_knob", 1, "unknown tunable"),
        ("fake0", "read_ahead_kb", 1023, "multiple of 4"),
        ("../fake0", "read_ahead_kb", 1024, "not a kernel block device name"),
        ("fake0", "dev.raid.speed_limit_min", 1000, "must target 'host'"),
    ],
)
def test_an_invalid_plan_writes_nothing(
    fake_kernel: KernelFS, tmp_path: Path, case: tuple[str, str, int, str]
) -> None:
    device, tunable, desired, why = case
    plan = Plan(
        changes=[
            change("fake0", "nr_requests", 128, 64),
            change(device, tunable, None, desired),
        ]
    )

    report = executor.apply(fake_kernel, plan, tmp_path / "state")

    assert not report.ok
    assert any(why in m for m in report.messages), report.messages
    assert read_queue(fake_kernel, "fake0", "nr_requests") == "128"


def test_restore_with_nothing_recorded(fake_kernel: KernelFS, tmp_path: Path) -> None:
    report = executor.restore(fake_kernel, tmp_path / "state")
    assert report.ok
    assert report.messages == ["no recorded originals to restore"]


def test_restore_reports_a_vanished_device_and_keeps_its_original(
    fake_kernel: KernelFS, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert executor.apply(fake_kernel, Plan(changes=[change("fake0", "read_ahead_kb", 128, 1024)]), state).ok
    (fake_kernel.sysfs / "block" / "fake0").unlink()

    report = executor.restore(fake_kernel, state)

    assert report.ok
    assert [r.status for r in report.results] == ["vanished"]
    assert "kept" in report.messages[0]
    assert len(journal.load_originals(state)) == 1
