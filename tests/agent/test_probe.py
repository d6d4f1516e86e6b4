"""The probe's checks and lock on a fixture host, with a fake fio: what it refuses, and that a
probe and a benchmark never hold the host at once."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from stortune.agent import journal
from stortune.agent.bench.errors import BenchmarkBusyError
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.jobs import ProbeSettings
from stortune.agent.probe.members import ProbeDeviceError
from stortune.agent.probe.runner import ProbeManager
from stortune.agent.probe.store import load_measured
from stortune.schemas.analysis.probe import ScalingPoint, scaling_counts, with_gains
from stortune.schemas.bench.spec import parse_benchmark
from tests.agent.fakefio import FakeFio, capture
from tests.fixtures.sysfs_builder import Queue, SysfsBuilder

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="device nodes need root (mknod)")
FIVE_SECONDS = ProbeSettings(seconds=5)


def _node(fs: KernelFS, name: str, devno: tuple[int, int]) -> None:
    fs.dev.mkdir(parents=True, exist_ok=True)
    os.mknod(fs.dev / name, stat.S_IFBLK | 0o600, os.makedev(*devno))


@pytest.fixture
def fs(tmp_path: Path) -> KernelFS:
    """md0 (raid5) over four SATA disks sdb..sde; loop3 alone; nodes in the fixture's dev dir
    carry the fixture's device numbers (nothing reads them: fio is fake here)."""
    b = SysfsBuilder(tmp_path / "host", hostname="probe-host")
    host = b.scsi_host(b.pci("0000:00:17.0"), 0, "ahci")
    disks = [b.scsi_disk(host, (0, 0, i, 0), vendor="ATA", model="ST4000NM0035", rev="SN04", size=1 << 24,
                         queue=Queue.hdd())[1] for i in range(4)]
    b.md(0, disks, level="raid5", chunk=512 << 10)
    b.loop(3, size=131072)
    fs = b.finish()
    for i, name in enumerate(["sda", "sdb", "sdc", "sdd"]):
        _node(fs, name, (8, 16 * i))
    _node(fs, "md0", (9, 0))
    _node(fs, "loop3", (7, 3))
    return fs


def manager(fs: KernelFS, tmp_path: Path, fio: FakeFio) -> ProbeManager:
    return ProbeManager(fs, tmp_path / "state", runner=fio, settings=FIVE_SECONDS, apply_wait=0.5)


@pytest.mark.parametrize("device", ["../../etc/passwd", "/dev/sda", "sda/../sdb", "", "host"])
def test_a_device_that_is_a_path_is_refused_naming_device(fs: KernelFS, tmp_path: Path, device: str) -> None:
    fio = FakeFio(capture("fio-3.33-two-jobs.json"))
    with pytest.raises(ProbeDeviceError, match="device"):
        manager(fs, tmp_path, fio).start(device)
    assert fio.calls == [] and journal.benchmark_running(tmp_path / "state") is None


def test_a_device_not_on_the_host_is_refused(fs: KernelFS, tmp_path: Path) -> None:
    with pytest.raises(ProbeDeviceError, match="'sdz' is not a block device of this host"):
        manager(fs, tmp_path, FakeFio("")).start("sdz")


def test_a_node_that_is_not_the_discovered_device_is_refused(fs: KernelFS, tmp_path: Path) -> None:
    (fs.dev / "sdb").unlink()
    (fs.dev / "sdb").write_text("not a device")  # a plain file fio would happily read
    with pytest.raises(ProbeDeviceError, match=r"sdb: .* is not a block device node"):
        manager(fs, tmp_path, FakeFio("")).start("md0")
    (fs.dev / "sdc").unlink()
    os.mknod(fs.dev / "sdc", stat.S_IFBLK | 0o600, os.makedev(8, 99))
    (fs.dev / "sdb").unlink()
    os.mknod(fs.dev / "sdb", stat.S_IFBLK | 0o600, os.makedev(8, 16))
    with pytest.raises(ProbeDeviceError, match=r"sdc: .* is device 8:99, but sysfs says sdc is 8:32"):
        manager(fs, tmp_path, FakeFio("")).start("md0")


def test_an_array_is_probed_through_its_members_read_only(fs: KernelFS, tmp_path: Path) -> None:
    fio = FakeFio(capture("fio-3.33-two-jobs.json"))
    probes = manager(fs, tmp_path, fio)
    probe_id = probes.start("md0")
    assert probes.wait(probe_id, timeout=60).state == "done"
    result = probes.result(probe_id)
    assert result is not None and result.members == ["sda", "sdb", "sdc", "sdd"]
    names = [call.job_file.parent.name for call in fio.calls]
    assert names == ["00-seq-sda", "01-rand-sda", "02-seq-sdb", "03-rand-sdb", "04-seq-sdc",
                     "05-rand-sdc", "06-seq-sdd", "07-rand-sdd", "08-scale-2", "09-scale-4"]
    assert all(call.readonly for call in fio.calls)
    for job in fio.jobs:
        assert "direct=1" in job and "runtime=5000ms" in job
        assert "write" not in job.replace("readonly", "")
    assert "filename=" + str(fs.dev / "sdd") in fio.jobs[-1] and "rw=read\n" in fio.jobs[-1]
    assert "rw=randread" in fio.jobs[1] and "bs=4096" in fio.jobs[1]
    assert [p.count for p in result.scaling] == [1, 2, 4]
    assert [c.device for c in result.ceilings] == ["sda", "sdb", "sdc", "sdd", "sda+sdb+sdc+sdd"]
    assert load_measured(tmp_path / "state") == sorted(result.ceilings, key=lambda c: c.device)
    assert journal.benchmark_running(tmp_path / "state") is None


def test_a_probe_and_a_benchmark_never_hold_the_host_at_once(fs: KernelFS, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with journal.hold_benchmark(state, "bench-1"), pytest.raises(BenchmarkBusyError, match="bench-1"):
        manager(fs, tmp_path, FakeFio("")).start("loop3")
    fio = FakeFio(capture("fio-3.33-two-jobs.json"), hold=True)
    probes = manager(fs, tmp_path, fio)
    probe_id = probes.start("loop3")
    assert fio.running.wait(10)
    spec = parse_benchmark(yaml.safe_load(
        "apiVersion: stortune/v1\nkind: BenchmarkSpec\nmetadata: {name: b}\n"
        "spec: {target: {device: {name: [loop3]}},"
        " workloads: [{name: r, pattern: read, blockSize: 1m, runtime: 1s}]}"))
    bench = BenchmarkManager(fs, state, runner=FakeFio(capture("fio-3.33-two-jobs.json")), apply_wait=0.5)
    with pytest.raises(BenchmarkBusyError, match=probe_id):
        bench.start(spec)
    with pytest.raises(BenchmarkBusyError, match=probe_id):
        probes.start("md0")
    assert probes.cancel(probe_id)
    assert probes.wait(probe_id, timeout=60).state == "cancelled"
    result = probes.result(probe_id)
    assert result is not None and result.state == "cancelled"
    assert load_measured(state) == []  # a cancelled probe measured nothing to keep
    assert not probes.cancel(probe_id)
    run_id = bench.start(spec)  # the lock is free again
    assert bench.wait(run_id, timeout=60).state == "done"


def test_a_failing_fio_fails_the_probe_and_frees_the_host(fs: KernelFS, tmp_path: Path) -> None:
    probes = manager(fs, tmp_path, FakeFio(capture("fio-3.33-setup-error.json"), returncode=1))
    probe_id = probes.start("loop3")
    progress = probes.wait(probe_id, timeout=60)
    assert progress.state == "failed" and "seq-loop3" in progress.message
    assert journal.benchmark_running(tmp_path / "state") is None
    assert load_measured(tmp_path / "state") == []


def test_scaling_stops_where_a_count_adds_under_ten_percent() -> None:
    assert scaling_counts(1) == [1] and scaling_counts(4) == [1, 2, 4] and scaling_counts(6) == [1, 2, 4, 6]
    points = [ScalingPoint(count=k, devices=[], read_bytes_per_second=bw)
              for k, bw in ((1, 100.0), (2, 195.0), (4, 210.0), (8, 400.0))]
    scaled, stops = with_gains(points)
    assert stops == 4 and scaled[1].gain == pytest.approx(0.95) and scaled[0].gain is None
    assert with_gains(points[:2])[1] is None
