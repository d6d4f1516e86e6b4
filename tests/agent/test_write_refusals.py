"""A write the kernel refuses blocks only that setting (issue 26, point 9, at write time).

The planner cannot foresee every refusal: ``nr_requests`` above what a queue without a scheduler
takes fails with EINVAL, a driver clamps a value and the read-back differs. Such a write used to
roll back the whole transaction on every apply, so the host's other settings stopped being
enforced. Now the transaction is rolled back, run again without that setting (and what depends on
it), the setting is an error of the apply, and the refusal is remembered so the next re-apply
plans it as an error instead of writing, failing and rolling back again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stortune.agent import daemon, executor, journal, local, refusals
from stortune.agent.kernelfs import KernelWriteError
from stortune.schemas import catalog
from stortune.schemas.catalog import Tunable
from stortune.schemas.documents import load_profiles
from stortune.schemas.plan import Plan
from tests.agent.fakekernel import FAKE_QUEUE, PickyKernel, change, make_fake_kernel, read_queue
from tests.fixtures.agent_host import Host, build_host

DEPTH = 128  # the most nr_requests the fake queue takes, and its value


def _fake(tmp_path: Path, devices: int = 1, **kw: Any) -> PickyKernel:
    plain = make_fake_kernel(tmp_path / "kernel", {f"fake{i}": dict(FAKE_QUEUE) for i in range(devices)})
    return PickyKernel.over(plain, **kw)


def outcomes(state: Path) -> list[tuple[str, str | None]]:
    """(outcome, tunable blamed) of each finished transaction, oldest first."""
    out = []
    for path in sorted((state / "journal" / "done").glob("*.jsonl")):
        last = json.loads(path.read_text().splitlines()[-1])
        out.append((last["type"], last.get("tunable")))
    return out


THREE = Plan(changes=[
    change("fake0", "scheduler", "none", "mq-deadline"),
    change("fake0", "nr_requests", DEPTH, 256),  # the middle write
    change("fake0", "read_ahead_kb", 128, 4096),
])


# -- hostile ---------------------------------------------------------------------------------------
def test_hostile_an_einval_in_the_middle_of_three_writes_blocks_only_itself(tmp_path: Path) -> None:
    fs, state = _fake(tmp_path, refuses={"nr_requests": DEPTH}), tmp_path / "state"

    report = executor.apply(fs, THREE, state)

    assert report.ok, report.messages
    assert {r.tunable: r.status for r in report.results} == {
        "scheduler": "applied", "read_ahead_kb": "applied"}
    (error,) = report.rejections
    assert (error.device, error.tunable, error.value, error.fatal, error.source.profile) == (
        "fake0", "nr_requests", 256, True, "test")
    assert error.reason.startswith("the kernel refused it: write failed: Invalid argument (EINVAL);")
    assert "when its value or the device changes, when scheduler changes" in error.reason
    # Rolled back first (nothing half-applied), then the other two written again.
    assert fs.writes == [("fake0", "scheduler", "mq-deadline"), ("fake0", "nr_requests", "256"),
                         ("fake0", "scheduler", "none"),
                         ("fake0", "scheduler", "mq-deadline"), ("fake0", "read_ahead_kb", "4096")]
    assert outcomes(state) == [("rolled-back", "nr_requests"), ("commit", None)]
    assert journal.pending(state) == []
    assert {a: read_queue(fs, "fake0", a) for a in ("scheduler", "nr_requests", "read_ahead_kb")} == {
        "scheduler": "mq-deadline", "nr_requests": str(DEPTH), "read_ahead_kb": "4096"}
    (kept,) = refusals.load(state)
    assert (kept.device_id, kept.tunable, kept.value, kept.context) == (
        "name:fake0", "nr_requests", 256, {"scheduler": "mq-deadline"})


def test_hostile_a_clamped_read_back_is_an_error_on_that_setting_alone(tmp_path: Path) -> None:
    fs, state = _fake(tmp_path, clamps={"nr_requests": DEPTH}), tmp_path / "state"

    report = executor.apply(fs, THREE, state)

    assert report.ok, report.messages
    (error,) = report.rejections
    assert error.tunable == "nr_requests"
    assert error.reason.startswith("the kernel refused it: read back 128, expected 256;")
    assert read_queue(fs, "fake0", "read_ahead_kb") == "4096"
    assert outcomes(state) == [("rolled-back", "nr_requests"), ("commit", None)]


def test_hostile_a_rollback_that_fails_is_not_run_again(tmp_path: Path) -> None:
    class NoWayBack(PickyKernel):  # takes mq-deadline, then refuses to switch back
        def write_tunable(self, tunable: Tunable, device: str | None, text: str) -> None:
            if tunable.name == "scheduler" and text == "none":
                raise KernelWriteError(16, "Device or resource busy", "scheduler")
            super().write_tunable(tunable, device, text)

    plain = make_fake_kernel(tmp_path / "kernel", {"fake0": dict(FAKE_QUEUE)})
    fs = NoWayBack(plain.sysfs, plain.procfs, refuses={"nr_requests": DEPTH})

    report = executor.apply(fs, THREE, tmp_path / "state")

    assert not report.ok and report.rejections == []
    assert {r.tunable: r.status for r in report.results}["scheduler"] == "rollback-failed"
    assert [w for w in fs.writes if w[1] == "read_ahead_kb"] == []  # never written: no second run
    assert outcomes(tmp_path / "state") == [("rolled-back", "nr_requests")]


def test_hostile_every_device_refusing_is_bounded_and_learnt_over_passes(tmp_path: Path) -> None:
    devices = 6
    fs, state = _fake(tmp_path, devices, refuses={"nr_requests": DEPTH}), tmp_path / "state"
    plan = Plan(changes=[change(f"fake{i}", "nr_requests", DEPTH, 256) for i in range(devices)])

    report = executor.apply(fs, plan, state)

    # One transaction and one refused write per attempt, at most _RETRIES + 1 of them.
    assert not report.ok
    assert len(outcomes(state)) == executor._RETRIES + 1 == 4
    assert len(fs.writes) == 4
    assert [r.device for r in report.rejections] == ["fake0", "fake1", "fake2"]
    assert [r.device for r in refusals.load(state)] == ["fake0", "fake1", "fake2", "fake3"]


def test_hostile_what_depends_on_a_refused_setting_is_blocked_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No catalog tunable depends on nr_requests today: pretend wbt_lat_usec did.
    real = catalog.depends_on
    monkeypatch.setattr(catalog, "depends_on",
                        lambda name: ("nr_requests",) if name == "wbt_lat_usec" else real(name))
    fs = _fake(tmp_path, 2, refuses={"nr_requests": DEPTH})
    for dev in ("fake0", "fake1"):
        (fs.sysfs / "block" / dev / "queue" / "wbt_lat_usec").write_text("2000\n")
    plan = Plan(changes=[change("fake0", "nr_requests", DEPTH, 256),
                         change("fake0", "wbt_lat_usec", 2000, 0),
                         change("fake1", "wbt_lat_usec", 2000, 0)])  # another device: not blocked

    report = executor.apply(fs, plan, tmp_path / "state")

    assert report.ok, report.messages
    assert [(r.device, r.tunable) for r in report.rejections] == [
        ("fake0", "nr_requests"), ("fake0", "wbt_lat_usec")]
    assert report.rejections[1].reason.startswith(
        "wbt_lat_usec is blocked: it depends on nr_requests, which cannot be set on this device"
        " (the kernel refused it: write failed: Invalid argument (EINVAL)")
    assert [(r.device, r.tunable, r.status) for r in report.results] == [
        ("fake1", "wbt_lat_usec", "applied")]
    assert read_queue(fs, "fake0", "wbt_lat_usec") == "2000"


# -- through converge: the plan, the re-apply, the memory ------------------------------------------
def deep_and_streaming(match: str, queue: str, read_ahead: int) -> str:
    """Two profiles for the devices ``match`` selects: ``deep`` sets ``queue`` (a settings mapping),
    ``streaming`` sets read_ahead_kb."""
    return f"""
apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: deep}}
spec:
  rules:
    - {{name: queue, match: {match}, settings: {queue}}}
---
apiVersion: stortune/v1
kind: StorageProfile
metadata: {{name: streaming}}
spec:
  rules:
    - {{name: reads, match: {match}, settings: {{read_ahead_kb: {read_ahead}}}}}
"""


def _profiles(nr_requests: int, scheduler: str | None = None) -> str:
    queue = f"{{nr_requests: {nr_requests}" + (f", scheduler: {scheduler}}}" if scheduler else "}")
    return deep_and_streaming("{kind: [loop]}", queue, 4096)


def _host(tmp_path: Path) -> tuple[Host, PickyKernel, Path]:
    host = build_host(tmp_path / "host")  # loop7: scheduler none, nr_requests 128
    return host, PickyKernel.over(host.fs, refuses={"nr_requests": DEPTH}), tmp_path / "state"


def test_hostile_a_refused_write_in_one_profile_does_not_stop_another_being_kept(tmp_path: Path) -> None:
    host, fs, state = _host(tmp_path)

    report = local.converge(fs, load_profiles(_profiles(256)), state)

    assert report.ok, report.messages
    assert [(r.tunable, r.status, r.profile) for r in report.rows] == [
        ("read_ahead_kb", "applied", None), ("nr_requests", "rejected", "deep")]
    assert "Invalid argument (EINVAL)" in report.rejected[0].message
    assert host.queue("read_ahead_kb") == "4096" and host.queue("nr_requests") == "128"

    # By hand; the daemon's re-apply puts read_ahead_kb back and does not write nr_requests again.
    (host.fs.sysfs / "block/loop7/queue/read_ahead_kb").write_text("256")
    fs.writes.clear()
    again = daemon.converge(fs, state)

    assert again is not None and again.ok
    assert fs.writes == [("loop7", "read_ahead_kb", "4096")]
    assert [(r.tunable, r.status) for r in again.rows] == [
        ("read_ahead_kb", "applied"), ("nr_requests", "rejected")]
    assert "Invalid argument (EINVAL)" in again.rejected[0].message
    assert outcomes(state) == [("rolled-back", "nr_requests"), ("commit", None), ("commit", None)]
    # What the RPC service answers the control plane with: an error of the plan, like a planned one.
    planned = local.plan(fs, load_profiles(_profiles(256)), state).plan
    assert [(r.tunable, r.fatal, r.source.profile) for r in planned.rejections] == [
        ("nr_requests", True, "deep")]
    assert planned.changes == []


def test_a_refused_value_is_tried_again_when_it_or_what_it_is_coupled_to_changes(tmp_path: Path) -> None:
    host, fs, state = _host(tmp_path)
    local.converge(fs, load_profiles(_profiles(256)), state)

    def nr_writes(profiles: str) -> list[str]:
        fs.writes.clear()
        local.converge(fs, load_profiles(profiles), state)
        return [text for _, name, text in fs.writes if name == "nr_requests"]

    assert nr_writes(_profiles(256)) == []  # remembered
    assert nr_writes(_profiles(256, scheduler="mq-deadline")) == ["256"]  # another scheduler
    assert nr_writes(_profiles(64, scheduler="mq-deadline")) == ["64"]  # another value: taken
    assert host.queue("nr_requests") == "64"
    assert nr_writes(_profiles(256, scheduler="mq-deadline")) == ["256"]  # value changed since
    host.builder.write("sys/kernel/random/boot_id", "another-boot", base=host.builder.proc)
    assert nr_writes(_profiles(256, scheduler="mq-deadline")) == ["256"]  # a reboot
    assert [r.boot_id for r in refusals.load(state)] == ["another-boot"]


def test_a_damaged_memory_only_means_the_value_is_tried_again(tmp_path: Path) -> None:
    _, fs, state = _host(tmp_path)
    local.converge(fs, load_profiles(_profiles(256)), state)
    (state / "refused.json").write_text("{not json")
    fs.writes.clear()

    report = local.converge(fs, load_profiles(_profiles(256)), state)

    assert report.ok and [r.tunable for r in report.rejected] == ["nr_requests"]
    assert ("loop7", "nr_requests", "256") in fs.writes
