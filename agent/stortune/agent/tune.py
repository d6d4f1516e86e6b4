"""``stortune-agent tune``: one tuning experiment on this host, without a control plane.

The same engine as the control plane's (``stortune.schemas.tuning``) asks for trials;
this module runs them here::

    discover -> choose the device -> check the experiment against it
    hold the experiment lock (the daemon and the control plane wait meanwhile)
    per trial: converge(desired + overlay of the trial's values)   journaled, transactional
               benchmark (BenchmarkManager, as `stortune-agent bench`), measure, record
    at the end, whatever ended it: converge(desired) back, or desired + the
               recommended profile when the experiment says applyResult

The trial values are never stored as the desired state, and the experiment lock keeps
its id on disk until the device is back: an experiment killed with SIGKILL is undone by
the next start of any agent command that changes settings (``local.recover``).
SIGINT and SIGTERM stop the running fio and end the experiment the normal way; so does
``spec.budget.duration`` (the deadline, from the moment the lock is taken): the run in flight
is stopped and not measured, nothing is kept (applyResult included), the settings go back.

Only the one-shot CLI imports this (and through it the engine, perhaps Optuna); the
serving agent never does.
"""

from __future__ import annotations

import importlib
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from stortune.agent import journal, local
from stortune.agent.bench.errors import BenchmarkError
from stortune.agent.bench.fio import FioRunner
from stortune.agent.bench.manager import BenchmarkManager
from stortune.agent.kernelfs import KernelFS
from stortune.agent.protection import HostProtection
from stortune.schemas import stripecache
from stortune.schemas.bench.results import BenchmarkResult, RunProgress
from stortune.schemas.bench.target import beneath as devices_beneath
from stortune.schemas.documents import DocumentError
from stortune.schemas.matching import mismatch
from stortune.schemas.profile import StorageProfile
from stortune.schemas.topology import Device, DeviceKind, Topology
from stortune.schemas.tuning.engine import Engine, Progress
from stortune.schemas.tuning.evidence import Outcome, Recommendation
from stortune.schemas.tuning.experiment import (
    BENEATH,
    TuningExperiment,
    baseline_point,
    check_against_device,
    load_experiments,
)
from stortune.schemas.tuning.overlay import other_device, overlay_conflicts, overlay_profile, shared_ids
from stortune.schemas.tuning.recommend import recommended_profile
from stortune.schemas.tuning.space import Measurement, Point, TrialRequest, benchmark_for, failed, measure
from stortune.schemas.tuning.timing import DEADLINE, hold_time, search_elapsed

#: How often the wait for a trial's benchmark looks at the stop flag (seconds).
_POLL = 0.2


class TuneError(local.AgentError):
    """The experiment cannot start here; the message says why and what to do."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Trial(_Model):
    """One trial as it ran here: the engine's measurement and what it cost besides fio."""

    measurement: Measurement
    reason: str
    wall_s: float = Field(description="The whole trial: apply, benchmark, measure")
    fio_s: float = Field(description="fio's runs (process start to exit)")
    overhead_s: float = Field(description="wall_s - fio_s: what stortune adds per trial")


class TuneResult(_Model):
    """What ``stortune-agent tune -o json`` prints."""

    experiment: str
    id: str
    host: str
    device: str
    current: Point = Field(description="The values in effect before: the baseline")
    finished: str = Field(description="done, budget-trials, budget-duration, baseline-failed, interrupted,"
                                      f" {DEADLINE} (the trial running at spec.budget.duration stopped)")
    recommendation: Recommendation
    outcome: Outcome
    trials: list[Trial]
    profile: dict[str, object] = Field(description="The recommended StorageProfile document")
    left: Literal["settings", "recommendation"] = Field(
        description="What the device holds now: its settings from before, or the recommendation"
                    " (applyResult)")
    wall_s: float
    overhead_s: float | None = Field(default=None, description="Mean overhead per trial")


class DryRun(_Model):
    """What ``stortune-agent tune --dry-run -o json`` prints (the figures as the control plane's)."""

    experiment: str
    device: str
    beneath: list[str]
    baseline: Point = Field(description="The values in effect now")
    estimatedTrials: int
    trialSeconds: float
    estimatedSeconds: float
    durationSeconds: float


@dataclass(frozen=True)
class Event:
    """A progress update for the live line: the trial under way and the standing so far."""

    request: TrialRequest
    progress: Progress
    live: RunProgress | None = None  # the running benchmark's latest figures
    done: Trial | None = None  # set once the trial ended


Listener = Callable[[Event], None]


# -- choosing -------------------------------------------------------------------------
def read_experiment(path: str) -> TuningExperiment:
    """The one TuningExperiment in ``path`` (``-`` reads stdin)."""
    source = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TuneError(f"-f {path}: {getattr(exc, 'strerror', None) or exc}") from None
    found = load_experiments(text, source)
    if len(found) != 1:
        names = ", ".join(e.name for e in found)
        raise TuneError(f"-f {path} holds {len(found)} experiments ({names}): give a file with one")
    return found[0]


def choose_device(exp: TuningExperiment, topology: Topology, name: str | None) -> Device:
    """The one device the experiment's ``spec.target.device`` matches (``--device`` picks among several)."""
    match = exp.spec.target.device
    chosen = [d for d in topology.devices if d.kind is not DeviceKind.HOST and mismatch(match, d) is None]
    listed = ", ".join(d.name for d in chosen[:8]) + (" ..." if len(chosen) > 8 else "")
    if name is not None:
        wanted = name.removeprefix("/dev/")
        picked = [d for d in chosen if d.name == wanted]
        if not picked:
            known = topology.device(wanted) is not None
            raise TuneError(f"--device {name}: " + (
                f"spec.target.device does not match it (it matches {listed or 'nothing here'})"
                if known else "no such block device on this host (stortune-agent topology lists them)"))
        return picked[0]
    if not chosen:
        raise TuneError(f"spec.target.device matches none of the {len(topology.devices)} devices on this"
                        " host (stortune-agent topology lists them)")
    if len(chosen) > 1:
        raise TuneError(f"spec.target.device matches {len(chosen)} devices ({listed}): choose one with"
                        " --device NAME")
    return chosen[0]


def beneath_of(topology: Topology, device: Device) -> list[Device]:
    """The devices under ``device`` (md members, multipath paths, LVM PVs, a partition's disk)."""
    out = []
    for b in devices_beneath(topology, device.name)[1:]:
        dev = topology.device(b.device)
        if dev is not None:
            out.append(dev)
    return out


@dataclass(frozen=True)
class Here:
    """The experiment checked against this host, before anything is written."""

    device: Device
    beneath: list[Device]
    current: Point  # the baseline
    desired: local.DesiredState | None

    def engine(self, exp: TuningExperiment) -> Engine:
        # The stripe cache costs its size in pages on every member disk (a memory constraint).
        members = len(self.device.md.members) if self.device.md is not None else 1
        return Engine(exp.spec, self.current, seed=exp.spec.seed, members=members)


def check_here(fs: KernelFS, state_dir: Path, exp: TuningExperiment, device: str | None,
               protection: HostProtection) -> Here:
    """Every refusal the experiment meets on this host, reading only (the run and the dry run)."""
    topology = local.discover(fs, state_dir)
    chosen = choose_device(exp, topology, device)
    beneath = beneath_of(topology, chosen)
    # Before any trial value is written: the host's own disks take no experiment.
    protection.check(fs, topology, [chosen.name, *(d.name for d in beneath)], "experiment")
    shared = shared_ids(topology, [chosen, *beneath])
    if shared:  # the overlay names devices by stable id: one id must be one device
        raise TuneError(f"the trial's values would reach other devices too: {'; '.join(shared)}:"
                        " detach the duplicate, or choose another device")
    problems = check_against_device(exp, chosen, beneath, where=exp.name)
    if problems:
        raise DocumentError(problems)
    try:
        current = baseline_point(exp, chosen, beneath)
    except ValueError as exc:
        raise TuneError(f"no baseline: {exc}") from None
    desired = local.saved_desired(state_dir)
    clash = overlay_conflicts(overlay_profile(exp.name, current, chosen, beneath),
                              desired.profiles if desired else [])
    if clash:
        raise TuneError(f"desired profile(s) {', '.join(clash)} have the highest priority and would"
                        " win over the experiment's values: lower their priority first")
    return Here(chosen, beneath, current, desired)


def dry_run(fs: KernelFS, state_dir: Path, exp: TuningExperiment, device: str | None,
            protection: HostProtection) -> DryRun:
    """What ``tune --dry-run`` shows: the run's checks and the control plane's dry-run figures."""
    if exp.spec.strategy == "bayesian":
        _search_library(exp.name)
    here = check_here(fs, state_dir, exp, device, protection)
    estimate = here.engine(exp).progress().total_estimate
    return DryRun(experiment=exp.name, device=here.device.name, beneath=[d.name for d in here.beneath],
                  baseline=here.current, estimatedTrials=estimate, **asdict(hold_time(exp.spec, estimate)))


# -- running --------------------------------------------------------------------------
def _search_library(name: str) -> None:
    """Before anything is touched: the bayesian search's library is the `tune` extra
    (pyproject.toml), which a lean agent install leaves out."""
    try:
        importlib.import_module("optuna")
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "optuna":
            raise
        raise TuneError(f"{name}: strategy bayesian needs optuna, which is not installed here;"
                        " pip install 'stortune[tune]', or use strategy grid or one-at-a-time") from None


class LocalExperiment:
    """Runs one experiment on this host; ``run()`` returns the result (also when stopped)."""

    def __init__(self, fs: KernelFS, state_dir: Path, exp: TuningExperiment, *,
                 device: str | None = None, runner: FioRunner | None = None,
                 listener: Listener | None = None, stop: threading.Event | None = None,
                 apply_wait: float = 60.0,
                 ram_share: float = stripecache.DEFAULT_RAM_SHARE,
                 protection: HostProtection | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if exp.spec.strategy == "bayesian":
            _search_library(exp.name)
        self.fs = fs
        #: A stripe_cache_size (a trial's too) costing more of the host's RAM is refused.
        self.ram_share = ram_share
        self.state_dir = state_dir
        self.exp = exp
        self.stop = stop or threading.Event()
        self.listener = listener
        self.apply_wait = apply_wait
        #: Seconds, for spec.budget.duration (a seam: tests pass a clock they move).
        self.clock = clock
        self._deadline = float("inf")  # set when run() takes the host
        self._late = False  # the deadline cut it: a trial left to run, or one stopped under way
        self.host = local.host_info(fs).get("hostname", "") or "localhost"
        # Made first: it concludes runs a killed experiment left and kills their fio.
        protection = protection or HostProtection()
        self.bench = BenchmarkManager(fs, state_dir, runner=runner, on_progress=self._live,
                                      apply_wait=apply_wait, protection=protection)
        self.recovered = local.recover(fs, state_dir, ram_share=ram_share)
        here = check_here(fs, state_dir, exp, device, protection)
        self.device, self.beneath, self.current = here.device, here.beneath, here.current
        desired = here.desired
        self.desired: list[StorageProfile] = desired.profiles if desired else []
        self.generations = desired.generations if desired else {}
        self.remembered = desired is not None
        #: The control plane's share stored with them: trials and the put-back hold to it too.
        self.asked_share = desired.ram_share if desired else None
        self.id = f"{exp.name[:100].rstrip('.-')}-{secrets.token_hex(3)}"
        self.engine = here.engine(exp)
        self.trials: list[Trial] = []
        self._request: TrialRequest | None = None
        self._progress: Progress | None = None  # the standing, computed once per trial

    # -- the loop --------------------------------------------------------------------
    def run(self) -> TuneResult:
        started, taken = time.monotonic(), self.clock()
        failure: Exception | None = None
        with journal.hold_experiment(self.state_dir, self.id, apply_timeout=self.apply_wait):
            self._deadline = taken + self.exp.spec.budget.duration
            try:
                while not self.stop.is_set():
                    # Judged with the closing runs reserved, so that they end before the deadline.
                    request = self.engine.next(elapsed_s=search_elapsed(
                        self.exp.spec, self.clock() - taken, len(self.engine.measurements)))
                    if request is None:
                        break
                    if self._past_deadline():  # no trial starts past it
                        self._late = True
                        break
                    trial = self._trial(request)
                    if trial is None:  # stopped under way: not a measurement of the point
                        self._late = not self.stop.is_set() and self._past_deadline()
                        break
                    self.engine.record(trial.measurement)
                    self.trials.append(trial)
                    self._tell(request, done=trial)
            except Exception as exc:
                failure = exc  # raised once the settings are back and the lock is released
            finally:
                # If this fails, the experiment stays recorded and the next start retries it.
                left = self._end()
        if failure is not None:
            raise failure
        finished = DEADLINE if self._late else self.engine.finished_reason or "interrupted"
        outcome = self.engine.outcome()
        try:
            profile = recommended_profile(self.exp, outcome, self.device, beneath=self.beneath)
        except ValueError as exc:  # no device beneath takes a recommended setting: say so, no traceback
            raise TuneError(f"the recommended profile cannot be written: {exc}") from None
        overheads = [t.overhead_s for t in self.trials]
        return TuneResult(
            experiment=self.exp.name, id=self.id, host=self.host, device=self.device.name,
            current=self.current, finished=finished, recommendation=outcome.recommendation,
            outcome=outcome, trials=self.trials, profile=profile.document(), left=left,
            wall_s=round(time.monotonic() - started, 3),
            overhead_s=round(sum(overheads) / len(overheads), 3) if overheads else None)

    def _trial(self, request: TrialRequest) -> Trial | None:
        began = time.monotonic()
        self._request = request
        self._tell(request)
        overlay = overlay_profile(self.exp.name, request.point, self.device, self.beneath)
        run_id = f"{self.id}-t{request.index}"
        try:
            report = local.converge(self.fs, self.desired, self.state_dir, overlay=[overlay],
                                    ram_share=self.ram_share, asked_share=self.asked_share,
                                    remember=False)
            # A trial value the device refuses is not in place: measuring would credit it wrongly.
            refused = [r for r in report.rejected if r.profile == overlay.metadata.name]
            if not report.ok or refused:
                why = "; ".join([f"{r.tunable}={r.after}: {r.message}" for r in refused]
                                or report.messages) or report.title
                return self._done(request, failed(request, f"applying the values failed: {why}",
                                                  self.host), began, None)
            self.bench.start(benchmark_for(self.exp, f"{self.exp.name}-t{request.index}"), run_id)
        except BenchmarkError as exc:  # the device went away, fio is gone ...: a failed trial
            return self._done(request, failed(request, str(exc), self.host, run_id), began, None)
        while not self.bench.wait(run_id, timeout=_POLL).finished:
            if self.stop.is_set() or self._past_deadline():
                self.bench.cancel(run_id)
        result = self.bench.result(run_id)
        if result is None or (result.state == "cancelled" and (self.stop.is_set() or self._past_deadline())):
            self._forget(run_id)
            return None
        read = result.context.target.device_id if result.context is not None else self.device.id
        if moved := other_device(self.device, read):  # one evidence set must not mix two devices
            self._forget(run_id)
            raise TuneError(f"{moved}; the experiment stopped, its settings are back")
        measured = measure(result, self.exp, request, self.host)
        self._forget(run_id)
        return self._done(request, measured, began, result)

    def _past_deadline(self) -> bool:
        return self.clock() >= self._deadline

    def _done(self, request: TrialRequest, m: Measurement, began: float,
              result: BenchmarkResult | None) -> Trial:
        wall = time.monotonic() - began
        fio = sum(max(0.0, r.finished_at - r.started_at) for r in result.runs
                  if r.started_at is not None and r.finished_at is not None) if result else 0.0
        return Trial(measurement=m, reason=request.reason, wall_s=round(wall, 3), fio_s=round(fio, 3),
                     overhead_s=round(max(0.0, wall - fio), 3))

    def _forget(self, run_id: str) -> None:
        # Its figures live on in the measurement; the run's files would pile up trial after trial.
        self.bench.forget(run_id)

    def _end(self) -> Literal["settings", "recommendation"]:
        """Back to the desired state (or to it plus the recommendation, with applyResult)."""
        self.bench.close()  # no fio outlives the experiment
        # None: cut (a signal, the deadline) before the winner was confirmed: nothing is kept.
        keep = self.exp.spec.applyResult and self.engine.finished_reason not in (None, "baseline-failed")
        if keep:
            outcome = self.engine.outcome()
            if not outcome.recommendation.keepCurrent:
                winner = recommended_profile(self.exp, outcome, self.device, beneath=self.beneath)
                report = local.converge(self.fs, [*self.desired, winner], self.state_dir, self.generations,
                                        ram_share=self.ram_share, asked_share=self.asked_share)
                if report.ok:
                    return "recommendation"
        report = local.converge(self.fs, self.desired, self.state_dir, self.generations,
                                ram_share=self.ram_share, asked_share=self.asked_share,
                                remember=self.remembered)
        if not report.ok:
            raise TuneError(f"putting the settings back failed: {'; '.join(report.messages) or report.title}"
                            f" (the experiment lock stays; `stortune-agent restore` or the next start"
                            f" tries again)")
        return "settings"

    # -- progress --------------------------------------------------------------------
    def _tell(self, request: TrialRequest, *, done: Trial | None = None) -> None:
        if self.listener is not None:
            self._progress = self.engine.progress()
            self.listener(Event(request, self._progress, done=done))

    def _live(self, live: RunProgress) -> None:
        """The running benchmark's figures (about once a second), with the standing as it was."""
        request, progress = self._request, self._progress
        if self.listener is not None and request is not None and progress is not None \
                and not live.finished:
            self.listener(Event(request, progress, live=live))


def describe_point(point: Point) -> str:
    return " ".join(f"{k.replace(BENEATH, '(beneath)')}={v}" for k, v in point.items())
