"""Agent overhead while a benchmark runs: CPU of the `stortune-agent serve` process.

    sudo .venv/bin/python bench/bench_overhead.py [--runtime 30]

One scratch loop device (backing file in /dev/shm), one `stortune-agent serve` on 127.0.0.1 with
mutual TLS. A benchmark is started and watched over gRPC as the control plane does it
(StartBenchmark, then WatchBenchmark streaming progress); the agent meanwhile reads fio's live
status every second and samples /proc/diskstats for the target every second. The agent's CPU is
read from /proc/PID/stat (utime + stime of its own threads; fio is a child and not counted) over
the middle of the run, away from start-up and the end, and printed as % of one core, next to the
same agent idle for comparison. Target: under 2 % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loopagent import ServingAgent, cpu_seconds, require_root_and_fio, scratch_loop, serving_agent

from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark

TARGET_PCT = 2.0


def spec(device: str, runtime: float) -> BenchmarkSpec:
    return parse_benchmark({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "overhead"},
        "spec": {"target": {"device": {"kind": ["loop"], "name": [device]}},
                 "workloads": [{"name": "randread", "pattern": "randread", "blockSize": "4k", "iodepth": 16,
                                "runtime": runtime}]},
    })


def idle_pct(agent: ServingAgent, seconds: float) -> float:
    before, t0 = cpu_seconds(agent.proc.pid), time.monotonic()
    time.sleep(seconds)
    return 100 * (cpu_seconds(agent.proc.pid) - before) / (time.monotonic() - t0)


async def during_run(agent: ServingAgent, s: BenchmarkSpec,
                     runtime: float) -> tuple[float, float, int, float]:
    """(agent CPU % of one core over the measured window, window seconds, progress updates, mean IOPS)."""
    clients, client = agent.client()
    run_id = f"overhead-{uuid.uuid4().hex[:8]}"
    pid = agent.proc.pid
    updates = 0
    iops: list[float] = []
    window: dict[str, float] = {}
    try:
        await client.start_benchmark(run_id, s)
        started = time.monotonic()
        async for progress in client.watch_benchmark(run_id):
            updates += 1
            now = time.monotonic()
            if progress.state == "running" and progress.read_iops:
                iops.append(progress.read_iops)
            # Measure from 3 s into the run until 3 s before its planned end.
            if "t0" not in window and now - started >= 3:
                window["t0"], window["cpu0"] = now, cpu_seconds(pid)
            if "t0" in window and "t1" not in window and now - started >= runtime - 3:
                window["t1"], window["cpu1"] = now, cpu_seconds(pid)
            if progress.finished:
                break
        outcome = await client.get_benchmark_result(run_id)
        await client.forget_benchmark(run_id)
    finally:
        await clients.close()
    if outcome.result is None or outcome.result.state != "done":
        raise SystemExit(f"the run did not finish: {outcome.progress.state} {outcome.progress.message}")
    if "t1" not in window:
        raise SystemExit("the run was too short to measure; give a longer --runtime")
    span = window["t1"] - window["t0"]
    pct = 100 * (window["cpu1"] - window["cpu0"]) / span
    return pct, span, updates, sum(iops) / len(iops) if iops else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runtime", type=float, default=30.0, help="seconds of the benchmark")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    require_root_and_fio()
    with tempfile.TemporaryDirectory(prefix="stortune-overhead-") as tmp, \
            scratch_loop(256 << 20) as device, serving_agent(Path(tmp)) as agent:
        time.sleep(3)  # past start-up
        idle = idle_pct(agent, 10)
        print(f"stortune-agent serve (pid {agent.proc.pid}) idle: {idle:.2f} % of one core")
        figures = []
        for n in range(1, args.runs + 1):
            s = spec(device, args.runtime)
            pct, span, updates, iops = asyncio.run(during_run(agent, s, args.runtime))
            figures.append(pct)
            print(f"run {n}: 4k random reads at {iops:,.0f} IOPS on /dev/{device}, {updates} progress "
                  f"updates streamed; agent CPU {pct:.2f} % of one core over {span:.1f} s")
        worst = max(figures)
        print(f"agent CPU while benchmarking (fio status, diskstats sampling every 1 s, progress over gRPC): "
              f"mean {sum(figures) / len(figures):.2f} %, max {worst:.2f} % of one core; "
              f"target < {TARGET_PCT:g} % "
              f"[{'ok' if worst < TARGET_PCT else 'OVER'}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
