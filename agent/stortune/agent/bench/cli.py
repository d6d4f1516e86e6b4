"""``stortune-agent bench``: run a BenchmarkSpec (or one preset) on this host, print the results.

    stortune-agent bench -f SPEC.yaml [--state-dir DIR] [-o table|json] [--baseline RESULT.json]
    stortune-agent bench --preset stream-32k --target loop3 [--runtime 10s] [--size 64M]
    stortune-agent bench --preset seq-1m --target /srv/bench/x.dat --bench-dir /srv/bench
    stortune-agent bench -f SPEC.yaml --dry-run     # every check the run makes; nothing runs

The run goes through the same ``BenchmarkManager`` as the control plane's, so
it takes the host's bench lock (no apply meanwhile) and is stored under
``<state-dir>/bench/<run id>``; a file target must be in ``<state-dir>/bench-files`` or a
``--bench-dir``. A progress line is shown on a terminal; Ctrl-C
cancels (fio is stopped, what ran is kept). Exit: 0 done (thresholds met),
2 thresholds not met, 1 failed or cancelled.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from stortune.agent import render
from stortune.agent.bench.args import protection_of
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.agent.local import AgentError
from stortune.schemas.analysis import verdict as bottleneck_verdict
from stortune.schemas.bench import metrics, units
from stortune.schemas.bench.results import BenchmarkResult, RunProgress
from stortune.schemas.bench.spec import BenchmarkSpec, load_benchmark, parse_benchmark
from stortune.schemas.bench.stats import compare

EXIT_OK, EXIT_ERROR, EXIT_THRESHOLDS = 0, 1, 2
#: Metrics shown per step in the results table (when the step measured them).
_SHOWN = ("read_bandwidth", "write_bandwidth", "read_iops", "write_iops", "read_lat_p99",
          "write_lat_p99")


def preset_spec(args: argparse.Namespace) -> BenchmarkSpec:
    if not args.target:
        raise AgentError("--preset needs --target DEV|FILE")
    workload: dict[str, Any] = {"preset": args.preset}
    for key in ("size", "runtime"):
        if getattr(args, key):
            workload[key] = getattr(args, key)
    target = args.target
    if target.startswith("/") and not target.startswith("/dev/"):
        where: dict[str, Any] = {"file": {"path": target, "size": args.file_size}}
    else:
        where = {"device": {"name": [target.removeprefix("/dev/")]}}
    return parse_benchmark({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec",
        "metadata": {"name": args.preset},
        "spec": {"target": where, "allowDestructive": args.allow_destructive,
                 "repeats": args.repeats, "workloads": [workload]},
    }, "--preset")


def _progress_line(out: TextIO) -> Callable[[RunProgress], None]:
    def show(p: RunProgress) -> None:
        if p.finished:
            out.write("\r\033[K")
            out.flush()
            return
        rates = (f"r {units.human_bytes_per_s(p.read_bytes_per_s)} {units.human_count(p.read_iops)} IOPS"
                 f"  w {units.human_bytes_per_s(p.write_bytes_per_s)} {units.human_count(p.write_iops)} IOPS")
        out.write(f"\r\033[K[{p.percent:5.1f}%] {p.step_index}/{p.step_count} {p.step or ''}"
                  f"  {rates}  eta {p.eta_seconds}s")
        out.flush()

    return show


def run(args: argparse.Namespace, fs: KernelFS) -> int:
    fs = KernelFS(fs.sysfs, fs.procfs, Path(args.dev))
    if args.file:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text(encoding="utf-8")
        spec = load_benchmark(text, "<stdin>" if args.file == "-" else args.file)
    else:
        spec = preset_spec(args)
    baseline = _load_result(args.baseline) if args.baseline else None
    tty = sys.stderr.isatty()
    manager = BenchmarkManager(fs, Path(args.state_dir),
                               on_progress=_progress_line(sys.stderr) if tty else None,
                               bench_dirs=args.bench_dir, protection=protection_of(args))
    if args.dry_run:
        return _dry_run(manager, spec, args.output)
    run_id = manager.start(spec, args.run_id)
    try:
        manager.wait(run_id)
    except KeyboardInterrupt:
        manager.cancel(run_id)
        manager.wait(run_id)
    result = manager.result(run_id)
    if result is None:
        raise AgentError(f"benchmark {run_id} left no result in {manager.store.dir(run_id)}")
    if args.output == "json":
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        print_result(result, baseline)
        print(f"stored in {manager.store.dir(run_id)}", file=sys.stderr)
    if result.state != "done":
        print(f"error: benchmark {result.state}: {result.message}", file=sys.stderr)
        return EXIT_ERROR
    if result.verdict is not None and not result.verdict.passed:
        return EXIT_THRESHOLDS
    return EXIT_OK


def _dry_run(manager: BenchmarkManager, spec: BenchmarkSpec, output: str) -> int:
    """Every refusal the run would make (they raise: exit 1), then the steps it would run."""
    target, steps = manager.check(spec)
    if output == "json":
        sys.stdout.write(json.dumps({"target": target.info.model_dump(mode="json"),
                                     "steps": [s.model_dump(mode="json") for s in steps]}, indent=2) + "\n")
        return EXIT_OK
    render.table(f"dry run: {spec.name} on {target.info.path} (nothing runs)",
                 ["step", "pattern", "block size", "iodepth", "jobs", "runtime", "writes"],
                 [[s.name, s.pattern, s.block_size or "-", s.iodepth, s.numjobs,
                   "-" if s.runtime is None else f"{s.runtime:g}s", "yes" if s.writes else ""]
                  for s in steps])
    return EXIT_OK


def _load_result(path: str) -> BenchmarkResult:
    try:
        return BenchmarkResult.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise AgentError(f"--baseline {path}: not a benchmark result ({exc})") from None


def _cell(metric: str, summary: Any) -> str:
    text = metrics.get(metric).human(summary.mean)
    if summary.n > 1:
        text += f" ±{100 * (summary.cv or 0):.0f}%" + (" noisy" if summary.noisy else "")
    return text


def print_result(result: BenchmarkResult, baseline: BenchmarkResult | None = None,
                 out: TextIO = sys.stdout) -> None:
    title = f"benchmark {result.name} ({result.run_id}): {result.state}"
    if result.context is not None:
        t = result.context.target
        title += f" on {t.path} ({t.facts.drives} drive(s))"
    rows = []
    for s in result.summaries:
        rows.append([s.step, s.runs, *(_cell(m, s.metrics[m]) if m in s.metrics else "-" for m in _SHOWN)])
    render.table(title, ["step", "runs", "read", "write", "read IOPS", "write IOPS", "read p99",
                         "write p99"], rows, out)
    for table in result.iozone:
        render.table(f"iozone {table.workload}: throughput by threads", ["threads", *table.phases],
                     [[r.threads, *(units.human_bytes_per_s(r.bandwidth[p]) if p in r.bandwidth else "-"
                                    for p in table.phases)] for r in table.rows], out)
    devices = []
    for run in result.runs:
        for d in run.devices:
            devices.append([f"{run.step} r{run.repeat + 1}", d.device, d.relation,
                            "-" if d.util_percent is None else f"{d.util_percent:.0f}%",
                            f"{d.read_iops + d.write_iops:.0f}",
                            units.human_bytes_per_s(d.read_bytes_per_s + d.write_bytes_per_s),
                            "-" if d.await_ms is None else f"{d.await_ms:.2f}",
                            "slowest" if d.slowest else ""])
    if devices:
        render.table("devices (from /proc/diskstats)", ["step", "device", "relation", "util", "IOPS",
                                                        "throughput", "await ms", ""], devices, out)
    verdict_lines = bottleneck_verdict.lines(result.bottlenecks, result.slow_members, result.balance)
    if verdict_lines:
        print("where the limit is:", file=out)
        for text, _ in verdict_lines:
            print(f"  {text}", file=out)
    if result.verdict is not None:
        render.table("thresholds", ["", "check"],
                     [["pass" if o.passed else "FAIL", o.message] for o in result.verdict.outcomes], out)
    if baseline is not None:
        deltas = [d for d in compare(baseline.summaries_by_step(), result.summaries_by_step())
                  if d.metric in _SHOWN or d.metric.endswith("_lat_mean")]
        render.table(f"against {baseline.run_id}", ["step", "metric", "baseline", "now", "delta",
                                                    "noise", "verdict"],
                     [[d.step, d.metric, metrics.get(d.metric).human(d.a.mean),
                       metrics.get(d.metric).human(d.b.mean),
                       "-" if d.delta_pct is None else f"{d.delta_pct:+.1f}%",
                       d.noise_text(), d.verdict]
                      for d in deltas], out)
    if result.context is not None:
        for warning in result.context.warnings:
            print(f"warning: {warning}", file=out)
