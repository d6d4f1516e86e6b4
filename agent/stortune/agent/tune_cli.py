"""``stortune-agent tune -f EXP.yaml [--device NAME] [--dry-run] [-o table|json] [--profile-out FILE]``.

Runs one TuningExperiment on this host (``tune.LocalExperiment``) with a live progress
line on stderr: trial k of n, the values under test, the metric so far, the leader and
its margin (one line per trial when stderr is not a terminal). SIGINT (Ctrl-C) and
SIGTERM stop fio and put the settings back before the command exits; so does
spec.budget.duration, the deadline. Exit: 0 when the experiment ran to its end or its budget
(the search stopped in time for its closing runs), 1 on an error, a bad input (nothing runs),
an interruption or the deadline.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TextIO

from stortune.agent import render
from stortune.agent.bench import args as bench_args
from stortune.agent.kernelfs import KernelFS
from stortune.agent.tune import (
    DryRun,
    Event,
    LocalExperiment,
    TuneError,
    TuneResult,
    describe_point,
    dry_run,
    read_experiment,
)
from stortune.schemas.bench import metrics, units
from stortune.schemas.tuning.timing import DEADLINE, hold_line, span

EXIT_OK, EXIT_ERROR = 0, 1
#: How an experiment may end and still count as run (the budget is the user's own limit).
_RAN = ("done", "budget-trials", "budget-duration")


@contextlib.contextmanager
def _stopping(stop: threading.Event) -> Iterator[list[int]]:
    """SIGINT and SIGTERM set ``stop`` (the experiment winds down and puts settings back)."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        caught.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


class ProgressLine:
    """The live line: rewritten in place on a terminal, one line per finished trial otherwise."""

    def __init__(self, metric: str, out: TextIO) -> None:
        self.metric = metrics.get(metric)
        self.out = out
        self.tty = out.isatty()

    def __call__(self, event: Event) -> None:
        r, p = event.request, event.progress
        total = max(r.total_estimate, p.done + 1)
        head = f"trial {r.index + 1} of ~{total} [{r.purpose}] {describe_point(r.point)}"
        if event.done is not None:
            m = event.done.measurement
            got = (self.metric.human(m.metrics[self.metric.name]) if m.ok and self.metric.name in m.metrics
                   else f"failed: {m.message}")
            line = f"{head}: {got}{self._leader(event)}"
            self.out.write(("\r\033[K" if self.tty else "") + line + "\n")
        elif self.tty:
            live = event.live
            rate = ""
            if live is not None:
                rate = f"  now r {units.human_bytes_per_s(live.read_bytes_per_s)}" \
                       f" w {units.human_bytes_per_s(live.write_bytes_per_s)}"
            self.out.write(f"\r\033[K{head}{rate}{self._leader(event)}")
        self.out.flush()

    def _leader(self, event: Event) -> str:
        p = event.progress
        if p.leader is None or p.leader_mean is None:
            return ""
        margin = "" if p.margin_pct is None else f", {p.margin_pct:+.1f}% over the runner-up"
        return f"  | leader {describe_point(p.leader)} {self.metric.human(p.leader_mean)}{margin}"


def run(args: argparse.Namespace, fs: KernelFS) -> int:
    exp = read_experiment(args.file)
    if args.dry_run:
        return _dry_run(dry_run(fs, Path(args.state_dir), exp, args.device, bench_args.protection_of(args)),
                        args.output)
    stop = threading.Event()
    with _stopping(stop) as caught:
        experiment = LocalExperiment(fs, Path(args.state_dir), exp, device=args.device,
                                     listener=ProgressLine(exp.spec.objective.metric, sys.stderr), stop=stop,
                                     ram_share=args.stripe_cache_ram_share,
                                     protection=bench_args.protection_of(args))
        if experiment.recovered:
            print(f"finished what an interruption left: {experiment.recovered}", file=sys.stderr)
        print(f"experiment {exp.name} ({experiment.id}) on {experiment.device.name}: current"
              f" {describe_point(experiment.current)}", file=sys.stderr)
        result = experiment.run()
    if args.profile_out:
        _write_profile(Path(args.profile_out), result)
    if args.output == "json":
        sys.stdout.write(result.model_dump_json(indent=2) + "\n")
    else:
        print_result(result)
    if caught:
        name = signal.Signals(caught[0]).name
        print(f"error: interrupted by {name} after {len(result.trials)} trial(s); {result.device} is back"
              " at its settings", file=sys.stderr)
        return EXIT_ERROR
    if result.finished == DEADLINE:
        print(f"error: the time budget ran out (spec.budget.duration {span(exp.spec.budget.duration)}) after"
              f" {len(result.trials)} trial(s): the trial running was stopped and not measured, nothing"
              f" confirmed; {result.device} is back at its settings", file=sys.stderr)
        return EXIT_ERROR
    if result.finished not in _RAN:
        print(f"error: the experiment ended early: {result.finished}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK


def _dry_run(plan: DryRun, output: str) -> int:
    if output == "json":
        sys.stdout.write(plan.model_dump_json(indent=2) + "\n")
        return EXIT_OK
    beneath = f" (beneath: {', '.join(plan.beneath)})" if plan.beneath else ""
    print(f"dry run: experiment {plan.experiment} on {plan.device}{beneath} (nothing runs)")
    print(f"  baseline (the values in effect now): {describe_point(plan.baseline)}")
    print(f"  about {plan.estimatedTrials} trial(s) (the search adapts to what it measures)")
    print("  " + hold_line(plan.trialSeconds, plan.estimatedSeconds, plan.durationSeconds))
    return EXIT_OK


def _write_profile(path: Path, result: TuneResult) -> None:
    import yaml

    rec = result.recommendation
    head = (f"# Recommended by experiment {result.experiment} ({result.id}) on {result.host}/{result.device}:"
            f"\n# {rec.reason}\n")
    try:
        path.write_text(head + yaml.safe_dump(result.profile, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        raise TuneError(f"--profile-out {path}: {exc.strerror or exc}") from None


def print_result(result: TuneResult, out: TextIO = sys.stdout) -> None:
    o = result.outcome
    metric = metrics.get(o.metric)
    render.table(
        f"experiment {result.experiment} ({result.id}) on {result.host}/{result.device}: {result.finished},"
        f" {len(result.trials)} trial(s) in {result.wall_s:.0f} s",
        ["values", "runs", o.metric, "95% interval", "purpose", "feasible"],
        [[describe_point(t.point), t.n if not t.failures else f"{t.n} (+{t.failures} failed)",
          "-" if t.mean is None else metric.human(t.mean),
          "-" if t.ci95_low is None or t.ci95_high is None
          else f"{metric.human(t.ci95_low)} .. {metric.human(t.ci95_high)}",
          ", ".join(t.purposes), "yes" if t.feasible else "no: " + "; ".join(t.violations)]
         for t in o.trials], out)
    b = o.baseline
    print(f"baseline: {'reliable' if b.reliable else 'UNRELIABLE'}: {b.reason}", file=out)
    rec = result.recommendation
    if rec.keepCurrent:
        verdict = f"keep the current settings ({describe_point(rec.values)})"
    else:
        verdict = describe_point(rec.values)
    if rec.gain is not None:
        g = rec.gain
        verdict += (f"; gain {g.pct:+.1f}% (95% interval {g.low:+.1f}% .. {g.high:+.1f}%),"
                    f" {'significant' if rec.significant else 'within the noise'}")
    print(f"recommendation: {verdict}", file=out)
    print(f"  {rec.reason}", file=out)
    mattered = [f"{k} {v:.1f}%" for k, v in o.effects.items() if v is not None]
    if mattered:
        print(f"effect per parameter (spread of the best means): {', '.join(mattered)}", file=out)
    where = ("the recommendation (applyResult)" if result.left == "recommendation"
             else "its settings from before")
    print(f"{result.device} holds {where}", file=out)
    if result.overhead_s is not None:
        print(f"overhead per trial besides fio: {result.overhead_s:.2f} s (mean)", file=out)
