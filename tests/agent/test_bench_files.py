"""Benchmark file targets stay where the host allows: inside its benchmark directories, reached
without following a link or crossing a mount point, and never onto a file stortune did not make.

The runs go through the real BenchmarkManager with a fio stand-in that writes to the target path
the way fio does (by path, following links), so a check that let a path through would show as
a changed victim file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from stortune.agent.bench.errors import BenchmarkError, UnsafeTargetError
from stortune.agent.bench.files import BenchFiles, FileTargetError
from stortune.agent.bench.fio import FioInvocation, FioOutcome, FioStatus
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.documents import DocumentError
from tests.agent.fakefio import FakeFio, capture
from tests.fixtures.sysfs_builder import SysfsBuilder

RANDRW = capture("fio-3.33-randrw.json")
WRITE = {"name": "w", "pattern": "write", "blockSize": "4k", "size": "64k"}
READ = {"name": "r", "pattern": "read", "blockSize": "4k", "size": "64k"}


class PathFio(FakeFio):
    """Canned results, but the target is written by path as fio writes it (links followed);
    ``relayout`` unlinks and makes the file anew first, as fio does to lay a short file out."""

    def __init__(self, *, relayout: bool = False) -> None:
        super().__init__(RANDRW)
        self.relayout = relayout
        self.targets: list[str] = []
        self.relaid = 0

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        job = invocation.job_file.read_text()
        match = re.search(r"^filename=(.*)$", job, re.M)
        assert match is not None
        target = match.group(1).replace("\\:", ":").replace("\\\\", "\\")
        self.targets.append(target)
        if self.relayout and os.path.exists(target):
            os.unlink(target)
            self.relaid += 1
        with open(target, "ab") as fh:  # as fio opens it: links followed
            fh.write(b"fio data\n")
        return super().run(invocation, on_status=on_status, cancel=cancel, on_start=on_start)


@pytest.fixture
def bench(tmp_path: Path) -> Path:
    """A benchmark directory the host allows (root's, mode 0755)."""
    path = tmp_path / "bench"
    path.mkdir(mode=0o755)
    return path


@pytest.fixture
def fs(tmp_path: Path, bench: Path) -> KernelFS:
    """loop5, mounted (says the fixture's mountinfo) at the benchmark directory."""
    b = SysfsBuilder(tmp_path / "host", hostname="bench-host")
    _, loop = b.loop(5, size=131072, backing_file="/var/tmp/bench.img")
    b.write(f"{loop}/ro", "0")
    b.mount(loop, str(bench), "xfs", "/dev/loop5")
    b.mount(None, str(bench / "mnt"), "tmpfs", "tmpfs", devno="0:77")
    return b.finish()


def spec(path: Path | str, *workloads: dict[str, object], destructive: bool = False,
         keep: bool = False, size: str = "4M") -> BenchmarkSpec:
    return parse_benchmark(yaml.safe_load(yaml.safe_dump({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "files"},
        "spec": {"target": {"file": {"path": str(path), "size": size, "keep": keep}},
                 "allowDestructive": destructive, "workloads": list(workloads) or [WRITE]},
    })))


def manager(fs: KernelFS, state: Path, fio: FakeFio, *dirs: Path) -> BenchmarkManager:
    return BenchmarkManager(fs, state, runner=fio, sample_interval=0.05, bench_dirs=dirs)


def run(m: BenchmarkManager, s: BenchmarkSpec) -> BenchmarkResult:
    run_id = m.start(s)
    assert m.wait(run_id, timeout=30).finished
    result = m.result(run_id)
    assert result is not None
    return result


def refused(m: BenchmarkManager, s: BenchmarkSpec) -> str:
    """Why ``m`` refuses ``s`` at the start (nothing may be stored or created)."""
    before = m.runs()
    with pytest.raises(FileTargetError) as err:
        m.start(s)
    assert m.runs() == before and m.active() is None
    assert str(err.value).startswith(f"spec.target.file.path {s.spec.target.file.path!r}: ")  # type: ignore[union-attr]
    return err.value.why


# -- hostile paths ---------------------------------------------------------------------------------
def test_hostile_a_file_outside_the_benchmark_directories_is_refused(fs: KernelFS, tmp_path: Path,
                                                                      bench: Path) -> None:
    fio = PathFio()
    m = manager(fs, tmp_path / "state", fio, bench)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert refused(m, spec(elsewhere / "x.dat", destructive=True)) == (
        f"is not inside a benchmark directory of this host ({tmp_path}/state/bench-files, {bench});"
        " the host decides where benchmark files may be written: stortune-agent serve --bench-dir DIR")
    assert list(elsewhere.iterdir()) == [] and fio.targets == []


def test_hostile_a_symlinked_directory_component_is_refused(fs: KernelFS, tmp_path: Path,
                                                            bench: Path) -> None:
    victim_dir = tmp_path / "etc"
    victim_dir.mkdir()
    (bench / "sub").symlink_to(victim_dir)
    fio = PathFio()
    m = manager(fs, tmp_path / "state", fio, bench)
    assert refused(m, spec(bench / "sub" / "passwd", destructive=True)) == (
        f"{bench}/sub is a symbolic link; links are not followed below a benchmark directory")
    assert list(victim_dir.iterdir()) == [] and fio.targets == []


def test_hostile_a_symlinked_final_component_is_refused(fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_text("precious\n")
    (bench / "x.dat").symlink_to(victim)
    (bench / "dangling.dat").symlink_to(tmp_path / "would-be-created")
    fio = PathFio()
    m = manager(fs, tmp_path / "state", fio, bench)
    for name in ("x.dat", "dangling.dat"):
        assert refused(m, spec(bench / name, WRITE, destructive=True)) == (
            f"{bench}/{name} is a symbolic link; links are not followed below a benchmark directory")
        assert refused(m, spec(bench / name, READ)).endswith("is a symbolic link; links are not"
                                                             " followed below a benchmark directory")
    assert victim.read_text() == "precious\n" and not (tmp_path / "would-be-created").exists()
    assert fio.targets == []


def test_hostile_an_existing_foreign_file_is_refused_whatever_the_workload(fs: KernelFS, tmp_path: Path,
                                                                           bench: Path) -> None:
    foreign = bench / "db.dat"
    foreign.write_text("someone's data\n")
    fio = PathFio()
    m = manager(fs, tmp_path / "state", fio, bench)
    why = ("a file stortune did not create is there; it is not overwritten: give a path that does not"
           " exist yet")
    assert refused(m, spec(foreign, WRITE, destructive=True)) == why
    assert refused(m, spec(foreign, READ)) == why  # fio lays a short file out anew to read it
    assert foreign.read_text() == "someone's data\n" and fio.targets == []


def test_hostile_a_new_file_on_stortunes_freed_inode_is_refused(fs: KernelFS, tmp_path: Path,
                                                               bench: Path) -> None:
    m = manager(fs, tmp_path / "state", PathFio(), bench)
    target = bench / "kept.dat"
    assert run(m, spec(target, keep=True)).state == "done"
    target.unlink()  # someone removes stortune's file and makes their own at the same path:
    target.write_text("someone's data\n")  # ext4 and xfs hand it the freed inode number
    assert refused(m, spec(target, WRITE, destructive=True)).startswith("a file stortune did not create")
    assert target.read_text() == "someone's data\n"


@pytest.mark.parametrize(("raw", "why"), [
    ("relative/x.dat", "must be an absolute path"),
    ("/srv/bench/../etc/passwd", "must be plain: no '.', '..' or empty component, no trailing '/'"),
    ("/srv/bench/./x.dat", "must be plain: no '.', '..' or empty component, no trailing '/'"),
    ("/srv/bench//x.dat", "must be plain: no '.', '..' or empty component, no trailing '/'"),
    ("/srv/bench/", "must be plain: no '.', '..' or empty component, no trailing '/'"),
    ("/srv/bench/x\x00.dat", "holds a NUL or another control character"),
    ("/srv/bench/x\n.dat", "holds a NUL or another control character"),
    ("/srv/bench/\ud800.dat", "is not valid UTF-8 text"),
    ("/srv/bench/" + "x" * 256, "has a component longer than 255 bytes (NAME_MAX)"),
    ("/srv/bench" + "/d" * 2043, "is longer than 4095 bytes (PATH_MAX)"),
    ("/dev/sda", "is under /dev; to benchmark a device, use target.device with a match"),
    ("/sys/block/sda/queue/scheduler",
     "is under /sys; to benchmark a device, use target.device with a match"),
    ("/proc/sys/vm/drop_caches", "is under /proc; to benchmark a device, use target.device with a match"),
])
def test_hostile_paths_are_refused_by_the_agent_itself(fs: KernelFS, tmp_path: Path, raw: str,
                                                      why: str) -> None:
    # The same rules as the document's validation, checked again where the file is written:
    # these reach BenchFiles only from a caller that skipped the schema.
    files = BenchFiles(fs, tmp_path / "state", [Path("/srv/bench")])
    with pytest.raises(FileTargetError) as err:
        files.check(raw)
    assert err.value.why == why


def test_hostile_paths_are_refused_by_the_document_too() -> None:
    for raw in ("relative", "/srv/../etc/passwd", "/srv/./x", "/srv//x", "/srv/x\x00",
                "/srv/" + "x" * 256, "/s" * 2048, "/dev/sda", "/proc/1/mem", "/srv/\udcff"):
        with pytest.raises(DocumentError, match=r"spec\.target\.file\.path"):
            spec(raw)


def test_hostile_a_host_directory_holding_the_state_directory_does_not_open_it(fs: KernelFS,
                                                                              tmp_path: Path) -> None:
    state = tmp_path / "state"
    m = manager(fs, state, PathFio(), tmp_path)  # the host gave a directory that holds the state
    for target in (state / "originals.json", state / "bench" / "x.dat", state / "new.dat"):
        assert refused(m, spec(target, destructive=True)) == (
            f"is in the agent's state directory {state}; benchmark files go in {state}/bench-files there")
    assert run(m, spec(state / "bench-files" / "x.dat")).state == "done"


def test_hostile_a_mount_point_below_a_benchmark_directory_is_refused(fs: KernelFS, tmp_path: Path,
                                                                      bench: Path) -> None:
    (bench / "mnt").mkdir()  # the fixture's mountinfo has a tmpfs there
    m = manager(fs, tmp_path / "state", PathFio(), bench)
    assert refused(m, spec(bench / "mnt" / "x.dat", destructive=True)) == (
        f"{bench}/mnt is a mount point; a file target stays on the filesystem of its benchmark directory")


@pytest.mark.root
def test_hostile_a_bind_mount_below_a_benchmark_directory_is_refused(tmp_path: Path, bench: Path) -> None:
    """A bind mount of another directory of the same filesystem: same st_dev, only mountinfo knows."""
    if shutil.which("mount") is None:
        pytest.skip("mount is not installed")
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (bench / "escape").mkdir()
    proc = subprocess.run(["mount", "--bind", str(victim_dir), str(bench / "escape")],
                          capture_output=True, text=True, timeout=30, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {proc.stderr.strip()}")
    try:
        m = manager(KernelFS.at(), tmp_path / "state", PathFio(), bench)
        assert refused(m, spec(bench / "escape" / "x.dat", destructive=True)) == (
            f"{bench}/escape is a mount point; a file target stays on the filesystem of its"
            " benchmark directory")
        assert list(victim_dir.iterdir()) == []
    finally:
        subprocess.run(["umount", str(bench / "escape")], check=True, timeout=30)


def test_hostile_directories_others_can_change_are_refused(fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    m = manager(fs, tmp_path / "state", PathFio(), bench)
    shared = bench / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert refused(m, spec(shared / "x.dat", destructive=True)) == (
        f"{shared} is writable by others (mode 1777); they could swap its files for links: chmod go-w")
    theirs = bench / "theirs"
    theirs.mkdir()
    os.chown(theirs, 65534, 65534)
    assert refused(m, spec(theirs / "x.dat", destructive=True)) == (
        f"{theirs} belongs to uid 65534, not to the agent's user; whoever owns it could swap its files"
        " for links")
    bench.chmod(0o775)
    assert refused(m, spec(bench / "x.dat", destructive=True)).startswith(
        f"{bench} is writable by others (mode 775)")


def test_hostile_a_component_swapped_for_a_link_after_the_check_is_refused(fs: KernelFS, tmp_path: Path,
                                                                           bench: Path) -> None:
    (bench / "sub").mkdir()
    victim_dir = tmp_path / "etc"
    victim_dir.mkdir()
    files = BenchFiles(fs, tmp_path / "state", [bench])
    raw = str(bench / "sub" / "x.dat")
    files.check(raw)
    (bench / "sub").rename(bench / "old")
    (bench / "sub").symlink_to(victim_dir)
    with pytest.raises(FileTargetError, match="sub is a symbolic link"):
        files.claim(raw, "run-1")
    assert list(victim_dir.iterdir()) == []


class SwappingFio(PathFio):
    """Before fio opens the target by path, someone retargets ``link`` (a --bench-dir spelled through
    a link in a directory they own) to ``victim``: what fio opens then is wherever the link points."""

    def __init__(self, link: Path, victim: Path) -> None:
        super().__init__()
        self.link, self.victim = link, victim

    def run(self, invocation: FioInvocation, *, on_status: Callable[[FioStatus], None],
            cancel: threading.Event, on_start: Callable[[int], None] | None = None) -> FioOutcome:
        self.link.unlink()
        self.link.symlink_to(self.victim)
        return super().run(invocation, on_status=on_status, cancel=cancel, on_start=on_start)


def test_hostile_a_bench_dir_given_through_a_link_others_can_swap_writes_only_the_real_directory(
        fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    """``--bench-dir /home/alice/bench`` where that is alice's link to a root-owned directory: the
    checks pass on the real directory, but fio opened the path as the spec spelled it, through
    alice's link; swapped after the check, it led root's fio (and the record, and the removal of
    the run's file) into a directory of alice's choosing."""
    home = tmp_path / "home" / "alice"
    home.mkdir(parents=True)
    os.chown(home, 1000, 1000)  # alice's: she may replace what is in it
    link = home / "bench"
    link.symlink_to(bench)
    victim_dir = tmp_path / "etc"
    victim_dir.mkdir()
    victim = victim_dir / "x.dat"
    victim.write_text("precious\n")
    fio = SwappingFio(link, victim_dir)
    m = manager(fs, tmp_path / "state", fio, link)
    result = run(m, spec(link / "x.dat", destructive=True))
    assert victim.read_text() == "precious\n" and sorted(victim_dir.iterdir()) == [victim]
    assert result.state == "done", result.message
    assert fio.targets == [str(bench / "x.dat")]  # the directory as it was resolved, links gone
    assert not (bench / "x.dat").exists()  # made by the run, removed after it


def test_hostile_a_file_that_appears_between_the_check_and_the_run_is_not_taken(
        fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    files = BenchFiles(fs, tmp_path / "state", [bench])
    raw = str(bench / "x.dat")
    files.check(raw)
    Path(raw).write_text("raced in\n")
    with pytest.raises(FileTargetError, match="a file stortune did not create appeared there"):
        files.claim(raw, "run-1")
    assert Path(raw).read_text() == "raced in\n"


def test_hostile_an_unreadable_record_overwrites_nothing(fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "bench-files.json").write_text("{not json")
    (bench / "x.dat").write_text("mine?\n")
    with pytest.raises(BenchmarkError, match=r"bench-files\.json cannot be read"):
        BenchFiles(fs, state, [bench]).check(str(bench / "x.dat"))


# -- what the host allows ----------------------------------------------------------------------------
def test_by_default_only_the_state_directory_is_allowed(fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    state = tmp_path / "state"
    fio = PathFio()
    m = manager(fs, state, fio)  # no --bench-dir
    assert refused(m, spec(bench / "x.dat")) == (
        f"is not inside a benchmark directory of this host ({state}/bench-files); the host decides where"
        " benchmark files may be written: stortune-agent serve --bench-dir DIR")
    own = state / "bench-files" / "x.dat"
    result = run(m, spec(own))
    assert result.state == "done", result.message
    assert fio.targets == [str(own)] and not own.exists()  # made by the run, removed after it
    assert (state / "bench-files").stat().st_mode & 0o777 == 0o700
    assert result.context is not None and result.context.target.path == str(own)


def test_a_file_stortune_created_earlier_may_be_overwritten(fs: KernelFS, tmp_path: Path,
                                                            bench: Path) -> None:
    fio = PathFio()
    m = manager(fs, tmp_path / "state", fio, bench)
    target = bench / "kept.dat"
    first = run(m, spec(target, keep=True))
    assert first.state == "done" and target.read_bytes() == b"fio data\n"
    assert first.context is not None and first.context.target.device == "loop5"
    with pytest.raises(UnsafeTargetError, match="the file exists and w would overwrite it"):
        m.start(spec(target))  # still needs allowDestructive to overwrite
    second = run(m, spec(target, destructive=True))
    assert second.state == "done", second.message
    assert target.read_bytes() == b"fio data\nfio data\n"  # overwritten in place, and kept: it existed
    third = run(m, spec(target, READ))
    assert third.state == "done"


def test_a_file_fio_lays_out_anew_is_still_stortunes(fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    fio = PathFio(relayout=True)
    m = manager(fs, tmp_path / "state", fio, bench)
    target = bench / "relaid.dat"
    assert run(m, spec(target, READ, WRITE, keep=True)).state == "done"
    assert run(m, spec(target, READ, destructive=True)).state == "done"  # still stortune's
    assert fio.relaid == 3 and target.read_bytes() == b"fio data\n"


def test_a_file_left_busy_by_a_dead_agent_is_taken_back(fs: KernelFS, tmp_path: Path, bench: Path) -> None:
    state = tmp_path / "state"
    raw = str(bench / "x.dat")
    assert BenchFiles(fs, state, [bench]).claim(raw, "run-1")
    os.unlink(raw)  # fio laid it out anew, then the agent died before recording it
    Path(raw).write_bytes(b"fio data\n")
    assert BenchFiles(fs, state, [bench]).check(raw).exists


def test_a_fresh_file_step_makes_the_file_anew_through_the_directory(fs: KernelFS, tmp_path: Path,
                                                                     bench: Path) -> None:
    fio = PathFio()
    m = manager(fs, tmp_path / "state", fio, bench)
    target = bench / "iozone.dat"
    result = run(m, spec(target, {"preset": "iozone-seq", "size": "1M"}, size="16M"))
    assert result.state == "done", result.message
    assert not target.exists() and set(fio.targets) == {str(target)}
    assert json.loads((tmp_path / "state" / "bench-files.json").read_text()) == {"files": {}}


# -- the agent's command line ------------------------------------------------------------------------
def agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "stortune.agent.cli", *args], capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "outside"
    path.mkdir()
    yield path
    assert list(path.iterdir()) == [], "a refused benchmark left a file behind"


def test_the_agent_cli_writes_files_only_in_its_directories(tmp_path: Path, outside: Path) -> None:
    state = tmp_path / "state"
    proc = agent("bench", "--preset", "seq-64k", "--target", str(outside / "x.dat"), "--file-size", "4M",
                 "--runtime", "1s", "--state-dir", str(state))
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: spec.target.file.path '{outside}/x.dat': is not inside a benchmark directory of this"
        f" host ({state}/bench-files); the host decides where benchmark files may be written:"
        " stortune-agent serve --bench-dir DIR")
    for bad, why in (("/", "a benchmark directory of / would let benchmarks write any file"),
                     ("relative", "give an absolute directory"), ("/proc/self", "is under /proc")):
        proc = agent("bench", "--preset", "seq-64k", "--target", str(outside / "x.dat"),
                     "--bench-dir", bad, "--state-dir", str(state))
        assert proc.returncode != 0 and why in proc.stderr and "--bench-dir" in proc.stderr


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)")
def test_the_agent_cli_runs_fio_on_a_file_in_a_given_directory(tmp_path: Path, bench: Path) -> None:
    proc = agent("bench", "--preset", "seq-64k", "--target", str(bench / "x.dat"), "--file-size", "4M",
                 "--runtime", "1s", "--state-dir", str(tmp_path / "state"), "--bench-dir", str(bench),
                 "-o", "json")
    assert proc.returncode == 0, proc.stderr
    assert [s["step"] for s in yaml.safe_load(proc.stdout)["summaries"]] == ["seq-64k/read", "seq-64k/write"]
    assert list(bench.iterdir()) == []  # made by the run, removed after it


def test_serve_takes_its_benchmark_directories_from_the_host() -> None:
    from stortune.agent.cli import build_parser

    args = build_parser().parse_args(["serve", "--bench-dir", "/srv/bench/", "--bench-dir", "/data//b"])
    assert args.bench_dir == [Path("/srv/bench"), Path("/data/b")]
    assert build_parser().parse_args(["serve"]).bench_dir == []
    for bad in ("/", "srv", "/sys/block", "/dev"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", "--bench-dir", bad])
