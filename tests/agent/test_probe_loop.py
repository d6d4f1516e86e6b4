"""The probe with real fio on four real loop devices, seen by the agent as the members of an md
raid0: a fixture sysfs tree describes the array, and its dev dir holds block device nodes with
the loop devices' own numbers, so fio reads the real devices through the fixture's nodes."""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from stortune.agent import journal
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.jobs import ProbeSettings
from stortune.agent.probe.runner import ProbeManager
from stortune.agent.probe.store import load_measured
from tests.fixtures.sysfs_builder import SysfsBuilder
from tests.loopdev import _require_loop, fresh_loop

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)"),
]
SIZE = 16 << 20


def _digest(name: str) -> str:
    with open(f"/dev/{name}", "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _fill_random(name: str, seed: int) -> None:
    """Our own loop device gets content of its own, so an unchanged hash means something."""
    buf = mmap.mmap(-1, SIZE)
    buf.write(hashlib.shake_256(str(seed).encode()).digest(SIZE))
    fd = os.open(f"/dev/{name}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        os.write(fd, buf)
        os.fsync(fd)
    finally:
        os.close(fd)
        buf.close()


@pytest.fixture
def array(tmp_path: Path) -> Iterator[tuple[KernelFS, list[str]]]:
    _require_loop()
    with contextlib.ExitStack() as stack:
        loops = [stack.enter_context(fresh_loop(tmp_path, SIZE, direct_io=True)) for _ in range(4)]
        b = SysfsBuilder(tmp_path / "host", hostname="probe-loop")
        dirs = []
        for name in loops:
            major, minor = (int(x) for x in Path(f"/sys/block/{name}/dev").read_text().split(":"))
            if (major, minor) != (7, int(name[4:])):
                pytest.skip(f"{name} is {major}:{minor}: the fixture numbers loop devices 7:N")
            dirs.append(b.loop(minor, size=SIZE // 512)[1])
        b.md(0, dirs, level="raid0", chunk=512 << 10)
        fs = b.finish()
        fs.dev.mkdir(parents=True, exist_ok=True)
        for i, name in enumerate(loops):
            _fill_random(name, i)
            os.mknod(fs.dev / name, stat.S_IFBLK | 0o600, os.makedev(7, int(name[4:])))
        yield fs, loops


def test_the_probe_reads_the_members_of_an_array_without_changing_them(
        array: tuple[KernelFS, list[str]], tmp_path: Path) -> None:
    fs, loops = array
    before = {name: _digest(name) for name in loops}
    state = tmp_path / "state"
    probes = ProbeManager(fs, state, settings=ProbeSettings(seconds=0.5))
    probe_id = probes.start("md0")
    assert probes.wait(probe_id, timeout=120).state == "done", probes.progress(probe_id).message
    assert {name: _digest(name) for name in loops} == before
    assert journal.benchmark_running(state) is None
    with journal.hold_benchmark(state, "next-benchmark", apply_timeout=0):
        pass  # a benchmark can take the host right after
    result = probes.result(probe_id)
    assert result is not None and result.members == loops
    alone = [c for c in result.ceilings if "+" not in c.device]
    assert [c.device for c in alone] == loops
    for c in alone:
        assert c.read_bytes_per_second and c.read_bytes_per_second > 0
        assert c.read_iops and c.read_iops > 0
    assert [p.count for p in result.scaling] == [1, 2, 4]
    assert all(p.read_bytes_per_second > 0 for p in result.scaling)
    assert result.ceilings[-1].device == "+".join(loops)
    assert {c.device for c in load_measured(state)} == {*loops, "+".join(loops)}
    jobs = sorted((state / "probes" / probe_id / "steps").glob("*/job.fio"))
    assert len(jobs) == 10 and all("write" not in j.read_text() for j in jobs)


def test_a_cancelled_probe_leaves_no_fio_and_frees_the_host(
        array: tuple[KernelFS, list[str]], tmp_path: Path) -> None:
    fs, _ = array
    state = tmp_path / "state"
    probes = ProbeManager(fs, state, settings=ProbeSettings(seconds=30))
    probe_id = probes.start("md0")
    for _ in range(400):  # until the first fio runs
        if probes.progress(probe_id).state == "running":
            break
        probes.wait(probe_id, timeout=0.05)
    assert probes.cancel(probe_id)
    assert probes.wait(probe_id, timeout=60).state == "cancelled"
    assert journal.benchmark_running(state) is None
    assert load_measured(state) == []
    from tests.agent.procs import processes_with

    assert processes_with(str(state / "probes" / probe_id)) == []


def test_fio_run_read_only_refuses_a_write_job(array: tuple[KernelFS, list[str]], tmp_path: Path) -> None:
    import threading

    from stortune.agent.bench.fio import FioInvocation, SubprocessFioRunner

    fs, loops = array
    before = _digest(loops[0])
    job = tmp_path / "write.fio"
    job.write_text(f"[w]\nfilename={fs.dev / loops[0]}\nrw=write\nbs=4k\nsize=1m\ndirect=1\n")
    outcome = SubprocessFioRunner().run(
        FioInvocation(job, tmp_path / "out.json", tmp_path / "err.txt", tmp_path, readonly=True),
        on_status=lambda _s: None, cancel=threading.Event())
    assert outcome.returncode != 0
    assert _digest(loops[0]) == before
