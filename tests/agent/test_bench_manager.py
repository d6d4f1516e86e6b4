"""The run manager with a fake fio: storage, context, progress, one run at a time, no apply meanwhile."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from stortune.agent import daemon, discovery, journal, local
from stortune.agent.bench.errors import BenchmarkBusyError, BenchmarkError, UnsafeTargetError
from stortune.agent.bench.fio import FioStatus
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bench.fioresult import parse
from stortune.schemas.bench.results import RunProgress
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.documents import parse_profile
from tests.agent.fakefio import FakeFio, capture
from tests.agent.test_bench_signatures import write_bluestore_label
from tests.fixtures.sysfs_builder import SysfsBuilder

RANDRW = capture("fio-3.33-randrw.json")


@pytest.fixture
def fs(tmp_path: Path) -> KernelFS:
    """A host with one unused loop device (loop5, 64 MiB) and its node in the fixture /dev."""
    b = SysfsBuilder(tmp_path / "host", hostname="bench-host")
    _, loop = b.loop(5, size=131072, backing_file="/var/tmp/bench.img")
    b.write(f"{loop}/ro", "0")
    b.write("diskstats", "   7       5 loop5 10 0 80 4 0 0 0 0 0 4 4 0 0 0 0 0 0", base=b.proc)
    kfs = b.finish()
    kfs.dev.mkdir()
    with open(kfs.device_node("loop5"), "wb") as fh:
        fh.truncate(64 << 20)
    return kfs


def spec(*workloads: dict[str, object], repeats: int = 1, **extra: object) -> BenchmarkSpec:
    return parse_benchmark(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "loop-check"},
        "spec": {"target": {"device": {"name": ["loop5"]}}, "allowDestructive": True,
                 "repeats": repeats, "workloads": list(workloads), **extra},
    })))


IOMETER = {"preset": "iometer-4k", "runtime": "1s"}


def manager(fs: KernelFS, state: Path, fio: FakeFio,
            seen: list[RunProgress] | None = None) -> BenchmarkManager:
    return BenchmarkManager(fs, state, runner=fio, sample_interval=0.05,
                            on_progress=seen.append if seen is not None else None, agent_version="9.9")


def test_a_run_is_stored_with_its_context_and_outlives_the_agent(fs: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    fio = FakeFio(RANDRW)
    m = manager(fs, state, fio)
    run_id = m.start(spec(IOMETER, repeats=2), "run-1")
    assert m.wait(run_id, timeout=30).state == "done"
    result = m.result(run_id)
    assert result is not None and result.state == "done" and result.message == "done: 6 step run(s)"
    assert [(r.step, r.repeat) for r in result.runs] == [
        (f"iometer-4k/{p}", r) for r in (0, 1) for p in ("randread", "randwrite", "oltp")]
    expected = parse(RANDRW).metrics()
    summary = result.summaries_by_step()["iometer-4k/oltp"]
    assert summary["read_bandwidth"].n == 2 and summary["read_bandwidth"].mean == expected["read_bandwidth"]
    ctx = result.context
    assert ctx is not None
    assert (ctx.hostname, ctx.fio_version, ctx.agent_version) == ("bench-host", "fio-3.33", "9.9")
    assert ctx.topology_hash == discovery.discover(fs).structure_hash()
    assert ctx.settings["loop5"]["read_ahead_kb"] == 128 and ctx.settings["loop5"]["scheduler"] == "none"
    assert ctx.target.path == str(fs.device_node("loop5")) and ctx.target.facts.drives == 1
    assert f"filename={fs.device_node('loop5')}" in fio.jobs[0] and "rw=randread" in fio.jobs[0]
    # everything on disk: spec, each step's job, fio's JSON and stderr apart, the result
    run_dir = state / "bench" / run_id
    first = result.runs[0]
    assert (run_dir / first.files["job"]).read_text() == fio.jobs[0]
    assert (run_dir / first.files["output"]).read_text() == RANDRW
    assert (run_dir / first.files["stderr"]).exists()
    assert json.loads((run_dir / "spec.json").read_text())["metadata"]["name"] == "loop-check"
    assert [d.device for d in first.devices] == ["loop5"]
    # a new agent process finds it, unchanged, until it is forgotten
    again = manager(fs, state, FakeFio(RANDRW))
    assert again.result(run_id) == result and again.progress(run_id).state == "done"
    again.forget(run_id)
    assert again.runs() == []


def test_progress_goes_queued_running_done(fs: KernelFS, tmp_path: Path) -> None:
    seen: list[RunProgress] = []
    fio = FakeFio(RANDRW, statuses=(FioStatus(50.0, 1e6, 2e6, 100.0, 200.0, 1),))
    m = manager(fs, tmp_path / "state", fio, seen)
    run_id = m.start(spec(IOMETER))
    m.wait(run_id, timeout=30)
    states = [p.state for p in seen]
    assert states[0] == "queued" and states[-1] == "done" and set(states[1:-1]) == {"running"}
    assert seen[-1].percent == 100.0
    percents = [p.percent for p in seen]
    assert percents == sorted(percents)
    live = [p for p in seen if p.read_bytes_per_s == 1e6]
    assert live and live[0].write_iops == 200.0 and live[0].step_count == 3
    assert {p.step for p in seen if p.state == "running"} == {
        "iometer-4k/randread", "iometer-4k/randwrite", "iometer-4k/oltp"}


def profile(value: int) -> list[object]:
    return [parse_profile({"apiVersion": "stortune/v1", "kind": "StorageProfile",
                           "metadata": {"name": "ra"},
                           "spec": {"rules": [{"name": "loops", "match": {"name": ["loop5"]},
                                               "settings": {"read_ahead_kb": value}}]}})]


def test_one_benchmark_at_a_time_and_no_apply_meanwhile(fs: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    fio = FakeFio(RANDRW, hold=True)
    m = manager(fs, state, fio)
    run_id = m.start(spec(IOMETER), "long-one")
    assert fio.running.wait(10)
    with pytest.raises(BenchmarkBusyError, match="busy: benchmark long-one running"):
        m.start(spec(IOMETER), "second")
    # another process with the same state directory is refused through the bench lock
    other = manager(fs, state, FakeFio(RANDRW))
    with pytest.raises(BenchmarkBusyError, match="long-one"):
        other.start(spec(IOMETER), "third")
    assert journal.benchmark_running(state) == "long-one"
    with pytest.raises(BenchmarkBusyError, match="busy: benchmark long-one running"):
        local.apply(fs, profile(4096), state)  # type: ignore[arg-type]
    with pytest.raises(BenchmarkBusyError):
        local.restore(fs, state)
    assert (fs.sysfs / "block/loop5/queue/read_ahead_kb").read_text().strip() == "128"
    fio.release.set()
    assert m.wait(run_id, timeout=30).state == "done"
    assert journal.benchmark_running(state) is None
    assert local.apply(fs, profile(4096), state).ok  # type: ignore[arg-type]
    assert (fs.sysfs / "block/loop5/queue/read_ahead_kb").read_text().strip() == "4096"
    assert sorted(m.runs()) == ["long-one"]  # the refused ones left nothing behind


def test_cancel_keeps_what_ran(fs: KernelFS, tmp_path: Path) -> None:
    fio = FakeFio(RANDRW, hold=True)
    m = manager(fs, tmp_path / "state", fio)
    run_id = m.start(spec(IOMETER))
    assert fio.running.wait(10)
    assert m.cancel(run_id) is True
    final = m.wait(run_id, timeout=30)
    assert final.state == "cancelled"
    result = m.result(run_id)
    assert result is not None and result.state == "cancelled"
    assert [r.state for r in result.runs] == ["cancelled"] and len(fio.calls) == 1
    assert m.cancel(run_id) is False


def test_a_failing_job_fails_the_run_with_fios_reason(fs: KernelFS, tmp_path: Path) -> None:
    fio = FakeFio(capture("fio-3.33-enospc.json"), stderr=capture("fio-3.33-enospc.stderr"), returncode=1)
    m = manager(fs, tmp_path / "state", fio)
    run_id = m.start(spec(IOMETER))
    assert m.wait(run_id, timeout=30).state == "failed"
    result = m.result(run_id)
    assert result is not None and len(result.runs) == 1  # stopped at the first failure
    assert "iometer-4k/randread (repeat 1) failed: job full: error 28 (ENOSPC)" in result.message
    assert "No space left on device" in result.message
    assert result.runs[0].metrics == {} and result.summaries[0].runs == 0


def test_fio_dying_without_output_is_a_clear_failure(fs: KernelFS, tmp_path: Path) -> None:
    m = manager(fs, tmp_path / "state", FakeFio("", stderr="fio: failed to setup shm segment\n",
                                                   returncode=1))
    run_id = m.start(spec(IOMETER))
    m.wait(run_id, timeout=30)
    result = m.result(run_id)
    assert result is not None and result.state == "failed"
    assert "holds no JSON result" in result.message and "failed to setup shm segment" in result.message


def test_thresholds_give_the_verdict(fs: KernelFS, tmp_path: Path) -> None:
    m = manager(fs, tmp_path / "state", FakeFio(RANDRW))
    s = spec(IOMETER, thresholds=[{"metric": "read_iops", "step": "iometer-4k/oltp", "min": "1k"},
                                  {"metric": "write_lat_p99", "step": "iometer-4k/*", "max": "100us"}])
    run_id = m.start(s)
    m.wait(run_id, timeout=30)
    result = m.result(run_id)
    assert result is not None and result.verdict is not None
    # the fake answers every step with the same mixed output: three steps measured write p99
    assert [(o.step, o.passed) for o in result.verdict.outcomes] == [
        ("iometer-4k/oltp", True), ("iometer-4k/randread", False), ("iometer-4k/randwrite", False),
        ("iometer-4k/oltp", False)]
    assert result.message == "done: 3 step run(s); 3 of 4 threshold check(s) failed"


def test_an_unsafe_start_leaves_nothing_behind(fs: KernelFS, tmp_path: Path) -> None:
    write_bluestore_label(fs.device_node("loop5"))
    state = tmp_path / "state"
    m = manager(fs, state, FakeFio(RANDRW))
    with pytest.raises(UnsafeTargetError, match=r"loop5 holds ceph_bluestore \(other\), signature at byte 0"):
        m.start(spec(IOMETER))
    assert m.runs() == [] and m.active() is None and journal.benchmark_running(state) is None
    with pytest.raises(BenchmarkError, match=r"run id '\.\./x'"):
        m.start(spec({"preset": "stream-32k"}), "../x")
    too_big = r"t2/write: 2 job\(s\) x 64MiB need 128MiB, more than the target's 64MiB"
    with pytest.raises(BenchmarkError, match=too_big):
        m.start(spec({"preset": "iozone-seq", "size": "64M"}))


def test_a_run_interrupted_by_an_agent_crash_is_concluded_as_failed(fs: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    m = manager(fs, state, FakeFio(RANDRW))
    run = m.store.create("crashed", spec(IOMETER).document())
    m.store.write_status(RunProgress(run_id="crashed", state="running", percent=40.0), fio_pid=2**22)
    assert run.is_dir()
    restarted = manager(fs, state, FakeFio(RANDRW))
    result = restarted.result("crashed")
    assert result is not None and result.state == "failed" and result.name == "loop-check"
    assert "the agent stopped during the run" in result.message
    # Its progress says so too: a watcher (the control plane) sees the end instead of waiting.
    progress = restarted.progress("crashed")
    assert progress.state == "failed" and progress.finished and progress.percent == 40.0


def test_the_hot_plug_re_apply_waits_for_the_benchmark(fs: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert local.apply(fs, profile(4096), state).ok  # type: ignore[arg-type]
    ra = fs.sysfs / "block/loop5/queue/read_ahead_kb"
    ra.write_text("128\n")  # as after a reboot: the stored desired state must come back
    stop = threading.Event()
    with journal.hold_benchmark(state, "reboot-bench"):
        loop = threading.Thread(target=daemon.run, args=(fs, state, 0.05), kwargs={"stop": stop})
        loop.start()
        time.sleep(0.5)
        assert loop.is_alive() and ra.read_text().strip() == "128"  # postponed, not crashed
    deadline = time.monotonic() + 10
    while ra.read_text().strip() != "4096" and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    loop.join(10)
    assert ra.read_text().strip() == "4096"
