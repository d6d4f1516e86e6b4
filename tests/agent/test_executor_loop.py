"""The executor against real loop devices: apply, verify, roll back, restore.

Every check reads /sys directly, not through the code under test.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from stortune.agent import executor, journal
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.plan import Change, Plan, Rejection, Source
from tests.agent.fakekernel import change

pytestmark = pytest.mark.root

FS = KernelFS.at("/sys", "/proc")


def sysfs(dev: str, attr: str) -> str:
    return Path(f"/sys/block/{dev}/queue/{attr}").read_text().strip()


def scheduler(dev: str) -> str:
    return next(w.strip("[]") for w in sysfs(dev, "scheduler").split() if w.startswith("["))


def snapshot(dev: str) -> dict[str, str]:
    return {
        "scheduler": scheduler(dev),
        "nr_requests": sysfs(dev, "nr_requests"),
        "max_sectors_kb": sysfs(dev, "max_sectors_kb"),
        "read_ahead_kb": sysfs(dev, "read_ahead_kb"),
    }


def other_scheduler(dev: str) -> str:
    current = scheduler(dev)
    offered = [w.strip("[]") for w in sysfs(dev, "scheduler").split()]
    others = [s for s in offered if s != current]
    if not others:
        pytest.skip(f"{dev} offers no scheduler besides {current}")
    return "mq-deadline" if "mq-deadline" in others else others[0]


def tuning_plan(dev: str) -> tuple[Plan, dict[str, str]]:
    """Four changes in catalog order, each different from the current value."""
    before = snapshot(dev)
    max_sectors = 512 if before["max_sectors_kb"] != "512" else 256
    read_ahead = 1024 if before["read_ahead_kb"] != "1024" else 2048
    want = {
        "scheduler": other_scheduler(dev),
        "nr_requests": "64" if before["nr_requests"] != "64" else "32",
        "max_sectors_kb": str(max_sectors),
        "read_ahead_kb": str(read_ahead),
    }
    changes = [
        change(dev, "scheduler", before["scheduler"], want["scheduler"]),
        change(dev, "nr_requests", int(before["nr_requests"]), int(want["nr_requests"])),
        change(dev, "max_sectors_kb", int(before["max_sectors_kb"]), max_sectors),
        change(dev, "read_ahead_kb", int(before["read_ahead_kb"]), read_ahead),
    ]
    return Plan(changes=changes), want


def test_apply_then_restore(loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    original = snapshot(dev)
    plan, want = tuning_plan(dev)

    report = executor.apply(FS, plan, state)

    assert report.ok, report.messages
    assert snapshot(dev) == want
    assert [r.status for r in report.results] == ["applied"] * 4
    json.dumps(report.model_dump(mode="json"))  # the CLI and RPC ship it as JSON
    stored = journal.load_originals(state)
    assert {k: str(o.value) for k, o in stored.items() if o.direct} == {
        (f"name:{dev}", t): v for t, v in original.items()
    }
    # What the scheduler switch may reset is saved as well, as a side effect, with what it left.
    side = {k[1]: o for k, o in stored.items() if not o.direct}
    assert set(side) == {"wbt_lat_usec"} and side["wbt_lat_usec"].cause == "scheduler"
    assert str(side["wbt_lat_usec"].cause_left) == sysfs(dev, "wbt_lat_usec")
    assert journal.pending(state) == []

    restored = executor.restore(FS, state)

    assert restored.ok, restored.messages
    assert snapshot(dev) == original
    assert journal.load_originals(state) == {}
    assert journal.pending(state) == []


@pytest.mark.parametrize("bad", ["max_sectors_kb", "scheduler"])
def test_refused_value_rolls_back_earlier_changes(loop_device: str, tmp_path: Path, bad: str) -> None:
    dev, state = loop_device, tmp_path / "state"
    original = snapshot(dev)
    plan, want = tuning_plan(dev)
    hw = int(sysfs(dev, "max_hw_sectors_kb"))
    changes: list[Change] = [c for c in plan.changes if c.tunable != bad]
    if bad == "max_sectors_kb":
        # The kernel refuses or clamps it; either way the read-back must catch it.
        changes.insert(2, change(dev, bad, int(original[bad]), hw * 2))
    else:
        # Last, so that three earlier changes have to be rolled back.
        changes.append(change(dev, bad, original[bad], "bogus"))

    report = executor.apply(FS, Plan(changes=changes), state)

    # Rolled back, then applied again without it: an error on that setting alone.
    assert report.ok, report.messages
    assert [(r.device, r.tunable) for r in report.rejections] == [(dev, bad)]
    assert bad in report.messages[0] and dev in report.messages[0]
    assert "rolled back the" in report.messages[0]
    if bad == "scheduler":
        assert "Invalid argument" in report.rejections[0].reason
    else:
        reason = report.rejections[0].reason
        assert f"expected {hw * 2}" in reason or "Invalid argument" in reason
    assert {r.tunable: r.status for r in report.results} == {t: "applied" for t in want if t != bad}
    assert snapshot(dev) == {**want, bad: original[bad]}
    assert journal.pending(state) == []
    assert executor.restore(FS, state).ok
    assert snapshot(dev) == original


def test_second_apply_keeps_the_first_original(loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    first = sysfs(dev, "read_ahead_kb")
    a, b = (1024, 2048) if first not in ("1024", "2048") else (512, 256)

    assert executor.apply(FS, Plan(changes=[change(dev, "read_ahead_kb", int(first), a)]), state).ok
    assert executor.apply(FS, Plan(changes=[change(dev, "read_ahead_kb", a, b)]), state).ok
    assert sysfs(dev, "read_ahead_kb") == str(b)
    (stored,) = journal.load_originals(state).values()
    assert stored.value == int(first)

    assert executor.restore(FS, state).ok
    assert sysfs(dev, "read_ahead_kb") == first


def test_final_pass_catches_a_value_a_later_write_reset(loop_device: str, tmp_path: Path) -> None:
    # nr_requests before scheduler: the scheduler switch resets nr_requests, so
    # every single write verifies but the plan as a whole does not hold.
    dev, state = loop_device, tmp_path / "state"
    original = snapshot(dev)
    target = other_scheduler(dev)
    plan = Plan(
        changes=[
            # Neither the current value nor a scheduler's default (64 or 128 on loop devices).
            change(dev, "nr_requests", int(original["nr_requests"]),
                   48 if original["nr_requests"] != "48" else 40),
            change(dev, "scheduler", original["scheduler"], target),
        ]
    )

    report = executor.apply(FS, plan, state)

    assert not report.ok
    assert report.results[0].status == "failed"
    assert "a later write reset it" in report.results[0].message
    assert report.results[1].status == "rolled-back"
    assert snapshot(dev) == original


def test_restore_puts_back_what_the_scheduler_switch_reset(loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    Path(f"/sys/block/{dev}/queue/nr_requests").write_text("32")  # an admin's own setting
    original = snapshot(dev)
    assert original["nr_requests"] == "32"
    target = other_scheduler(dev)

    plan = Plan(changes=[change(dev, "scheduler", original["scheduler"], target)])

    report = executor.apply(FS, plan, state)

    assert report.ok, report.messages
    assert scheduler(dev) == target
    assert executor.restore(FS, state, only={(f"name:{dev}", "scheduler")}).ok
    assert snapshot(dev) == original


def test_restore_only_selected_keys(loop_devices: Callable[[int], list[str]], tmp_path: Path) -> None:
    a, b = loop_devices(2)
    state = tmp_path / "state"
    for d in (a, b):  # a reused loop device keeps its last user's read-ahead: make it differ
        Path(f"/sys/block/{d}/queue/read_ahead_kb").write_text("128")
    before = {d: sysfs(d, "read_ahead_kb") for d in (a, b)}
    plan = Plan(changes=[change(d, "read_ahead_kb", int(before[d]), 4096) for d in (a, b)])
    assert executor.apply(FS, plan, state).ok

    report = executor.restore(FS, state, only={(f"name:{a}", "read_ahead_kb")})

    assert report.ok
    assert sysfs(a, "read_ahead_kb") == before[a]
    assert sysfs(b, "read_ahead_kb") == "4096"
    assert list(journal.load_originals(state)) == [(f"name:{b}", "read_ahead_kb")]
    assert executor.restore(FS, state).ok
    assert sysfs(b, "read_ahead_kb") == before[b]


def test_unidentified_device_is_never_changed(loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    before = sysfs(dev, "read_ahead_kb")
    plan = Plan(
        changes=[
            change(dev, "read_ahead_kb", int(before), 4096, device_id="wwn:0x5000c500deadbeef"),
            change("nosuchdisk9", "read_ahead_kb", 128, 4096),
        ]
    )

    report = executor.apply(FS, plan, state, identify=lambda name: f"name:{name}")

    assert not report.ok
    assert [r.status for r in report.results] == ["skipped", "skipped"]
    assert "renamed or replaced" in report.results[0].message
    assert "does not exist" in report.results[1].message
    assert sysfs(dev, "read_ahead_kb") == before
    assert journal.load_originals(state) == {}


def test_hostile_a_fatal_rejection_blocks_only_its_own_setting(loop_device: str, tmp_path: Path) -> None:
    dev, state = loop_device, tmp_path / "state"
    before = snapshot(dev)
    plan, want = tuning_plan(dev)
    # The planner holds no change for a setting it rejects.
    plan.changes = [c for c in plan.changes if c.tunable != "scheduler"]
    plan.rejections.append(
        Rejection(
            device=dev,
            device_id=f"name:{dev}",
            tunable="scheduler",
            value="bfq-ish",
            reason="not offered by this kernel",
            fatal=True,
            source=Source(profile="test", rule="bad"),
        )
    )

    report = executor.apply(FS, plan, state)

    # Every planned change is made and verified; the refused scheduler is reported, not written.
    assert report.ok, report.messages
    assert [r.tunable for r in report.rejections] == ["scheduler"]
    assert "test/bad" in report.messages[0] and "not offered by this kernel" in report.messages[0]
    assert report.results and all(r.status == "applied" for r in report.results)
    assert snapshot(dev) == {**want, "scheduler": before["scheduler"]}
    assert executor.restore(FS, state).ok and snapshot(dev) == before
