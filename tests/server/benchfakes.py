"""Benchmark documents, results and a scripted agent for the control-plane tests.

``BenchAgent`` is the FakeAgentClient (the one seam the server's tests fake)
with benchmark runs that end when the test says: at once (``auto``), or on
``finish(run_id)``. Results are real ``BenchmarkResult`` objects built from the
spec's own steps, with metrics the test chooses, concluded by the schemas code
(summaries over repeats, iozone tables, verdict), so the server stores and
compares what an agent would send.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fastapi import FastAPI

from stortune.schemas.bench.results import BenchmarkResult, RunContext, StepRun, TargetInfo
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.schemas.bench.steps import TargetFacts, WorkloadStep
from stortune.server.agentclient import BenchmarkOutcome, BenchmarkProgress, FakeAgentClient
from stortune.server.services import benchmarks

Values = Callable[[WorkloadStep, int], dict[str, float]]
FACTS = TargetFacts(kind="device", drives=1, rotational=False, size_bytes=256 << 20)


def spec_doc(name: str = "seq", *, workloads: list[dict[str, Any]] | None = None, repeats: int = 1,
             selector: dict[str, Any] | None = None, thresholds: list[dict[str, Any]] | None = None,
             target: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "target": target or {"device": {"kind": ["loop"], "name": ["loop0"]}},
        "allowDestructive": True, "repeats": repeats,
        "workloads": workloads or [{"preset": "seq-1m", "runtime": "1s"}],
    }
    if selector is not None:
        body["hostSelector"] = selector
    if thresholds:
        body["thresholds"] = thresholds
    return {"apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": name}, "spec": body}


def streamers(name: str = "seq", **kwargs: Any) -> dict[str, Any]:
    """A spec for every host labelled role=streamer."""
    return spec_doc(name, selector={"matchLabels": {"role": "streamer"}}, **kwargs)


def steady(scale: float = 1.0, spread: float = 0.01) -> Values:
    """Bandwidth, IOPS, latency percentiles and CPU for a step, ``scale`` times a base, each repeat a
    little different (``spread``) so repeats have a standard deviation."""

    def values(step: WorkloadStep, repeat: int) -> dict[str, float]:
        wobble = 1 + spread * (repeat - 1)
        bandwidth = 400e6 * scale * wobble
        iops = bandwidth / (step.block_size or 4096)
        out = {"cpu_usr": 3.0, "cpu_sys": 9.0}
        directions = ["read"] if step.pattern in ("read", "randread") else (
            ["write"] if step.pattern in ("write", "randwrite") else ["read", "write"])
        for d in directions:
            share = 1.0 if len(directions) == 1 else 0.5
            out[f"{d}_bandwidth"] = bandwidth * share
            out[f"{d}_iops"] = iops * share
            out[f"{d}_lat_mean"] = 800.0 / scale * wobble
            for key, factor in (("p50", 0.9), ("p95", 1.6), ("p99", 2.5), ("p999", 6.0)):
                out[f"{d}_lat_{key}"] = 800.0 * factor / scale * wobble
        out["total_bandwidth"] = sum(out.get(f"{d}_bandwidth", 0.0) for d in ("read", "write"))
        out["total_iops"] = sum(out.get(f"{d}_iops", 0.0) for d in ("read", "write"))
        return out

    return values


def make_result(run_id: str, spec: BenchmarkSpec, values: Values, *, state: str = "done",
                hostname: str = "h1", settings: Mapping[str, Mapping[str, int | str | None]] | None = None,
                profiles: Mapping[str, int] | None = None, stop_after: int | None = None) -> BenchmarkResult:
    """What an agent's run of ``spec`` stores; ``stop_after`` step runs (a cancelled run keeps those)."""
    steps = spec.steps(FACTS)
    runs = []
    order = [(r, i, s) for r in range(max(s.repeats for s in steps)) for i, s in enumerate(steps)
             if r < s.repeats]
    for n, (repeat, index, step) in enumerate(order):
        if stop_after is not None and n >= stop_after:
            break
        where = f"steps/{index:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', step.name)}-r{repeat}"
        runs.append(StepRun(step=step.name, repeat=repeat, state="done", started_at=1000.0 + n,
                            finished_at=1001.0 + n, metrics=values(step, repeat),
                            files={"job": f"{where}/job.fio", "output": f"{where}/fio.json",
                                   "stderr": f"{where}/stderr.txt"}))
    context = RunContext(
        hostname=hostname, kernel="6.1.0-test", boot_id="boot-1", agent_version="0.1.0",
        fio_version="fio-3.33", topology_hash="topo-1",
        target=TargetInfo(kind="device", path="/dev/loop0", device="loop0", device_id="name:loop0",
                          size_bytes=256 << 20, facts=FACTS),
        settings={k: dict(v) for k, v in (settings or {"loop0": {"read_ahead_kb": 128,
                                                                   "scheduler": "none"}}).items()},
        profiles=dict(profiles if profiles is not None else {"streaming": 1}))
    result = BenchmarkResult(run_id=run_id, name=spec.name, state=state,  # type: ignore[arg-type]
                             message="" if state == "done" else state, spec=spec.document(),
                             created_at=1000.0, started_at=1000.0, finished_at=1100.0, context=context,
                             steps=steps, runs=runs)
    return result.concluded(spec.spec.thresholds)


def raw_files(result: BenchmarkResult) -> dict[str, str]:
    out = {}
    for run in result.runs:
        out[run.files["job"]] = f"[{run.step}]\nrw=read\n"
        out[run.files["output"]] = '{"fio version": "fio-3.33", "jobs": []}'
        out[run.files["stderr"]] = ""
    return out


@dataclass
class BenchAgent(FakeAgentClient):
    """A FakeAgentClient whose benchmark runs end when the test says (``auto``: at once)."""

    auto: bool = True
    # With ``auto``: a run stays 'running' this long before it ends, so a follower polling the
    # control plane (the CLI's live view) sees each run in flight even on a loaded machine.
    running_s: float = 0.0
    values: Values = field(default_factory=steady)
    settings: dict[str, dict[str, int | str | None]] | None = None

    def finish(self, run_id: str, state: str = "done", *, values: Values | None = None,
               stop_after: int | None = None) -> BenchmarkResult:
        spec = self.started[run_id]
        result = make_result(run_id, spec, values or self.values, state=state, hostname=self.info.hostname,
                             settings=self.settings, stop_after=stop_after)
        progress = BenchmarkProgress(run_id=run_id, state=state, percent=100.0 if state == "done" else 40.0,
                                     message=state)
        self.outcomes[run_id] = BenchmarkOutcome(progress=progress, result=result,
                                                 raw_files=raw_files(result), info=self.info)
        self.benchmarks.setdefault(run_id, []).append(progress)
        return result

    def running(self, run_id: str, percent: float = 50.0, step: str = "seq-1m/read") -> None:
        self.benchmarks.setdefault(run_id, []).append(BenchmarkProgress(
            run_id=run_id, state="running", percent=percent, read_bytes_per_s=400e6, read_iops=400.0,
            eta_seconds=3, message=f"step 1/2 {step}"))

    async def start_benchmark(self, run_id: str, spec: BenchmarkSpec) -> BenchmarkProgress:
        progress = await super().start_benchmark(run_id, spec)
        if self.auto and run_id not in self.outcomes:
            if self.running_s > 0:
                asyncio.get_running_loop().call_later(self.running_s, self._finish_open, run_id)
            else:
                self.finish(run_id)
        return progress

    def _finish_open(self, run_id: str) -> None:
        if run_id not in self.outcomes:
            self.finish(run_id)

    async def cancel_benchmark(self, run_id: str) -> tuple[bool, BenchmarkProgress]:
        cancelled, progress = await super().cancel_benchmark(run_id)
        if cancelled:
            self.finish(run_id, "cancelled", stop_after=1)
        return cancelled, progress


def finished_run(app: FastAPI, host: str, doc: dict[str, Any], *, values: Values | None = None,
                 settings: Mapping[str, Mapping[str, int | str | None]] | None = None,
                 now: datetime | None = None) -> str:
    """A run stored as if its agent had run it (straight through the services, no dispatcher)."""
    spec = parse_benchmark(doc)
    with app.state.sessions() as session:
        (row,) = benchmarks.create_runs(session, spec, [host], requested_by="tests",
                                        now=now or app.state.clock())
        result = make_result(row.id, spec, values or steady(), hostname=host, settings=settings)
        outcome = BenchmarkOutcome(
            progress=BenchmarkProgress(run_id=row.id, state="done", percent=100.0), result=result,
            raw_files=raw_files(result), info=FakeAgentClient().info)
        assert benchmarks.conclude(session, row.id, outcome, now or app.state.clock())
        return row.id


def queued_run(app: FastAPI, host: str, doc: dict[str, Any]) -> str:
    spec = parse_benchmark(doc)
    with app.state.sessions() as session:
        (row,) = benchmarks.create_runs(session, spec, [host], requested_by="tests", now=app.state.clock())
        return row.id
