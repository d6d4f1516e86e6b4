"""Real fio on real loop devices (root): a preset end to end, a destructive spec refused on a
device holding a filesystem, cancel leaving no fio behind, and read-ahead shown to matter."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from stortune.agent import local
from stortune.agent.bench.errors import UnsafeTargetError
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.bench.stats import compare
from stortune.schemas.documents import parse_profile
from stortune.schemas.profile import StorageProfile
from tests.agent.procs import pids_in_group, processes_with

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)"),
]
HOST = KernelFS.at()


def spec(device: str, *workloads: dict[str, object], destructive: bool = False,
         repeats: int = 1) -> BenchmarkSpec:
    return parse_benchmark(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "loop-bench"},
        "spec": {"target": {"device": {"kind": ["loop"], "name": [device]}},
                 "allowDestructive": destructive, "repeats": repeats, "workloads": list(workloads)},
    })))


def run(manager: BenchmarkManager, s: BenchmarkSpec) -> BenchmarkResult:
    run_id = manager.start(s)
    assert manager.wait(run_id, timeout=300).finished
    result = manager.result(run_id)
    assert result is not None
    return result


def test_a_preset_runs_end_to_end(loop_device: str, tmp_path: Path) -> None:
    manager = BenchmarkManager(HOST, tmp_path / "state", sample_interval=0.25)
    result = run(manager, spec(loop_device, {"preset": "iometer-4k", "runtime": "1s"}, destructive=True))
    assert result.state == "done", result.message
    assert [r.step for r in result.runs] == ["iometer-4k/randread", "iometer-4k/randwrite", "iometer-4k/oltp"]
    read, write, oltp = result.summaries
    assert read.metrics["read_iops"].mean > 0 and "write_iops" not in read.metrics
    assert write.metrics["write_bandwidth"].mean > 0 and "read_iops" not in write.metrics
    assert oltp.metrics["read_iops"].mean > oltp.metrics["write_iops"].mean  # 67/33
    for step_run in result.runs:
        (device,) = step_run.devices
        assert device.device == loop_device and device.read_iops + device.write_iops > 0
        assert step_run.fio is not None and step_run.fio.fio_version == "fio-3.33"
        assert (manager.store.dir(result.run_id) / step_run.files["output"]).stat().st_size > 1000
    assert result.context is not None
    assert result.context.settings[loop_device]["read_ahead_kb"] == int(
        Path(f"/sys/block/{loop_device}/queue/read_ahead_kb").read_text())
    assert result.context.warnings == []


def test_a_destructive_spec_on_a_device_holding_a_filesystem_is_refused(loop_device: str,
                                                                        tmp_path: Path) -> None:
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed (Debian package e2fsprogs)")
    subprocess.run(["mkfs.ext4", "-q", "-F", f"/dev/{loop_device}"], check=True, timeout=60)
    manager = BenchmarkManager(HOST, tmp_path / "state")
    with pytest.raises(UnsafeTargetError) as err:
        manager.start(spec(loop_device, {"preset": "seq-1m", "runtime": "1s"}, destructive=True))
    assert err.value.reasons == [f"{loop_device} holds ext4 (filesystem), signature at byte 1080"]
    assert manager.runs() == []


def test_cancelling_mid_run_leaves_no_fio_process(loop_device: str, tmp_path: Path) -> None:
    manager = BenchmarkManager(HOST, tmp_path / "state")
    long_read = {"name": "long", "pattern": "randread", "blockSize": "4k", "iodepth": 4,
                 "numjobs": 2, "runtime": "5m"}
    run_id = manager.start(spec(loop_device, long_read))
    deadline = time.monotonic() + 30
    pid = None
    while pid is None and time.monotonic() < deadline:
        stored = manager.store.read_status(run_id)
        pid = stored[1] if stored else None
        time.sleep(0.1)
    assert pid is not None, "fio never started"
    run_dir, deadline = str(manager.store.dir(run_id)), time.monotonic() + 30
    while len(processes_with(run_dir)) < 3 and time.monotonic() < deadline:  # mid-run: both jobs forked
        time.sleep(0.1)
    assert pids_in_group(pid) and len(processes_with(run_dir)) >= 3, "fio's jobs are not running"
    assert manager.cancel(run_id)
    # Cancelled, not run out: the 5-minute run ends as "cancelled" (the generous wait is a bound
    # on a hang, not the claim).
    assert manager.wait(run_id, timeout=300).state == "cancelled"
    assert pids_in_group(pid) == []
    assert processes_with(str(manager.store.dir(run_id))) == []
    result = manager.result(run_id)
    assert result is not None and result.state == "cancelled" and result.runs[0].state == "cancelled"


def read_ahead(device: str, kb: int) -> list[StorageProfile]:
    return [parse_profile({
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "read-ahead"},
        "spec": {"rules": [{"name": "bench-loop", "match": {"kind": ["loop"], "name": [device]},
                            "settings": {"read_ahead_kb": kb}}]},
    })]


def test_read_ahead_makes_buffered_sequential_reads_significantly_faster(
        loop_devices: Callable[[int], list[str]], tmp_path: Path) -> None:
    (device,) = loop_devices(1)
    # The backing file's page cache would serve the second run from memory: with direct I/O
    # the loop device reads the file on disk every time, and read-ahead decides request sizes.
    if subprocess.run(["losetup", "--direct-io=on", f"/dev/{device}"], capture_output=True,
                      timeout=30, check=False).returncode != 0:
        pytest.skip("this kernel cannot switch the loop device to direct I/O")
    assert Path(f"/sys/block/{device}/loop/dio").read_text().strip() == "1"
    subprocess.run(["dd", "if=/dev/urandom", f"of=/dev/{device}", "bs=1M", "count=64", "oflag=direct",
                    "status=none"], check=True, timeout=120)  # real blocks, not holes
    state = tmp_path / "state"
    manager = BenchmarkManager(HOST, state)
    stream = {"name": "stream", "pattern": "read", "blockSize": "32k", "direct": False}
    results = {}
    try:
        for kb in (0, 4096):
            assert local.apply(HOST, read_ahead(device, kb), state).ok
            results[kb] = run(manager, spec(device, stream, repeats=5))
            assert results[kb].state == "done", results[kb].message
    finally:
        local.restore(HOST, state)
    before, after = results[0], results[4096]
    assert before.context and before.context.settings[device]["read_ahead_kb"] == 0
    assert after.context and after.context.settings[device]["read_ahead_kb"] == 4096
    (bandwidth,) = [d for d in compare(before.summaries_by_step(), after.summaries_by_step())
                    if d.metric == "read_bandwidth"]
    assert bandwidth.significant and bandwidth.verdict == "better", bandwidth
    print(f"\nread_ahead_kb 0 -> 4096: {bandwidth.a.mean / 1e6:.1f} -> {bandwidth.b.mean / 1e6:.1f} MB/s"
          f" ({bandwidth.delta_pct:+.0f}%, noise band ±{bandwidth.noise_pct:.0f}%,"
          f" CV {bandwidth.a.cv:.1%} / {bandwidth.b.cv:.1%})")
