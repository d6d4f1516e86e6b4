"""Fidelity: does a benchmark run through stortune measure what fio measures on its own?

    sudo .venv/bin/python bench/fio_fidelity.py [--pairs 5] [--runtime 10] [--size-mib 512]

One scratch loop device (its backing file in /dev/shm: steady, memory-speed), one
`stortune-agent serve` on 127.0.0.1 with mutual TLS, driven over gRPC exactly as the control plane
drives it (StartBenchmark, WatchBenchmark, GetBenchmarkResult, ForgetBenchmark). Each pair runs
the same job twice: through stortune (the agent renders the job, runs fio, samples
/proc/diskstats every second and streams progress) and directly with fio, on the job file
stortune itself ran, parsed by the same parser. The order alternates from pair to pair, so a
drift of the machine does not favour one side. Printed: each pair's bandwidths and their ratio,
then the ratio's mean, minimum and maximum. Target: stortune within 3 % of plain fio.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loopagent import ServingAgent, require_root_and_fio, scratch_loop, serving_agent

from stortune.schemas.bench import fioresult
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark

TARGET = 0.03


def spec(device: str, runtime: float) -> BenchmarkSpec:
    return parse_benchmark({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "fidelity"},
        "spec": {"target": {"device": {"kind": ["loop"], "name": [device]}},
                 "workloads": [{"name": "seqread", "pattern": "read", "blockSize": "1M", "iodepth": 4,
                                "runtime": runtime, "direct": True}]},
    })


async def through_stortune(agent: ServingAgent, s: BenchmarkSpec) -> tuple[float, str]:
    """(read bandwidth in bytes/s, the job file fio ran) of one run through the agent."""
    clients, client = agent.client()
    try:
        run_id = f"fidelity-{uuid.uuid4().hex[:8]}"
        await client.start_benchmark(run_id, s)
        async for progress in client.watch_benchmark(run_id):
            if progress.finished:
                break
        outcome = await client.get_benchmark_result(run_id)
        await client.forget_benchmark(run_id)
    finally:
        await clients.close()
    result = outcome.result
    if result is None or result.state != "done":
        raise SystemExit(f"the stortune run did not finish: {outcome.progress.state} "
                         f"{outcome.progress.message}")
    (step_run,) = result.runs
    job = next(text for path, text in outcome.raw_files.items() if path.endswith("job.fio"))
    return step_run.metrics["read_bandwidth"], job


def directly(job: str, device: str, workdir: Path) -> float:
    """Read bandwidth of plain fio on the same job file (page cache of the device dropped first,
    as the agent does before a step)."""
    job_file = workdir / "direct.fio"
    job_file.write_text(job)
    output = workdir / "direct.json"
    subprocess.run(["blockdev", "--flushbufs", f"/dev/{device}"], check=True, timeout=60)
    subprocess.run(["fio", "--output-format=json", f"--output={output}", str(job_file)], check=True,
                   capture_output=True, timeout=600)
    return fioresult.parse(output.read_text()).metrics()["read_bandwidth"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--runtime", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--size-mib", type=int, default=512, help="the scratch device's size")
    args = parser.parse_args()
    require_root_and_fio()
    with tempfile.TemporaryDirectory(prefix="stortune-fidelity-") as tmp, \
            scratch_loop(args.size_mib << 20) as device, serving_agent(Path(tmp)) as agent:
        s = spec(device, args.runtime)
        # A warm-up pair, not counted: the first run pays for page-cache fills and imports.
        _, job = asyncio.run(through_stortune(agent, s))
        directly(job, device, Path(tmp))
        ratios = []
        print(f"{args.pairs} pairs of 1M sequential direct reads, {args.runtime:g} s each, on /dev/{device}")
        print(f"{'pair':>4}  {'order':<16}  {'stortune MB/s':>13}  {'fio MB/s':>9}  {'ratio':>6}")
        for pair in range(1, args.pairs + 1):
            if pair % 2:
                ours, job = asyncio.run(through_stortune(agent, s))
                plain = directly(job, device, Path(tmp))
                order = "stortune, fio"
            else:
                plain = directly(job, device, Path(tmp))
                ours, job = asyncio.run(through_stortune(agent, s))
                order = "fio, stortune"
            ratio = ours / plain
            ratios.append(ratio)
            print(f"{pair:>4}  {order:<16}  {ours / 1e6:>13.1f}  {plain / 1e6:>9.1f}  {ratio:>6.3f}")
        mean = statistics.fmean(ratios)
        spread = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
        verdict = "ok" if abs(mean - 1) <= TARGET else "OVER"
        print(f"bandwidth ratio stortune/fio: mean {mean:.3f} (±{spread:.3f} stdev), min {min(ratios):.3f}, "
              f"max {max(ratios):.3f}; target within {TARGET:.0%} [{verdict}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
