"""Tuning experiments end to end with real processes on 127.0.0.1: stortune-server under uvicorn and
a real agent over gRPC (mutual TLS) on a fixture host whose fio measures a known response surface
(tests/e2e/surface_agent.py), driven with the stortune CLI.

One test walks an experiment's life, each phase starting from the state the previous one left: a
profile enforces read_ahead_kb; an experiment varies it without a drift event or a correction
(Applied=False ExperimentRunning); the server is SIGKILLed mid-experiment and resumes at the next
trial; the agent is SIGKILLed mid-trial, its device stays consistent and the trial is recorded
failed; the experiment ends with the device back at its desired value and enforcement resumed;
its profile applies and diff is in sync; a cancel stops the running trial and puts the device back.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.test_control_plane_e2e import ROOT, Fleet, Proc, eventually, free_port
from tests.e2e.test_control_plane_e2e import fleet as fleet  # noqa: PLC0414 - the fixture, by name

PROFILE = """apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: e2e-tune}
spec:
  hostSelector: {matchLabels: {role: tune}}
  priority: 10
  rules:
    - name: the-loop
      match: {kind: [loop], name: [loop7]}
      settings: {read_ahead_kb: 4096}
"""

EXPERIMENT = """apiVersion: stortune/v1
kind: TuningExperiment
metadata: {name: e2e-readahead}
spec:
  hostSelector: {matchLabels: {role: tune}}
  target: {device: {kind: [loop]}}
  workloads: [{preset: stream-32k, runtime: 1s}]
  objective: {metric: read_bandwidth}
  parameters: [{tunable: read_ahead_kb, values: [0, 128, 1024, 4096, 16384]}]
  repeats: {min: 2, max: 3}
  budget: {trials: 30}
"""


class SurfaceAgent(Proc):
    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=self.log.open("ab"),
                                     cwd=ROOT)


def surface_agent(f: Fleet, root: Path) -> SurfaceAgent:
    return SurfaceAgent([sys.executable, "-m", "tests.e2e.surface_agent", "--root", str(root),
                         "--state", str(f.tmp / "tunehost-state"), "--server", f.url,
                         "--listen", f"127.0.0.1:{free_port()}", "--name", "tunehost", "--label", "role=tune",
                         "--token-file", str(f.state / "agent-bootstrap.token")], f.tmp / "tunehost.log")


def experiment(f: Fleet, exp_id: str) -> dict[str, Any]:
    with f.api() as c:
        r = c.get(f"/api/v1/experiments/{exp_id}")
        r.raise_for_status()
        return dict(r.json())


def trials(f: Fleet, exp_id: str) -> list[dict[str, Any]]:
    return list(experiment(f, exp_id)["status"]["trials"] or [])


def recorded(f: Fleet, exp_id: str) -> int:
    return sum(1 for t in trials(f, exp_id) if t["state"] in ("done", "failed"))


def state(f: Fleet, exp_id: str) -> str:
    return str(experiment(f, exp_id)["status"]["state"])


def fio_log(root: Path) -> list[str]:
    path = root / "control" / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def held_fio(root: Path, experiment: str) -> str | None:
    """The step directory of a trial's fio run that holds (started while ``hold`` said 60) and has
    not ended."""
    lines = fio_log(root)
    held = [line.split()[1] for line in lines if line.startswith("start ") and line.split()[2] == "60"
            and f"/{experiment}-" in line]
    finished = {line.split()[1] for line in lines if line.startswith("end ")}
    return next((s for s in reversed(held) if s not in finished), None)


def run_of(step_dir: str) -> str:
    return Path(step_dir).parents[1].name  # <state>/bench/<run id>/steps/<step>


def started_id(out: str) -> str:
    return out.split(maxsplit=1)[0].removeprefix("tuningexperiment/")


def test_an_experiment_through_server_and_agent_kills_and_cancel(fleet: Fleet, tmp_path: Path) -> None:
    root = tmp_path / "tunehost"
    agent = surface_agent(fleet, root)
    fleet.agents["tunehost"] = agent
    agent.start()
    eventually("the agent registered", lambda: fleet.condition("tunehost", "Reachable"))
    ra = root / "sys" / "block" / "loop7" / "queue" / "read_ahead_kb"
    original = ra.read_text().strip()

    # -- a profile enforces read_ahead_kb ------
    (tmp_path / "profile.yaml").write_text(PROFILE)
    assert fleet.cli("apply", "-f", str(tmp_path / "profile.yaml")).returncode == 0
    eventually("the profile applied", lambda: fleet.converged("tunehost", "e2e-tune"))
    assert ra.read_text().strip() == "4096"

    # -- an experiment varies it: held, no drift ------
    exp_file = tmp_path / "exp.yaml"
    exp_file.write_text(EXPERIMENT)
    (root / "control" / "hold").write_text("0.5")  # each fio run lasts half a second: time to act
    plan = fleet.cli("tune", "run", "-f", str(exp_file), "--dry-run")
    assert plan.returncode == 0 and "device loop7" in plan.stdout, plan.stdout + plan.stderr
    started = fleet.cli("tune", "run", "-f", str(exp_file), "--no-wait")
    assert started.returncode == 0, started.stdout + started.stderr
    exp_id = started_id(started.stdout)
    held = eventually("Applied=False ExperimentRunning", lambda: fleet.is_("tunehost", "Applied", "False"))
    assert held["reason"] == "ExperimentRunning" and exp_id in held["message"]
    eventually("three trials recorded", lambda: recorded(fleet, exp_id) >= 3)

    # -- the server killed mid-experiment: it resumes at the next trial ------
    assert fleet.server is not None
    fleet.server.stop(signal.SIGKILL)
    fleet.server.start()
    eventually("the control plane back", lambda: httpx.get(fleet.url + "/healthz").is_success)
    before = recorded(fleet, exp_id)
    eventually("the experiment going on", lambda: recorded(fleet, exp_id) > before)

    # -- the agent killed mid-trial: the device consistent, the trial failed ------
    (root / "control" / "hold").write_text("60")  # the next trial's fio runs until stopped
    step = eventually("a trial's fio running", lambda: held_fio(root, exp_id))
    killed_run = run_of(step)
    agent.stop(signal.SIGKILL)
    assert int(ra.read_text().strip()) in (0, 128, 1024, 4096, 16384)  # one value, never half a write
    (root / "control" / "hold").write_text("0")
    agent.start()
    eventually("the experiment's end", lambda: state(fleet, exp_id) in ("done", "failed", "cancelled"),
               timeout=180)
    doc = experiment(fleet, exp_id)
    status = doc["status"]
    assert status["state"] == "done", status
    done = status["trials"]
    assert [t["index"] for t in done] == list(range(len(done)))
    killed = next(t for t in done if t["runId"] == killed_run)
    assert killed["state"] == "failed" and killed["message"], killed
    # Nothing ran twice: each trial's benchmark started fio once, across both restarts.
    starts = [run_of(line.split()[1]) for line in fio_log(root) if line.startswith("start ")]
    assert sorted(starts) == sorted(t["runId"] for t in done), (starts, done)
    rec = status["outcome"]["recommendation"]
    assert rec["values"] == {"read_ahead_kb": 1024} and rec["significant"] is True, rec

    # -- afterwards: the desired value back, no drift was reported, enforcement resumed ------
    eventually("the desired value back", lambda: ra.read_text().strip() == "4096")
    eventually("Applied again", lambda: fleet.is_("tunehost", "Applied"))
    assert not [e for e in fleet.events("tunehost") if e["reason"] in ("Drift", "Corrected")]
    ra.write_text("256")
    eventually("drift corrected again", lambda: ra.read_text().strip() == "4096")
    assert [e for e in fleet.events("tunehost") if e["reason"] == "Drift"]

    # -- the recommended profile, committed and applied: diff in sync ------
    with fleet.api() as c:
        assert c.delete("/api/v1/profiles/e2e-tune").status_code in (200, 202)
    eventually("the original back", lambda: ra.read_text().strip() == original)
    recommended = tmp_path / "recommended.yaml"
    assert fleet.cli("tune", "profile", exp_id, "-o", str(recommended)).returncode == 0
    applied = fleet.cli("apply", "-f", str(recommended))
    assert applied.returncode == 0, applied.stdout + applied.stderr
    eventually("the recommendation applied", lambda: ra.read_text().strip() == "1024")
    eventually("in sync", lambda: fleet.cli("diff", "-f", str(recommended)).returncode == 0)

    # -- cancel: the running trial stops, the device back ------
    (root / "control" / "hold").write_text("60")
    second = fleet.cli("tune", "run", "-f", str(exp_file), "--no-wait")
    cancel_id = started_id(second.stdout)
    step = eventually("the second experiment's fio running", lambda: held_fio(root, cancel_id))
    cancelled = fleet.cli("tune", "cancel", cancel_id)
    assert cancelled.returncode == 0 and cancelled.stdout.strip().endswith("cancelled"), cancelled.stdout
    assert f"end {step} cancelled" in fio_log(root)  # the trial's fio was stopped, not left running
    eventually("the recommended value back", lambda: ra.read_text().strip() == "1024")
