"""A real tuning experiment on a direct-I/O loop device: what it recommends, how sure it is,
how long it takes, and how it compares with TuneD's choice measured in the same run.

    sudo .venv/bin/python bench/tuning_real.py [--size 2GiB] [--runtime 10s] [--json]
                                               [--backing disk|shm ...] [--strategy one-at-a-time]

For each backing (a file on the disk under /var/tmp, and one in /dev/shm) it makes a
fresh loop device (direct I/O, the file's blocks really written, read-ahead 0 to
start), runs one TuningExperiment over read_ahead_kb x nr_requests x scheduler for 8
buffered 32K streams through ``stortune-agent tune``'s own code (``tune.LocalExperiment``),
and reports:

* the recommendation, its gain over the baseline with the 95% interval, significance;
* wall time, trials, and the orchestration overhead per trial (everything but fio's runs;
  target < 1 s);
* TuneD throughput-performance's read-ahead (4096 KiB, the others left as they were),
  a point the read_ahead_kb sweep measures in the same run: the recommendation must be at
  least as good within the noise (``bench.stats``' rule).

The device is removed afterwards; nothing else on the host is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.loopdev is not an installed package

from stortune.agent.kernelfs import KernelFS  # noqa: E402
from stortune.agent.tune import LocalExperiment, TuneResult  # noqa: E402
from stortune.schemas.bench.stats import delta, summarize  # noqa: E402
from stortune.schemas.sizes import parse_size  # noqa: E402
from stortune.schemas.tuning.experiment import parse_experiment  # noqa: E402
from stortune.schemas.tuning.space import describe, point_key  # noqa: E402
from tests.loopdev import fresh_loop  # noqa: E402

BACKINGS = {"disk": Path("/var/tmp"), "shm": Path("/dev/shm")}
TUNED_READ_AHEAD = 4096  # TuneD throughput-performance: [disk] readahead=>4096 (KiB)


def experiment(device: str, runtime: str, strategy: str) -> dict[str, Any]:
    return {
        "apiVersion": "stortune/v1", "kind": "TuningExperiment", "metadata": {"name": "bench-real"},
        "spec": {
            "target": {"device": {"kind": ["loop"], "name": [device]}},
            "workloads": [{"preset": "stream-32k", "runtime": runtime}],
            "objective": {"metric": "read_bandwidth", "goal": "maximize"},
            "parameters": [
                {"tunable": "read_ahead_kb", "values": [0, 128, 512, 1024, TUNED_READ_AHEAD, 16384]},
                {"tunable": "nr_requests", "values": [32, 128, 256]},
                {"tunable": "scheduler", "values": ["none", "mq-deadline"]},
            ],
            "strategy": strategy,
            "repeats": {"min": 2, "max": 4},
            "budget": {"trials": 60, "duration": "30m"},
        },
    }


def _prepare(device: str) -> dict[str, str]:
    """A known start: read-ahead 0, no scheduler, nr_requests 128 (a fresh loop queue's)."""
    queue = Path("/sys/block") / device / "queue"
    (queue / "scheduler").write_text("none")
    (queue / "nr_requests").write_text("128")
    (queue / "read_ahead_kb").write_text("0")
    return {a: (queue / a).read_text().strip() for a in ("scheduler", "nr_requests", "read_ahead_kb")}


def tuned_reference(result: TuneResult) -> dict[str, Any]:
    """TuneD's point (read-ahead 4096, the rest as found) against the recommendation."""
    tuned = {**result.current, "read_ahead_kb": TUNED_READ_AHEAD}
    by_point = {point_key(t.point): t for t in result.outcome.trials}
    ref = by_point.get(point_key(tuned))
    best = by_point.get(point_key(result.recommendation.values))
    out: dict[str, Any] = {"point": describe(tuned), "measured": ref is not None and ref.n > 0}
    if ref is None or best is None or not ref.values or not best.values:
        return out
    d = delta("stream", "read_bandwidth", summarize(ref.values), summarize(best.values))
    out.update(mean_MBps=round((ref.mean or 0) / 1e6, 1), runs=ref.n,
               recommendation_vs_tuned_pct=None if d.delta_pct is None else round(d.delta_pct, 1),
               noise=d.noise_text(), verdict=d.verdict,
               at_least_as_good=d.verdict != "worse")
    return out


def run_one(backing: str, size: int, runtime: str, strategy: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=BACKINGS[backing], prefix="stortune-tune-") as tmp, \
            fresh_loop(Path(tmp), size, direct_io=True, fill=True) as device:
        dio = (Path("/sys/block") / device / "loop" / "dio").read_text().strip() == "1"
        start = _prepare(device)
        exp = parse_experiment(experiment(device, runtime, strategy))
        began = time.monotonic()
        local = LocalExperiment(KernelFS.at("/sys", "/proc"), Path(tmp) / "state", exp)
        result = local.run()
        wall = time.monotonic() - began
        queue = Path("/sys/block") / device / "queue"
        back = {a: (queue / a).read_text().strip() for a in start}
    rec = result.recommendation
    trials = result.trials
    return {
        "backing": backing, "file_bytes": size, "direct_io": dio, "strategy": strategy,
        "finished": result.finished, "trials": len(trials), "wall_s": round(wall, 1),
        "fio_s": round(sum(t.fio_s for t in trials), 1),
        "overhead_per_trial_s": {"mean": result.overhead_s,
                                 "max": max((t.overhead_s for t in trials), default=None)},
        "baseline": describe(result.current),
        "baseline_reliable": result.outcome.baseline.reliable,
        "recommendation": describe(rec.values), "keep_current": rec.keepCurrent,
        "significant": rec.significant,
        "gain_pct": None if rec.gain is None else {"pct": round(rec.gain.pct, 1),
                                                   "low": round(rec.gain.low, 1),
                                                   "high": round(rec.gain.high, 1)},
        "effects_pct": {k: None if v is None else round(v, 1) for k, v in result.outcome.effects.items()},
        "tuned_throughput_performance": tuned_reference(result),
        "device_back_at_start": back == start,
    }


def print_report(r: dict[str, Any]) -> None:
    gain = r["gain_pct"]
    tuned = r["tuned_throughput_performance"]
    print(f"== {r['backing']}: {r['file_bytes'] >> 20} MiB, direct I/O {r['direct_io']}, {r['strategy']}")
    print(f"  baseline           {r['baseline']} (reliable: {r['baseline_reliable']})")
    print(f"  recommendation     {r['recommendation']}"
          + (" (keep current)" if r["keep_current"] else "")
          + ("" if gain is None
             else f"  gain {gain['pct']:+.1f}% [{gain['low']:+.1f}%, {gain['high']:+.1f}%]")
          + f"  significant: {r['significant']}")
    print(f"  effects            {r['effects_pct']}")
    print(f"  TuneD 4096         {tuned}")
    print(f"  wall               {r['wall_s']} s for {r['trials']} trials ({r['fio_s']} s in fio);"
          f" overhead per trial {r['overhead_per_trial_s']} s (target < 1 s)")
    print(f"  device back at its start values: {r['device_back_at_start']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size", default="2GiB", help="backing file size (default 2GiB)")
    parser.add_argument("--runtime", default="10s", help="cap per fio run (default 10s)")
    parser.add_argument("--backing", action="append", choices=sorted(BACKINGS),
                        help="where the backing file lives (default: both)")
    parser.add_argument("--strategy", default="one-at-a-time", choices=("one-at-a-time", "grid", "bayesian"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("error: loop devices need root", file=sys.stderr)
        return 1
    size = parse_size(args.size)
    size -= size % (4 << 20)
    reports = [run_one(b, size, args.runtime, args.strategy) for b in args.backing or ("disk", "shm")]
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    for r in reports:
        print_report(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
