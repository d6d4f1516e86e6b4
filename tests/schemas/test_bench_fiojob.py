"""Steps rendered as fio job files, and checked by fio itself (--parse-only)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from stortune.schemas.bench import presets
from stortune.schemas.bench.fiojob import FioTarget, JobError, regions, render
from stortune.schemas.bench.spec import load_benchmark
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep

MiB = 1 << 20
DISK = FioTarget("/dev/sdx", 64 * MiB)


def options(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def iozone(threads: int, phase: str) -> WorkloadStep:
    steps = presets.expand("iozone-seq", "iozone-seq", presets.Overrides(size=4 * MiB, runtime=2),
                           TargetFacts(size_bytes=64 * MiB))
    return next(s for s in steps if s.threads == threads and s.phase == phase)


def test_sequential_threads_get_their_own_regions() -> None:
    opts = options(render(iozone(10, "write"), DISK))
    assert opts["filename"] == "/dev/sdx"
    assert (opts["rw"], opts["bs"], opts["numjobs"], opts["ioengine"]) == ("write", str(MiB), "10", "psync")
    assert opts["size"] == opts["offset_increment"] == str(4 * MiB)
    assert (opts["direct"], opts["end_fsync"], opts["group_reporting"]) == ("0", "1", "1")
    assert opts["runtime"] == "2000ms" and "time_based" not in opts  # iozone is size-bound
    assert options(render(iozone(1, "reread"), DISK))["invalidate"] == "0"


def test_a_sequential_step_without_size_shares_the_whole_target() -> None:
    step = presets.expand("stream-32k", "s", presets.Overrides(runtime=5), TargetFacts())[0]
    assert regions(step, DISK) == (8 * MiB, 8 * MiB)  # 8 readers x 8 MiB
    random = presets.expand("iometer-4k", "i", presets.Overrides(runtime=5), TargetFacts())[0]
    assert regions(random, DISK) == (64 * MiB, None)
    opts = options(render(random, DISK))
    assert (opts["norandommap"], opts["randrepeat"], opts["time_based"]) == ("1", "0", "1")
    assert opts["iodepth"] == "4" and opts["direct"] == "1"


def test_a_step_that_does_not_fit_says_so() -> None:
    with pytest.raises(JobError, match=r"10 job\(s\) x 16MiB need 160MiB, more than the target's 64MiB"):
        regions(iozone(10, "write").model_copy(update={"size": 16 * MiB}), DISK)


def test_file_names_are_escaped_for_fio() -> None:
    opts = options(render(iozone(1, "write"), FioTarget("/srv/a:b/x.dat", 64 * MiB, is_file=True)))
    assert opts["filename"] == "/srv/a\\:b/x.dat"
    assert opts["fallocate"] == "none"  # a fresh write allocates, as iozone's does


SPEC = """
apiVersion: stortune/v1
kind: BenchmarkSpec
metadata: {name: all}
spec:
  target: {device: {name: [sdx]}}
  allowDestructive: true
  workloads:
    - {preset: iozone-seq, size: 4M, runtime: 1s}
    - {preset: iometer-4k, runtime: 1s}
    - {preset: iometer-64k, runtime: 1s}
    - {preset: seq-64k, runtime: 1s}
    - {preset: seq-1m, runtime: 1s, rampTime: 500ms}
    - {preset: stream-32k}
    - {preset: oltp-8k, runtime: 1s}
    - {name: split, pattern: randrw, rwmixread: 30, blockSizeSplit: 4k/50:64k/50, iodepth: 16, runtime: 1s}
    - {name: buffered, pattern: rw, direct: false, numjobs: 2, size: 8M}
"""


@pytest.mark.skipif(shutil.which("fio") is None, reason="fio is not installed (Debian package fio)")
def test_fio_accepts_every_rendered_job(tmp_path: Path) -> None:
    steps = load_benchmark(SPEC).steps(TargetFacts(drives=3, size_bytes=64 * MiB))
    for step in steps:
        job = tmp_path / "job.fio"
        job.write_text(render(step, FioTarget(str(tmp_path / "never-created"), 64 * MiB, is_file=True)))
        proc = subprocess.run(["fio", "--parse-only", str(job)], capture_output=True, text=True,
                              timeout=30, check=False)
        assert proc.returncode == 0, f"{step.name}: {proc.stdout}{proc.stderr}"
    assert not (tmp_path / "never-created").exists()


def test_a_per_job_step_reports_each_job() -> None:
    step = presets.expand("stream-32k", "s", presets.Overrides(runtime=5), TargetFacts())[0]
    assert options(render(step, DISK))["group_reporting"] == "1"
    assert "group_reporting" not in options(render(step.model_copy(update={"per_job": True}), DISK))
