"""The agent's gRPC service: the control plane's view of this host.

Each call runs the same local operations as the CLI (``stortune.agent.local``),
so what the control plane sees and does is exactly what ``stortune-agent
plan/apply/restore`` would see and do here. Messages are converted by
``stortune.api.agent.wire``; nothing here touches protobuf fields.

Only serve mode imports this module (it pulls in grpc).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import grpc

from stortune.agent import journal, local
from stortune.agent.bench.errors import UnknownRunError
from stortune.agent.bench.store import RunStore
from stortune.agent.journal import StateError, StateLockedError
from stortune.agent.kernelfs import KernelFS
from stortune.agent.protection import HostProtection, ProtectedDeviceError, matched_devices, trial_overlays
from stortune.api.agent import wire
from stortune.api.agent.wire import BENCHMARK_STATES, BenchmarkProgress, HostInfo
from stortune.schemas import planner, stripecache
from stortune.schemas.documents import DocumentError

if TYPE_CHECKING:
    from stortune.agent.bench.manager import BenchmarkManager
    from stortune.agent.probe.runner import ProbeManager
    from stortune.schemas.bench.results import RunProgress
    from stortune.schemas.profile import StorageProfile

log = logging.getLogger("stortune.agent.rpc")

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


def agent_version() -> str:
    try:
        return metadata.version("stortune")
    except metadata.PackageNotFoundError:
        return "0+unknown"


# -- benchmark runs ------------------------------------------------------------------
@dataclass
class _Run:
    progress: BenchmarkProgress
    version: int


class BenchmarkRegistry:
    """The benchmark runs of this agent and each one's latest progress.

    A runner publishes progress; WatchBenchmark streams it. Watchers see the
    latest state, not every update (progress is level-like: a slow watcher
    skips intermediate percentages but never the final state). Finished runs
    are kept for a while so a watcher arriving just after the end still gets
    the outcome.
    """

    def __init__(self, keep_finished: int = 32) -> None:
        self._cond = threading.Condition()
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._keep = keep_finished
        self._closed = False

    def publish(self, progress: BenchmarkProgress) -> None:
        if progress.state not in BENCHMARK_STATES:
            raise ValueError(f"benchmark state {progress.state!r} is not one of "
                             f"{', '.join(BENCHMARK_STATES)}")
        with self._cond:
            run = self._runs.get(progress.run_id)
            if run is None:
                self._runs[progress.run_id] = _Run(progress, 0)
            else:
                run.progress, run.version = progress, run.version + 1
            self._evict()
            self._cond.notify_all()

    def _evict(self) -> None:
        finished = [rid for rid, run in self._runs.items() if run.progress.finished]
        for rid in finished[: max(0, len(finished) - self._keep)]:
            del self._runs[rid]

    def get(self, run_id: str) -> BenchmarkProgress | None:
        with self._cond:
            run = self._runs.get(run_id)
            return run.progress if run else None

    def wake(self) -> None:
        """Make watchers re-check their stop condition (a cancelled RPC)."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """End every watch (shutdown)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def watch(self, run_id: str, active: Callable[[], bool] = lambda: True,
              poll: float = 1.0) -> Iterator[BenchmarkProgress]:
        """The current progress, then each newer one, until the run finishes.

        Ends early when ``active()`` turns false or the registry closes.
        ``poll`` bounds how long a missed wake-up can delay noticing that.
        """
        seen = -1
        while True:
            with self._cond:
                while True:
                    run = self._runs.get(run_id)
                    if self._closed or not active() or run is None:
                        return
                    if run.version != seen:
                        break
                    self._cond.wait(poll)
                seen, progress = run.version, run.progress
            yield progress  # outside the lock: a slow client must not block publishers
            if progress.finished:
                return


def wire_progress(progress: RunProgress) -> BenchmarkProgress:
    """A BenchmarkManager's progress as the agent API carries it."""
    where = (f"step {progress.step_index}/{progress.step_count} {progress.step}"
             if progress.step and not progress.finished else "")
    message = " - ".join(part for part in (where, progress.message) if part and part != progress.step)
    return BenchmarkProgress(
        run_id=progress.run_id, state=progress.state, percent=progress.percent,
        read_bytes_per_s=progress.read_bytes_per_s, write_bytes_per_s=progress.write_bytes_per_s,
        read_iops=progress.read_iops, write_iops=progress.write_iops,
        eta_seconds=progress.eta_seconds, message=message or where)


def progress_sink(registry: BenchmarkRegistry) -> Callable[[RunProgress], None]:
    """Publish a BenchmarkManager's progress to ``registry`` (what WatchBenchmark streams)."""

    def publish(progress: RunProgress) -> None:
        registry.publish(wire_progress(progress))

    return publish


# -- the service ---------------------------------------------------------------------
def _status_errors(
    method: Callable[[AgentService, _Req, grpc.ServicerContext], _Resp],
) -> Callable[[AgentService, _Req, grpc.ServicerContext], _Resp]:
    """Map what a local operation raises to a gRPC status with a message that says what to fix."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: AgentService, request: _Req, context: grpc.ServicerContext) -> _Resp:
        try:
            return method(self, request, context)
        except (DocumentError, wire.WireError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"invalid {name} request:\n{exc}")
        except StateLockedError as exc:
            # Someone ran `stortune-agent apply` by hand, or a benchmark runs: retrying later is right.
            context.abort(grpc.StatusCode.ABORTED, str(exc))
        except UnknownRunError as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except (local.AgentError, StateError) as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except Exception as exc:
            log.exception("%s failed", name)
            context.abort(grpc.StatusCode.INTERNAL, f"{name} failed on the agent: "
                                                     f"{type(exc).__name__}: {exc}")

    return wrapper


class AgentService(wire.AgentServiceServicer):
    """AgentService over ``local``; applies and restores are serialised.

    ``apply_lock`` is shared with the hot-plug loop of ``serve``: the journal's
    flock is per open file, so two threads of this process would otherwise
    get in each other's way as if they were two processes.
    """

    def __init__(self, fs: KernelFS, state_dir: Path, *,
                 apply_lock: threading.Lock | None = None,
                 benchmarks: BenchmarkRegistry | None = None,
                 bench: BenchmarkManager | None = None,
                 tool_path: str | None = None,
                 bench_dirs: Sequence[Path] = (),
                 started_unix: int | None = None,
                 ram_share: float = stripecache.DEFAULT_RAM_SHARE,
                 protection: HostProtection | None = None) -> None:
        self.fs = fs
        #: The devices this host protects: no experiment, benchmark or probe on them.
        self.protection = protection or HostProtection()
        self.state_dir = state_dir
        #: A stripe_cache_size costing more of the host's RAM is refused (--stripe-cache-ram-share).
        self.ram_share = ram_share
        self.apply_lock = apply_lock or threading.Lock()
        self.benchmarks = benchmarks or BenchmarkRegistry()
        self._bench = bench
        self._bench_lock = threading.Lock()
        self._probes: ProbeManager | None = None
        #: Where diagnostics look for lsblk, smartctl ... and benchmarks for wipefs
        #: (None: this process's PATH and the sbin directories).
        self.tool_path = tool_path
        #: The host's directories for benchmark file targets (besides STATE_DIR/bench-files).
        self.bench_dirs = tuple(bench_dirs)
        self._version = agent_version()
        self._started = int(time.time()) if started_unix is None else started_unix
        if bench is None and RunStore(state_dir).unfinished():
            self._bench_manager()  # concludes the runs a dead agent left behind, now

    @property
    def bench(self) -> BenchmarkManager:
        """Runs benchmarks and publishes their progress into ``benchmarks``; while one
        runs, Apply and Restore fail fast with ABORTED ("busy: benchmark <id> running")."""
        return self._bench_manager()

    def _bench_manager(self) -> BenchmarkManager:
        # Made on first use: an idle agent holds neither fio's machinery nor the benchmark models.
        with self._bench_lock:
            if self._bench is None:
                from stortune.agent.bench.manager import BenchmarkManager
                from stortune.agent.bench.signatures import probe_tools

                self._bench = BenchmarkManager(self.fs, self.state_dir,
                                               on_progress=progress_sink(self.benchmarks),
                                               agent_version=self._version,
                                               tools=probe_tools(self.tool_path),
                                               bench_dirs=self.bench_dirs, protection=self.protection)
            return self._bench

    @property
    def probes(self) -> ProbeManager:
        """Runs probes; their progress goes to ``benchmarks`` too (WatchBenchmark streams it)."""
        with self._bench_lock:
            if self._probes is None:
                from stortune.agent.probe.runner import ProbeManager

                self._probes = ProbeManager(self.fs, self.state_dir,
                                            on_progress=progress_sink(self.benchmarks),
                                            protection=self.protection)
            return self._probes

    def _is_probe(self, run_id: str) -> bool:
        return run_id.startswith("probe-") and self.probes.knows(run_id)

    def _runs_of(self, run_id: str) -> ProbeManager | BenchmarkManager:
        """Who runs ``run_id``: Watch- and CancelBenchmark serve probes and benchmarks alike."""
        return self.probes if self._is_probe(run_id) else self.bench

    def close(self) -> None:
        """Stop the running benchmark or probe, if any (no fio outlives the agent), and end every watch."""
        with self._bench_lock:
            bench, probes = self._bench, self._probes
        if bench is not None:
            bench.close()
        if probes is not None:
            probes.close()
        self.benchmarks.close()

    @contextlib.contextmanager
    def _serialised(self, context: grpc.ServicerContext) -> Iterator[None]:
        with self.apply_lock:
            # A caller that gave up while we waited has moved on (and may have
            # sent a newer request): acting on this one now would be stale.
            # The deadline is checked as well: the caller's cancellation may not have arrived
            # yet, but a caller past its deadline has given up all the same.
            remaining = context.time_remaining()
            if not context.is_active() or (remaining is not None and remaining <= 0):
                context.abort(grpc.StatusCode.CANCELLED, "the caller gave up while the agent was busy")
            yield

    def host(self) -> HostInfo:
        info = local.host_info(self.fs)
        return HostInfo(hostname=info.get("hostname", ""), kernel=info.get("kernel", ""),
                        boot_id=info.get("boot_id", ""), agent_version=self._version,
                        agent_started_unix=self._started)

    @_status_errors
    def GetTopology(self, request: wire.GetTopologyRequest,
                    context: grpc.ServicerContext) -> wire.GetTopologyResponse:
        # With the protected devices: the control plane stores this one as registration's.
        topology = self.protection.report(self.fs, local.discover(self.fs, self.state_dir))
        return wire.topology_response(self.host(), topology, topology.structure_hash())

    @_status_errors
    def GetObserved(self, request: wire.GetObservedRequest,
                    context: grpc.ServicerContext) -> wire.GetObservedResponse:
        observed, topology_hash = local.observed(self.fs, self.state_dir)
        return wire.observed_response(self.host(), observed, topology_hash)

    @_status_errors
    def Plan(self, request: wire.PlanRequest, context: grpc.ServicerContext) -> wire.PlanResponse:
        profiles = wire.plan_request_profiles(request)
        planned = local.plan(self.fs, profiles, self.state_dir, ram_share=self.ram_share)
        return wire.plan_response(self.host(), planned.plan, planned.topology.structure_hash())

    @_status_errors
    def Apply(self, request: wire.ApplyRequest, context: grpc.ServicerContext) -> wire.ApplyResponse:
        call = wire.apply_call(request)
        names = ", ".join(p.metadata.name for p in call.profiles) or "(none)"
        with self._serialised(context):
            log.info("apply %s: profiles %s", call.request_id or "-", names)
            self._refuse_protected_trial(call.profiles)
            # The control plane's share can only tighten this host's own (--stripe-cache-ram-share).
            report = local.converge(self.fs, call.profiles, self.state_dir, call.generations,
                                    ram_share=self.ram_share, asked_share=call.ram_share)
            # Planned again so the control plane records what is in sync now,
            # what audit profiles would change, and what was skipped.
            after = local.plan(self.fs, call.profiles, self.state_dir,
                               ram_share=stripecache.tightest(self.ram_share, call.ram_share))
        if not report.ok:
            log.warning("apply %s failed: %s", call.request_id or "-", report.title)
        return wire.apply_response(
            info=self.host(), ok=report.ok, report=report, plan=after.plan,
            applied_generations=call.generations if report.ok else {},
            request_id=call.request_id, topology_hash=after.topology.structure_hash(),
            observed=planner.observed_of(after.topology),
        )

    def _refuse_protected_trial(self, profiles: Sequence[StorageProfile]) -> None:
        """An experiment's trial values never reach a protected device, whatever the control
        plane asks (its benchmark would be refused too, after the values were written)."""
        overlays = trial_overlays(profiles)
        if not overlays:
            return  # no rediscovery on an ordinary apply
        topology = local.discover(self.fs)
        try:
            self.protection.check(self.fs, topology, matched_devices(overlays, topology), "experiment")
        except ProtectedDeviceError:
            log.warning("refused an experiment's trial values on a protected device")
            raise

    @_status_errors
    def Restore(self, request: wire.RestoreRequest,
                context: grpc.ServicerContext) -> wire.RestoreResponse:
        only = wire.restore_keys(request, self._restorable())
        with self._serialised(context):
            report = local.restore(self.fs, self.state_dir, only)
        return wire.restore_response(self.host(), report.ok, report)

    def _restorable(self) -> Callable[[str], bool]:
        """Whether a Restore may name a device id: a device here now, or one with a recorded
        original (a device that is gone). Looked up once, at the first key."""
        known: set[str] = set()

        def check(device_id: str) -> bool:
            if not known:
                known.update(d.id for d in planner.targets(local.discover(self.fs)))
                known.update(device_id for device_id, _ in journal.load_originals(self.state_dir))
            return device_id in known

        return check

    def WatchBenchmark(self, request: wire.WatchBenchmarkRequest,
                       context: grpc.ServicerContext) -> Iterator[wire.BenchmarkProgressMessage]:
        # Not under _status_errors: a generator's errors surface on iteration.
        try:
            run_id = wire.watch_run_id(request)
        except wire.WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if self.benchmarks.get(run_id) is None:
            # A run from before this process started is only on disk: its stored state ends the watch.
            try:
                self.benchmarks.publish(wire_progress(self._runs_of(run_id).progress(run_id)))
            except UnknownRunError:
                context.abort(grpc.StatusCode.NOT_FOUND, f"no benchmark run {run_id!r} on this agent")
        # Wakes the watch as soon as the client cancels or the server stops.
        context.add_callback(self.benchmarks.wake)
        for progress in self.benchmarks.watch(run_id, context.is_active):
            yield wire.progress_message(progress)

    @_status_errors
    def StartBenchmark(self, request: wire.StartBenchmarkRequest,
                       context: grpc.ServicerContext) -> wire.StartBenchmarkResponse:
        run_id, spec = wire.start_call(request)
        try:
            self.bench.progress(run_id)
        except UnknownRunError:
            log.info("benchmark %s: %s", run_id, spec.metadata.name)
            self.bench.start(spec, run_id)
        # else: a start the control plane repeats (its answer got lost) does not run twice.
        return wire.start_response(self.host(), wire_progress(self.bench.progress(run_id)))

    @_status_errors
    def CancelBenchmark(self, request: wire.CancelBenchmarkRequest,
                        context: grpc.ServicerContext) -> wire.CancelBenchmarkResponse:
        run_id = wire.cancel_run_id(request)
        runs = self._runs_of(run_id)
        cancelled = runs.cancel(run_id)
        return wire.cancel_response(cancelled, wire_progress(runs.progress(run_id)))

    @_status_errors
    def GetBenchmarkResult(self, request: wire.GetBenchmarkResultRequest,
                           context: grpc.ServicerContext) -> wire.GetBenchmarkResultResponse:
        run_id = wire.result_run_id(request)
        progress = self.bench.progress(run_id)
        result = self.bench.result(run_id) if progress.finished else None
        raw: dict[str, str] = {}
        if result is not None:
            where = self.bench.store.dir(run_id)
            for step in result.runs:
                for rel in step.files.values():
                    with contextlib.suppress(OSError, UnicodeDecodeError):
                        raw[rel] = (where / rel).read_text(encoding="utf-8")
        return wire.result_response(wire.BenchmarkOutcome(
            progress=wire_progress(progress), result=result, raw_files=raw, info=self.host()))

    @_status_errors
    def ForgetBenchmark(self, request: wire.ForgetBenchmarkRequest,
                        context: grpc.ServicerContext) -> wire.ForgetBenchmarkResponse:
        run_id = wire.forget_run_id(request)
        try:
            self.bench.forget(run_id)
        except UnknownRunError:
            return wire.forget_response(False)
        return wire.forget_response(True)

    @_status_errors
    def StartProbe(self, request: wire.StartProbeRequest,
                   context: grpc.ServicerContext) -> wire.StartProbeResponse:
        probe_id, device = wire.probe_call(request)
        if not probe_id.startswith("probe-"):
            raise wire.WireError("probe_id: must start with 'probe-'")
        from stortune.agent.probe.members import ProbeDeviceError

        if not self.probes.knows(probe_id):  # a repeated start (a lost answer) does not run twice
            log.info("probe %s: %s", probe_id, device or "every disk")
            try:
                self.probes.start(device, probe_id)
            except ProbeDeviceError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return wire.probe_response(self.host(), wire_progress(self.probes.progress(probe_id)))

    @_status_errors
    def GetProbeResult(self, request: wire.GetProbeResultRequest,
                       context: grpc.ServicerContext) -> wire.GetProbeResultResponse:
        probe_id = wire.probe_result_id(request)
        progress = self.probes.progress(probe_id)
        result = self.probes.result(probe_id) if progress.finished else None
        return wire.probe_result_response(self.host(), wire_progress(progress), result)

    def CollectDiagnostics(self, request: wire.CollectDiagnosticsRequest,
                           context: grpc.ServicerContext) -> Iterator[wire.DiagnosticsChunkMessage]:
        # Not under _status_errors (a generator); collection itself records what failed.
        try:
            timeout = wire.diagnostics_timeout(request)
        except wire.WireError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        # Imported on first use: an idle agent need not hold the collectors and the bundle models.
        from stortune.agent.diagnostics import ToolRunner, collect
        from stortune.schemas.bundle import pack

        tools = ToolRunner(self.tool_path) if timeout is None else ToolRunner(self.tool_path, timeout=timeout)
        try:
            data = pack(collect(self.fs, tools=tools))
        except Exception as exc:
            log.exception("diagnostics collection failed")
            context.abort(grpc.StatusCode.INTERNAL, f"collecting diagnostics failed: {exc}")
        log.info("diagnostics bundle collected (%d bytes)", len(data))
        yield from wire.diagnostics_chunks(data)
