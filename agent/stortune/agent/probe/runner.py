"""Run a probe on this host in the background, holding the benchmark lock.

``ProbeManager`` is what the CLI and the gRPC service call::

    manager = ProbeManager(fs, state_dir, on_progress=publish)
    probe_id = manager.start("md126")       # checks now, runs in a thread
    manager.cancel(probe_id); manager.wait(probe_id); manager.result(probe_id)

A probe reads each member (bottom device) alone, sequential 1 MiB and random 4 KiB,
then 2, 4 ... N members at once, sequentially. It holds the state directory's bench
lock (``journal.hold_benchmark``) for its whole run: no benchmark, apply or restore
runs beside it, and it is refused while one of those holds the host. The lock is
released however the probe ends. A probe that ends done merges its per-member
ceilings into ``<state>/probes/measured.json`` (``store.load_measured``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from stortune.agent import journal, local
from stortune.agent.bench.errors import BenchmarkBusyError, BenchmarkError, UnknownRunError
from stortune.agent.bench.fio import FioInvocation, FioRunner, SubprocessFioRunner, kill_fio_running
from stortune.agent.kernelfs import KernelFS
from stortune.agent.probe import members as probe_members
from stortune.agent.probe.jobs import ProbeSettings, Step, plan_steps, render
from stortune.agent.probe.store import ProbeStore, check_probe_id, merge_measured
from stortune.agent.protection import HostProtection
from stortune.schemas.analysis.ceilings import mb
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.probe import ProbeResult, ProbeState, ScalingPoint, scaling_counts, with_gains
from stortune.schemas.bench import fioresult
from stortune.schemas.bench.results import RunProgress

log = logging.getLogger("stortune.agent.probe")

ProgressSink = Callable[[RunProgress], None]


class ProbeStepError(Exception):
    """One step's fio run did not measure (the message says why)."""


def new_probe_id() -> str:
    return f"probe-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


@dataclass
class _Probe:
    probe_id: str
    device: str | None
    members: list[probe_members.Member]
    steps: list[Step]
    locks: contextlib.ExitStack
    cancel: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    index: int = 0


class ProbeManager:
    def __init__(self, fs: KernelFS, state_dir: Path, *, runner: FioRunner | None = None,
                 settings: ProbeSettings | None = None, on_progress: ProgressSink | None = None,
                 apply_wait: float = 60.0, protection: HostProtection | None = None) -> None:
        self.fs = fs
        #: The devices this host protects: never probed.
        self.protection = protection or HostProtection()
        self.state_dir = state_dir
        self.runner: FioRunner = runner or SubprocessFioRunner()
        self.settings = settings or ProbeSettings()
        self.on_progress = on_progress
        self.apply_wait = apply_wait
        self.store = ProbeStore(state_dir)
        self._lock = threading.Lock()
        self._active: _Probe | None = None
        self._progress: dict[str, RunProgress] = {}
        self._recover_stale()

    # -- the API -----------------------------------------------------------------------
    def start(self, device: str | None, probe_id: str | None = None) -> str:
        """Check the device and the host, take the bench lock, run in a background thread.

        Raises ProbeDeviceError (the device), ProtectedDeviceError (the host protects it or a
        member), BenchmarkBusyError (a benchmark or probe
        runs), FioNotInstalledError, or BenchmarkError for a reused id.
        """
        probe_id = check_probe_id(probe_id or new_probe_id())
        with self._lock:
            if self._active is not None:
                raise BenchmarkBusyError(self._active.probe_id)
            topology = local.discover(self.fs)
            chosen = probe_members.resolve(self.fs, topology, device,
                                           self.protection.resolve(self.fs, topology))
            self.runner.version()  # fio missing: say so now, not in the thread
            if probe_id in self.store.ids():
                raise BenchmarkError(f"a probe {probe_id!r} already exists on this agent")
            locks = contextlib.ExitStack()
            locks.enter_context(journal.hold_benchmark(self.state_dir, probe_id,
                                                       apply_timeout=self.apply_wait))
            try:
                self.store.create(probe_id)
                probe = _Probe(probe_id, device, chosen,
                               plan_steps(chosen, scaling_counts(len(chosen))), locks)
                self._publish(probe, "queued", "queued")
                self._active = probe
                threading.Thread(target=self._run, args=(probe,), name=f"stortune-probe-{probe_id}",
                                 daemon=True).start()
            except BaseException:
                self._active = None
                locks.close()
                raise
        return probe_id

    def cancel(self, probe_id: str) -> bool:
        """Stop a running probe; False when it has already ended."""
        with self._lock:
            if self._active is not None and self._active.probe_id == probe_id:
                self._active.cancel.set()
                return True
        if probe_id not in self.store.ids():
            raise UnknownRunError(probe_id)
        return False

    def knows(self, probe_id: str) -> bool:
        return probe_id in self._progress or probe_id in self.store.ids()

    def progress(self, probe_id: str) -> RunProgress:
        if probe_id in self._progress:
            return self._progress[probe_id]
        stored = self.store.read_status(probe_id) if probe_id in self.store.ids() else None
        if stored is None:
            raise UnknownRunError(probe_id)
        return stored

    def wait(self, probe_id: str, timeout: float | None = None) -> RunProgress:
        with self._lock:
            probe = self._active if self._active and self._active.probe_id == probe_id else None
        if probe is not None:
            probe.done.wait(timeout)
        return self.progress(probe_id)

    def result(self, probe_id: str) -> ProbeResult | None:
        return self.store.read_result(probe_id)

    def active(self) -> str | None:
        with self._lock:
            return self._active.probe_id if self._active else None

    def close(self, timeout: float = 30.0) -> None:
        with self._lock:
            probe = self._active
        if probe is not None:
            probe.cancel.set()
            probe.done.wait(timeout)

    # -- running -----------------------------------------------------------------------
    def _run(self, probe: _Probe) -> None:
        result = ProbeResult(probe_id=probe.probe_id, state="running", device=probe.device,
                             members=[m.name for m in probe.members],
                             step_seconds=self.settings.seconds, created_at=time.time())
        state: ProbeState = "failed"
        message = ""
        figures: dict[str, fioresult.FioResult] = {}
        try:
            for index, step in enumerate(probe.steps):
                if probe.cancel.is_set():
                    break
                probe.index = index
                self._publish(probe, "running", step.name, persist=True)
                figures[step.name] = self._run_step(probe, index, step)
            if probe.cancel.is_set():
                state, message = "cancelled", "cancelled"
            else:
                state = "done"
        except ProbeStepError as exc:
            message = str(exc)
        except Exception as exc:
            log.exception("probe %s failed", probe.probe_id)
            message = f"{type(exc).__name__}: {exc}"
        finally:
            self._finish(probe, result, figures, state, message)

    def _run_step(self, probe: _Probe, index: int, step: Step) -> fioresult.FioResult:
        where = self.store.step_dir(probe.probe_id, index, step.name)
        (where / "job.fio").write_text(render(step, self.settings), encoding="utf-8")
        outcome = self.runner.run(
            FioInvocation(where / "job.fio", where / "fio.json", where / "stderr.txt", where,
                          timeout=2 * self.settings.seconds + 120, readonly=True),
            on_status=lambda _status: None, cancel=probe.cancel,
            on_start=lambda pid: self.store.write_fio_pid(probe.probe_id, pid))
        if outcome.cancelled:
            return fioresult.FioResult()
        if outcome.timed_out:
            raise ProbeStepError(f"{step.name}: fio ran far past its runtime and was stopped")
        try:
            parsed = fioresult.parse(outcome.output)
        except fioresult.FioOutputError as exc:
            raise ProbeStepError(f"{step.name}: {exc}; stderr: {outcome.stderr.strip()[-300:]}") from None
        if not parsed.ok or outcome.returncode != 0 or not parsed.read.has_io:
            why = "; ".join(parsed.errors) or f"fio exited with status {outcome.returncode}"
            raise ProbeStepError(f"{step.name}: {why}; stderr: {outcome.stderr.strip()[-300:]}")
        return parsed

    def _finish(self, probe: _Probe, result: ProbeResult, figures: dict[str, fioresult.FioResult],
                state: ProbeState, message: str) -> None:
        try:
            now = time.time()
            ceilings: list[MeasuredCeiling] = []
            for m in probe.members:
                seq, rand = figures.get(f"seq-{m.name}"), figures.get(f"rand-{m.name}")
                if seq is None and rand is None:
                    continue
                ceilings.append(MeasuredCeiling(
                    device=m.name, run_id=probe.probe_id, measured_at=now,
                    read_bytes_per_second=seq.read.bandwidth if seq and seq.read.has_io else None,
                    read_iops=rand.read.iops if rand and rand.read.has_io else None))
            points = []
            first = probe.members[0].name
            for k in scaling_counts(len(probe.members)):
                got = figures.get(f"seq-{first}" if k == 1 else f"scale-{k}")
                if got is not None and got.read.has_io:
                    points.append(ScalingPoint(count=k, devices=[m.name for m in probe.members[:k]],
                                               read_bytes_per_second=got.read.bandwidth))
            scaling, stops = with_gains(points)
            if len(probe.members) > 1 and scaling and scaling[-1].count == len(probe.members):
                ceilings.append(MeasuredCeiling(
                    device="+".join(scaling[-1].devices), run_id=probe.probe_id, measured_at=now,
                    read_bytes_per_second=max(p.read_bytes_per_second for p in scaling)))
            if state == "done":
                message = _summary(ceilings, scaling, stops)
            result = result.model_copy(update={
                "state": state, "message": message, "ceilings": ceilings, "scaling": scaling,
                "scaling_stops_at": stops, "finished_at": time.time()})
            self.store.write_result(result)
            if state == "done":
                merge_measured(self.state_dir, ceilings)
        except Exception:
            log.exception("probe %s: storing the result failed", probe.probe_id)
        finally:
            with self._lock:
                self._active = None
                probe.locks.close()
            self._publish(probe, state, message, persist=True)
            probe.done.set()

    # -- progress ----------------------------------------------------------------------
    def _publish(self, probe: _Probe, state: ProbeState, message: str, *, persist: bool = False) -> None:
        count = len(probe.steps)
        finished = state in ("done", "failed", "cancelled")
        step = probe.steps[probe.index].name if state == "running" else None
        progress = RunProgress(
            run_id=probe.probe_id, state=state, step=step, step_count=count,
            step_index=probe.index + 1 if state == "running" else 0,
            percent=100.0 if state == "done" else (100.0 * probe.index / count if not finished else 0.0),
            eta_seconds=round((count - probe.index) * self.settings.seconds) if not finished else 0,
            message=message)
        self._progress[probe.probe_id] = progress
        if persist:
            with contextlib.suppress(OSError):
                self.store.write_status(progress)
        if self.on_progress is not None:
            try:
                self.on_progress(progress)
            except Exception:
                log.exception("probe progress sink failed")

    def _recover_stale(self) -> None:
        """A probe without a result and without the bench lock: its agent died; mark it failed."""
        holder = journal.benchmark_running(self.state_dir) if self.state_dir.is_dir() else None
        for probe_id in self.store.ids():
            if probe_id == holder or (self.store.dir(probe_id) / "result.json").exists():
                continue
            self._kill_stale_fio(probe_id)
            message = "the agent stopped during the probe"
            with contextlib.suppress(OSError):
                self.store.write_result(ProbeResult(probe_id=probe_id, state="failed", message=message,
                                                    finished_at=time.time()))
                self.store.write_status(RunProgress(run_id=probe_id, state="failed", message=message))

    def _kill_stale_fio(self, probe_id: str) -> None:
        """Stop the fio a dead agent left reading the disks: only a process whose command line
        names this probe's directory (the pid may have been reused since). This host's /proc,
        not the injected procfs root: a process the agent started is no kernel fact to fake."""
        # Its job processes are in sessions of their own (fio calls setsid()), the leader's or not.
        kill_fio_running(lambda job: job.startswith(f"{self.store.dir(probe_id)}/"))
        pid = self.store.read_fio_pid(probe_id)
        if pid is None:
            return
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read(1 << 16).replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return  # gone already
        if f"{self.store.dir(probe_id)}/" in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # fio: its own session
                log.warning("killed fio (pid %d) left running by the interrupted probe %s", pid, probe_id)


def _summary(ceilings: list[MeasuredCeiling], scaling: list[ScalingPoint], stops: int | None) -> str:
    alone = [c for c in ceilings if "+" not in c.device]
    text = f"done: {len(alone)} member(s) measured alone"
    if len(scaling) > 1:
        top = max(scaling, key=lambda p: p.read_bytes_per_second)
        text += f"; {top.count} at once: {mb(top.read_bytes_per_second)}"
        if stops is None:
            text += "; throughput kept scaling"
        else:
            before = max(p.count for p in scaling if p.count < stops)
            text += f"; scaling stopped at {stops} members (< 10 % more than {before})"
    return text
