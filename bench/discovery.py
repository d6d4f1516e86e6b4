"""How long discovery takes, and how much memory, on a large SAN host and on this machine.

    .venv/bin/python bench/discovery.py [--luns 500] [--runs 5] [--check]

Builds the ``large_san`` fixture (LUNs x 2 FC paths + one multipath dm per LUN)
in a temp dir, on tmpfs when /dev/shm is there because sysfs lives in memory
too, then times ``discover()``:

* cold: one fresh process per run, as a one-shot CLI call pays it (the figure
  includes first-call costs, not the imports); its peak RSS comes from
  getrusage(RUSAGE_CHILDREN) and the child's own before/after readings;
* warm: repeated calls in one process, as the agent daemon pays it.

Then the same for this machine's /sys and /proc (read-only). ``--check``
exits 1 when the best cold run on the fixture misses the target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.0

# Runs in a fresh interpreter: imports first (not timed), then one timed discover().
# Peak RSS comes from VmHWM, which belongs to the new process image alone; the
# rusage maximum also carries the parent's high-water mark over fork and exec.
CHILD = """
import json, sys, time
from stortune.agent.discovery import discover
from stortune.agent.kernelfs import KernelFS

def hwm_kib():
    with open("/proc/self/status") as fh:
        return next(int(ln.split()[1]) for ln in fh if ln.startswith("VmHWM:"))

fs = KernelFS.at(sys.argv[1], sys.argv[2])
before = hwm_kib()
t = time.perf_counter()
topo = discover(fs)
wall = time.perf_counter() - t
print(json.dumps({"wall": wall, "devices": len(topo.devices), "warnings": len(topo.warnings),
                  "rss_before_kib": before, "rss_after_kib": hwm_kib()}))
"""


def cold_runs(sysfs: str, procfs: str, runs: int) -> tuple[list[dict[str, float]], int]:
    results = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, sysfs, procfs],
            check=True, capture_output=True, text=True, timeout=300,
        )
        results.append(json.loads(out.stdout))
    peak_children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return results, peak_children_kib


def warm_runs(sysfs: str, procfs: str, runs: int) -> list[float]:
    from stortune.agent.discovery import discover
    from stortune.agent.kernelfs import KernelFS

    fs = KernelFS.at(sysfs, procfs)
    discover(fs)  # first call: pydantic and regex warm-up, page cache
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        discover(fs)
        walls.append(time.perf_counter() - t)
    return walls


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f} MiB"


def summary(walls: list[float]) -> str:
    listed = " ".join(f"{w:.3f}" for w in walls)
    return (f"best {min(walls):.3f} s  mean {statistics.mean(walls):.3f} s"
            f"  (runs: {listed})")


def report_cold(sysfs: str, procfs: str, runs: int) -> float:
    cold, peak_children = cold_runs(sysfs, procfs, runs)
    walls = [r["wall"] for r in cold]
    rss_before = max(r["rss_before_kib"] for r in cold)
    rss_after = max(r["rss_after_kib"] for r in cold)
    print(f"  devices discovered: {cold[0]['devices']}   warnings: {cold[0]['warnings']}")
    print(f"  cold  (fresh process per run): {summary(walls)}")
    print(f"  peak RSS of a run (VmHWM): {mib(rss_after)}   (after imports, before discover:"
          f" {mib(rss_before)}; discovery adds {mib(rss_after - rss_before)})")
    print(f"  peak RSS over children so far (RUSAGE_CHILDREN ru_maxrss): {mib(peak_children)}")
    return min(walls)


def report_warm(sysfs: str, procfs: str, runs: int) -> None:
    print(f"  warm  (same process)         : {summary(warm_runs(sysfs, procfs, runs))}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--luns", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="exit 1 if over the target")
    args = parser.parse_args()

    sys.path.insert(0, str(ROOT))  # tests.fixtures is not an installed package
    from tests.fixtures.scenarios import large_san

    print(f"stortune discovery benchmark: {platform.python_implementation()}"
          f" {platform.python_version()}, {os.cpu_count()} CPUs, kernel {platform.release()}")
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    tmp = Path(tempfile.mkdtemp(prefix="stortune-bench-", dir=shm))
    host = os.path.isdir("/sys/class/block")
    try:
        t = time.perf_counter()
        fs = large_san(tmp, luns=args.luns)
        built = time.perf_counter() - t
        sysfs, procfs = str(fs.sysfs), str(fs.procfs)
        # every cold run before any warm one: the children must not start from a parent
        # that has already grown by discovering 1,500 devices
        print(f"\nfixture large_san: {args.luns} LUNs x 2 FC paths + {args.luns} multipath dm"
              f" = {3 * args.luns} block devices, built in {built:.1f} s under {tmp}"
              f" ({'tmpfs' if shm else 'default temp dir'})")
        best = report_cold(sysfs, procfs, args.runs)
        if host:
            print("\nthis machine (/sys, /proc), read-only:")
            report_cold("/sys", "/proc", args.runs)
        print(f"\nfixture large_san, {3 * args.luns} devices:")
        report_warm(sysfs, procfs, args.runs)
        verdict = "PASS" if best < TARGET_S else "MISS"
        print(f"  target: best cold run < {TARGET_S:.1f} s -> {verdict} ({best:.3f} s)")
        if host:
            print("\nthis machine:")
            report_warm("/sys", "/proc", args.runs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if args.check and verdict != "PASS" else 0


if __name__ == "__main__":
    sys.exit(main())
