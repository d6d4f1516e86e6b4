"""Run benchmarks on this host, one at a time, in the background; keep every result.

``BenchmarkManager`` is what the CLI and the gRPC service call::

    manager = BenchmarkManager(fs, state_dir, on_progress=publish)
    run_id = manager.start(spec)          # checks now, runs in a thread
    manager.progress(run_id)              # RunProgress, also pushed to on_progress
    manager.cancel(run_id)                # stops fio (no process left), keeps what ran
    manager.wait(run_id)                  # the final RunProgress
    manager.result(run_id)                # BenchmarkResult (None while running)
    manager.forget(run_id)                # delete it once fetched

``start`` refuses clearly, before anything runs: an unknown or ambiguous
target, a step that does not fit, an unsafe write (``UnsafeTargetError``),
missing fio, or a benchmark already running here (``BenchmarkBusyError``,
also across processes through the state directory's bench lock). While a
run holds that lock, every apply, restore and recovery on the state
directory is refused with BenchmarkBusyError, so settings cannot change under
a measurement. Runs are stored under ``<state>/bench`` (see ``store``); a run
found unfinished at start (the agent died) is concluded as failed and any fio
it left behind is killed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from stortune.agent import journal, local
from stortune.agent.bench import context as ctx
from stortune.agent.bench import signatures, targets
from stortune.agent.bench.errors import BenchmarkBusyError, BenchmarkError, UnknownRunError
from stortune.agent.bench.files import BenchFiles
from stortune.agent.bench.fio import (
    FioInvocation,
    FioOutcome,
    FioRunner,
    FioStatus,
    SubprocessFioRunner,
    kill_fio_running,
)
from stortune.agent.bench.sampler import DiskstatsSampler
from stortune.agent.bench.store import RunStore, check_run_id, new_run_id
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe.store import load_measured
from stortune.agent.protection import HostProtection
from stortune.agent.tools import ToolRunner
from stortune.schemas.analysis import layers, verdict
from stortune.schemas.analysis.model import DeviceAnalysis, MeasuredCeiling
from stortune.schemas.bench import fiojob, fioresult
from stortune.schemas.bench.results import BenchmarkResult, DeviceStats, RunProgress, RunState, StepRun
from stortune.schemas.bench.spec import BenchmarkSpec
from stortune.schemas.bench.steps import WorkloadStep
from stortune.schemas.topology import Topology

log = logging.getLogger("stortune.agent.bench")

ProgressSink = Callable[[RunProgress], None]
#: The target's layer model from the topology and the measured ceilings (by device name).
Analyzer = Callable[[Topology, str, Mapping[str, MeasuredCeiling]], DeviceAnalysis]
#: The probe's measured ceilings as they stand when a run concludes.
MeasuredSource = Callable[[], Mapping[str, MeasuredCeiling]]
_BLKFLSBUF = 0x1261  # linux/fs.h: write back and drop a block device's cached pages
#: fio's live figures are preferred to diskstats' while they are this fresh (seconds).
_FRESH = 3.0


@dataclass
class _Run:
    run_id: str
    spec: BenchmarkSpec
    target: targets.ResolvedTarget
    steps: list[WorkloadStep]
    units: list[tuple[int, int, WorkloadStep]]  # (repeat, step index, step), in run order
    locks: contextlib.ExitStack
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    unit: int = 0
    unit_started: float = 0.0
    fio_pid: int | None = None
    fio_status: tuple[float, FioStatus] | None = None
    claimed: bool = False  # file targets: the file is the run's (recorded busy)
    topology: Topology | None = None  # as the run started: the verdict's layers come from it
    created: bool = False  # file targets: this run made the file


def step_timeout(step: WorkloadStep) -> float | None:
    """How long fio may take before it is stopped: twice its runtime (or cap), plus setup."""
    return None if step.runtime is None else 2 * (step.runtime + step.ramp_time) + 300


class BenchmarkManager:
    def __init__(self, fs: KernelFS, state_dir: Path, *, runner: FioRunner | None = None,
                 on_progress: ProgressSink | None = None, sample_interval: float = 1.0,
                 agent_version: str | None = None, apply_wait: float = 60.0,
                 tools: ToolRunner | None = None, bench_dirs: Sequence[Path] = (),
                 analyzer: Analyzer | None = None, measured: MeasuredSource | None = None,
                 protection: HostProtection | None = None) -> None:
        self.fs = fs
        #: The devices this host protects (``protection``): no benchmark on them, reads included.
        self.protection = protection or HostProtection()
        self.state_dir = state_dir
        self.runner: FioRunner = runner or SubprocessFioRunner()
        self.on_progress = on_progress
        self.sample_interval = sample_interval
        self.agent_version = agent_version
        self.apply_wait = apply_wait
        #: Runs the raw-device signature probe (wipefs); default: PATH and the sbin directories.
        self.tools = tools or signatures.probe_tools()
        #: Where file targets may be: ``bench_dirs`` (the host's --bench-dir) and <state>/bench-files.
        self.files = BenchFiles(fs, state_dir, bench_dirs)
        self.store = RunStore(state_dir)
        #: Builds the target's layers for the bottleneck verdict (default: the analysis of
        #: schemas.analysis.layers, the same as `stortune-agent analyze`).
        self.analyzer: Analyzer = analyzer or layers.device_analysis
        #: Measured ceilings: by default what probes stored in this state directory (none stored:
        #: the analysis uses class and link ceilings).
        self.measured = measured or (lambda: {c.device: c for c in load_measured(state_dir)})
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._active: _Run | None = None
        self._progress: dict[str, RunProgress] = {}
        self._recover_stale()

    # -- the API -----------------------------------------------------------------------
    def start(self, spec: BenchmarkSpec, run_id: str | None = None) -> str:
        """Check everything, take the host, and run ``spec`` in a background thread."""
        run_id = check_run_id(run_id or new_run_id())
        with self._lock:
            if self._active is not None:
                raise BenchmarkBusyError(self._active.run_id)
            run = self._prepare(spec, run_id)
            try:
                self.store.create(run_id, spec.document())
                self._publish(run, "queued", message="queued")
                self._active = run
                threading.Thread(target=self._run, args=(run,), name=f"stortune-bench-{run_id}",
                                 daemon=True).start()
            except BaseException:
                self._active = None
                run.locks.close()
                raise
        return run_id

    def cancel(self, run_id: str) -> bool:
        """Stop a running benchmark; False when it has already ended."""
        with self._lock:
            if self._active is not None and self._active.run_id == run_id:
                self._active.cancel.set()
                return True
        if run_id not in self.store.runs():
            raise UnknownRunError(run_id)
        return False

    def progress(self, run_id: str) -> RunProgress:
        if run_id in self._progress:
            return self._progress[run_id]
        stored = self.store.read_status(run_id) if run_id in self.store.runs() else None
        if stored is None:
            raise UnknownRunError(run_id)
        return stored[0]

    def wait(self, run_id: str, timeout: float | None = None) -> RunProgress:
        """Block until the run ends (or ``timeout``); its latest progress."""
        with self._lock:
            run = self._active if self._active and self._active.run_id == run_id else None
        if run is not None:
            run.done.wait(timeout)
        return self.progress(run_id)

    def result(self, run_id: str) -> BenchmarkResult | None:
        """The stored result; None while the run is still going."""
        return self.store.read_result(run_id)

    def active(self) -> str | None:
        with self._lock:
            return self._active.run_id if self._active else None

    def runs(self) -> list[str]:
        return self.store.runs()

    def forget(self, run_id: str) -> None:
        """Delete a finished run's files (once the control plane has fetched them)."""
        if self.active() == run_id:
            raise BenchmarkError(f"benchmark {run_id} is running; cancel it first")
        self.store.delete(run_id)
        self._progress.pop(run_id, None)

    def close(self, timeout: float = 30.0) -> None:
        """Cancel the running benchmark, if any, and wait for it to wind down."""
        with self._lock:
            run = self._active
        if run is not None:
            run.cancel.set()
            run.done.wait(timeout)

    # -- preparing ---------------------------------------------------------------------
    def check(self, spec: BenchmarkSpec) -> tuple[targets.ResolvedTarget, list[WorkloadStep]]:
        """Every refusal ``start`` makes before it takes the host (a dry run stops here):
        the target, the steps, a protected device, an unsafe write, fio missing."""
        topology = local.discover(self.fs)
        target = targets.resolve(self.fs, spec, topology, self.files)
        steps = spec.steps(target.info.facts)
        for step in steps:
            try:
                fiojob.render(step, target.fio)
            except fiojob.JobError as exc:
                raise BenchmarkError(str(exc)) from None
        if not target.is_file:  # a file lies in a directory the host gave benchmarks
            self.protection.check(self.fs, topology, [b.device for b in target.beneath], "benchmark")
        targets.check_safety(target, steps, spec.spec.allowDestructive, tools=self.tools)
        self.runner.version()  # fio missing: say so now, not in the thread
        return target, steps

    def _prepare(self, spec: BenchmarkSpec, run_id: str) -> _Run:
        target, steps = self.check(spec)
        if run_id in self.store.runs():
            raise BenchmarkError(f"a benchmark run {run_id!r} already exists on this agent")
        locks = contextlib.ExitStack()
        locks.enter_context(journal.hold_benchmark(self.state_dir, run_id,
                                                   apply_timeout=self.apply_wait))
        repeats = max(s.repeats for s in steps)
        # Repeats go round the whole list, so iozone's write comes before each rewrite.
        units = [(r, i, s) for r in range(repeats) for i, s in enumerate(steps) if r < s.repeats]
        return _Run(run_id, spec, target, steps, units, locks)

    # -- running -----------------------------------------------------------------------
    def _run(self, run: _Run) -> None:
        started = time.time()
        result = BenchmarkResult(run_id=run.run_id, name=run.spec.name, state="running",
                                 spec=run.spec.document(), created_at=started, started_at=started,
                                 steps=run.steps)
        state: RunState = "failed"
        message = ""
        try:
            if run.target.is_file:
                run.created = self.files.claim(run.target.info.path, run.run_id)
                run.claimed = True
            topology = run.topology = local.discover(self.fs)
            result.context = ctx.capture(self.fs, topology, run.target, self.state_dir,
                                         agent_version=self.agent_version,
                                         fio_version=self.runner.version())
            for n, (repeat, index, step) in enumerate(run.units):
                if run.cancel.is_set():
                    break
                run.unit, run.unit_started = n, time.monotonic()
                step_run = self._run_step(run, index, step, repeat)
                result.runs.append(step_run)
                if run.target.is_file:
                    self.files.settle(run.target.info.path, run.run_id)  # fio may have made it anew
                if step_run.state != "done":
                    message = (f"{step.name} (repeat {repeat + 1}) {step_run.state}:"
                               f" {step_run.message}")
                    break
            if run.cancel.is_set():
                state, message = "cancelled", message or "cancelled"
            elif result.runs and all(r.state == "done" for r in result.runs):
                state = "done"
            after = local.discover(self.fs)
            devices = [b.device for b in run.target.beneath]
            result.context.warnings += ctx.changed(result.context.settings,
                                                   ctx.settings_of(after, devices))
            if after.structure_hash() != result.context.topology_hash:
                result.context.warnings.append("the device graph changed during the run")
        except BenchmarkError as exc:  # a file target the host does not allow (any more)
            log.warning("benchmark %s failed: %s", run.run_id, exc)
            state, message = "failed", str(exc)
        except Exception as exc:
            log.exception("benchmark %s failed", run.run_id)
            state, message = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            self._finish(run, result, state, message)

    def _finish(self, run: _Run, result: BenchmarkResult, state: RunState, message: str) -> None:
        try:
            self._release_file(run, result)
            final = result.model_copy(update={"state": state, "finished_at": time.time()})
            final = final.concluded(run.spec.spec.thresholds)
            final = self._judged(run, final)
            if state == "done":
                message = _summary(final)
            final.message = message
            self.store.write_result(final)
        except Exception:
            log.exception("benchmark %s: storing the result failed", run.run_id)
        finally:
            with self._lock:
                self._active = None
                run.locks.close()
            self._publish(run, state, percent=100.0 if state == "done" else None, message=message,
                          persist=True)
            run.done.set()

    def _judged(self, run: _Run, result: BenchmarkResult) -> BenchmarkResult:
        """The result with its bottleneck verdict, slow members and path balance; a verdict
        that cannot be made is a warning, never a lost result."""
        device = run.target.info.device
        if run.topology is None or not result.runs:
            return result
        try:
            analysis = None
            if device is not None:
                analysis = self.analyzer(run.topology, device, self.measured())
            return verdict.judged(result, run.topology, analysis)
        except Exception as exc:
            log.exception("benchmark %s: the bottleneck verdict failed", run.run_id)
            if result.context is not None:
                result.context.warnings.append(f"no bottleneck verdict: {type(exc).__name__}: {exc}")
            return result

    def _release_file(self, run: _Run, result: BenchmarkResult) -> None:
        """Remove the file the run made (unless keep: true), or keep it recorded as stortune's."""
        file = run.spec.spec.target.file
        if not run.claimed or file is None:
            return
        try:
            self.files.release(file.path, run.run_id, remove=run.created and not file.keep)
        except (BenchmarkError, OSError) as exc:
            log.warning("benchmark %s: its file was left in place: %s", run.run_id, exc)
            if result.context is not None:
                result.context.warnings.append(f"the file target was left in place: {exc}")

    def _run_step(self, run: _Run, index: int, step: WorkloadStep, repeat: int) -> StepRun:
        where = self.store.step_dir(run.run_id, index, step.name, repeat)
        (where / "job.fio").write_text(fiojob.render(step, run.target.fio), encoding="utf-8")
        self._before_step(run, step)
        run.fio_status = None
        self._publish(run, "running", message=f"{step.name}", persist=True)
        sampler = DiskstatsSampler(self.fs, run.target.beneath, interval=self.sample_interval,
                                   on_tick=lambda disk: self._live(run, disk=disk))
        started = time.time()
        sampler.start()
        try:
            outcome = self.runner.run(
                FioInvocation(where / "job.fio", where / "fio.json", where / "stderr.txt", where,
                              step_timeout(step)),
                on_status=lambda status: self._live(run, fio=status), cancel=run.cancel,
                on_start=lambda pid: self._fio_started(run, pid))
        finally:
            devices = sampler.stop()
            run.fio_pid = None
        rel = where.relative_to(self.store.dir(run.run_id))
        files = {"job": str(rel / "job.fio"), "output": str(rel / "fio.json"),
                 "stderr": str(rel / "stderr.txt")}
        return _step_run(step, repeat=repeat, started=started, outcome=outcome, devices=devices,
                         files=files, problems=sampler.problems)

    def _before_step(self, run: _Run, step: WorkloadStep) -> None:
        target = run.target
        if target.is_file:
            if step.fresh_file and (run.created or run.spec.spec.allowDestructive):
                self.files.renew(target.info.path, run.run_id)
            return
        if step.invalidate:
            # fio's invalidate=1 does this too; done here as well so a read step never
            # starts from pages an earlier step left in the device's cache.
            with contextlib.suppress(OSError):
                fd = os.open(target.node, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    fcntl.ioctl(fd, _BLKFLSBUF)
                finally:
                    os.close(fd)

    def _fio_started(self, run: _Run, pid: int) -> None:
        run.fio_pid = pid
        self._publish(run, "running", message=run.units[run.unit][2].name, persist=True)

    # -- progress ----------------------------------------------------------------------
    def _live(self, run: _Run, *, fio: FioStatus | None = None, disk: DeviceStats | None = None) -> None:
        """Publish live figures: fio's own while fresh, else the target's diskstats."""
        now = time.monotonic()
        if fio is not None:
            run.fio_status = (now, fio)
        status = run.fio_status[1] if run.fio_status and now - run.fio_status[0] < _FRESH else None
        if status is not None and (status.read_bytes_per_s is not None
                                   or status.write_bytes_per_s is not None):
            rates = {"read_bytes_per_s": status.read_bytes_per_s or 0.0,
                     "write_bytes_per_s": status.write_bytes_per_s or 0.0,
                     "read_iops": status.read_iops or 0.0, "write_iops": status.write_iops or 0.0}
        elif disk is not None:
            rates = {"read_bytes_per_s": disk.read_bytes_per_s,
                     "write_bytes_per_s": disk.write_bytes_per_s,
                     "read_iops": disk.read_iops, "write_iops": disk.write_iops}
        elif fio is None:
            return
        else:
            rates = {}
        self._publish(run, "running", message=run.units[run.unit][2].name, status=status, rates=rates)

    def _publish(self, run: _Run, state: RunState, *, message: str = "", percent: float | None = None,
                 status: FioStatus | None = None, persist: bool = False,
                 rates: dict[str, float] | None = None) -> None:
        repeat, _, step = run.units[min(run.unit, len(run.units) - 1)]
        expected = step.expected_seconds()
        fraction = 0.0
        if status is not None and status.percent is not None:
            fraction = status.percent / 100
        elif expected and state == "running":
            fraction = min(0.99, (time.monotonic() - run.unit_started) / expected)
        if percent is None:
            done = run.unit if state in ("queued", "running") else len(run.units)
            percent = 100 * (done + (fraction if state == "running" else 0)) / len(run.units)
        remaining = [s.expected_seconds() for _, _, s in run.units[run.unit + 1:]]
        eta = 0
        if state == "running":
            if expected:
                current = (1 - fraction) * expected
            else:  # size-bound: only fio knows
                current = float(status.eta_seconds or 0) if status is not None else 0.0
            eta = round(current + sum(r for r in remaining if r))
        progress = RunProgress(
            run_id=run.run_id, state=state, percent=round(min(100.0, percent), 1),
            step=step.name if state in ("running", "queued") else None,
            step_index=run.unit + 1, step_count=len(run.units), repeat=repeat, eta_seconds=eta,
            message=message, **(rates or {}),
        )
        with self._publish_lock:
            self._progress[run.run_id] = progress
            if persist:
                with contextlib.suppress(OSError):
                    self.store.write_status(progress, run.fio_pid)
            if self.on_progress is not None:
                try:
                    self.on_progress(progress)
                except Exception:
                    log.exception("benchmark progress sink failed")

    # -- after a crash -----------------------------------------------------------------
    def _recover_stale(self) -> None:
        holder = journal.benchmark_running(self.state_dir) if self.state_dir.is_dir() else None
        for run_id in self.store.unfinished():
            if run_id == holder:
                continue
            where = self.store.dir(run_id)
            stored = self.store.read_status(run_id)
            if stored is not None and stored[1]:
                self._kill_stale_fio(stored[1], where)
            spec = ctx_spec(where)
            result = BenchmarkResult(
                run_id=run_id, name=str(spec.get("metadata", {}).get("name", "")), state="failed",
                message="the agent stopped during the run; step outputs so far are kept in steps/",
                spec=spec, created_at=where.stat().st_mtime, finished_at=time.time())
            # The status too: it is what WatchBenchmark and GetBenchmarkResult report, and left at
            # "running" it would keep a watcher (the control plane) waiting for an end that came.
            before = stored[0] if stored is not None else None
            status = RunProgress(run_id=run_id, state="failed", message=result.message,
                                 percent=before.percent if before is not None else 0.0,
                                 step_count=before.step_count if before is not None else 0)
            with contextlib.suppress(OSError):
                self.store.write_result(result)
                self.store.write_status(status)
                log.warning("benchmark %s was interrupted by an agent restart: marked failed", run_id)

    def _kill_stale_fio(self, pid: int, where: Path) -> None:
        cmdline = self.fs.read_proc(f"{pid}/cmdline") or ""
        if str(where) in cmdline.replace("\x00", " "):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                log.warning("killed fio (pid %d) left running by an interrupted benchmark", pid)
        # Its job processes are in sessions of their own (fio calls setsid()).
        kill_fio_running(lambda job: job.startswith(f"{where}/"))


def ctx_spec(where: Path) -> dict[str, Any]:
    try:
        data = json.loads((where / "spec.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tail(text: str, lines: int = 3) -> str:
    return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def _step_run(step: WorkloadStep, *, repeat: int, started: float, outcome: FioOutcome,
              devices: list[DeviceStats], files: dict[str, str], problems: list[str]) -> StepRun:
    """Judge one fio run: cancelled, timed out, no result, a job error, or done."""
    fio: fioresult.FioResult | None = None
    message = ""
    stderr, returncode = outcome.stderr, outcome.returncode
    try:
        fio = fioresult.parse(outcome.output)
    except fioresult.FioOutputError as exc:
        message = str(exc)
    state: Literal["done", "failed", "cancelled"] = "done"
    if outcome.cancelled:
        state, message = "cancelled", "cancelled"
    elif outcome.timed_out:
        state, message = "failed", "fio ran far past the step's runtime and was stopped"
    elif fio is None:
        state = "failed"
        message = f"{message}; stderr: {_tail(stderr)}" if stderr.strip() else message
    elif not fio.ok or returncode != 0:
        state = "failed"
        message = "; ".join(fio.errors or [f"fio exited with status {returncode}"])
        if stderr.strip():
            message += f"; stderr: {_tail(stderr)}"
    if problems and not message:
        message = "; ".join(problems)
    return StepRun(
        step=step.name, repeat=repeat, state=state,
        started_at=started, finished_at=time.time(), fio=fio,
        metrics=fio.metrics() if fio is not None and state == "done" else {},
        devices=devices, message=message, files=files,
    )


def _summary(result: BenchmarkResult) -> str:
    text = f"done: {len(result.runs)} step run(s)"
    if result.verdict is not None:
        failed = [o for o in result.verdict.outcomes if not o.passed]
        checks = len(result.verdict.outcomes)
        text += (f"; {checks} threshold check(s) passed" if not failed
                 else f"; {len(failed)} of {checks} threshold check(s) failed")
    return text
