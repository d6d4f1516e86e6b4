"""stortune tune against the real control plane (uvicorn on 127.0.0.1) whose agent is the fake seam
measuring a known surface: run with live progress and a summary, a bad file refused naming the field
with nothing sent, dry run, list, show, plot, profile to a file and applied (diff then in sync), cancel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from stortune.server import RecordingController, Settings, create_app
from stortune.server.agentclient import FakeAgentClients
from tests.cli.conftest import ControlPlane, Run, serve
from tests.server.builders import loop_topology
from tests.server.tunefakes import SurfaceAgent, experiment_doc

ADDRESS = "127.0.0.1:9"  # what ControlPlane.register advertises


@pytest.fixture
def agent() -> SurfaceAgent:
    # Each trial stays in flight a moment: the live view's lines are asserted on.
    return SurfaceAgent(address=ADDRESS, topology=loop_topology("web-1"), running_s=0.2)


@pytest.fixture
def control_plane(tmp_path: Path, agent: SurfaceAgent) -> Iterator[ControlPlane]:
    agents = FakeAgentClients()
    agents.add(agent)
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'control-plane.db'}", benchmark_interval_s=0.05,
                              experiment_interval_s=0.05), controller=RecordingController(), agents=agents)
    yield from serve(app)


@pytest.fixture
def fleet(control_plane: ControlPlane) -> ControlPlane:
    control_plane.register("web-1", {"role": "streamer"}, devices=list(loop_topology("web-1").devices))
    return control_plane


def exp_file(tmp_path: Path, **spec: object) -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment_doc(**spec)))  # type: ignore[arg-type]
    return path


def experiments(plane: ControlPlane) -> list[dict[str, object]]:
    with plane.http() as http:
        return list(http.get("/experiments").json()["items"])


def test_a_bad_experiment_file_is_refused_naming_the_field_and_nothing_is_sent(
        fleet: ControlPlane, stortune: Run, tmp_path: Path) -> None:
    bad = exp_file(tmp_path, parameters=[{"tunable": "read_ahead", "values": [0, 128]}])
    result = stortune("tune", "run", "-f", str(bad))
    assert result.code == 1
    assert "spec.parameters[0].tunable" in result.err and "unknown tunable" in result.err
    assert "Traceback" not in result.err
    # Refused by the server (the kernel offers no kyber here): the field too, and nothing runs.
    offered = exp_file(tmp_path, parameters=[{"tunable": "scheduler", "values": ["none", "kyber"]}])
    result = stortune("tune", "run", "-f", str(offered))
    assert result.code == 1 and "spec.parameters[0].values[1]" in result.err, result.err
    assert experiments(fleet) == []
    assert stortune("tune", "plot", "x1", "-o", str(tmp_path / "chart.gif")).code == 1


def test_hostile_a_runtime_of_a_million_hours_is_refused_and_the_dry_run_says_how_long_a_host_is_held(
        fleet: ControlPlane, stortune: Run, tmp_path: Path) -> None:
    endless = exp_file(tmp_path, workloads=[{"preset": "stream-32k", "runtime": "1000000h"}],
                       budget={"trials": 10_000})
    for extra in ((), ("--dry-run",)):
        result = stortune("tune", "run", "-f", str(endless), *extra)
        assert result.code == 1 and "spec.workloads[0].runtime" in result.err, result.err
        assert "longer than a day" in result.err
    assert experiments(fleet) == []
    bounded = exp_file(tmp_path, budget={"trials": 30, "duration": "10m"})
    plan = stortune("tune", "run", "-f", str(bounded), "--dry-run")
    assert plan.code == 0, plan.err
    (line,) = [x for x in plan.out.splitlines() if x.strip().startswith("time: about")]
    assert "(1s a trial)" in line and "given back within 10m (spec.budget.duration)" in line, line
    assert experiments(fleet) == []


def test_run_follows_the_experiment_and_hands_back_a_profile_that_applies_in_sync(
        fleet: ControlPlane, stortune: Run, tmp_path: Path, agent: SurfaceAgent) -> None:
    path = exp_file(tmp_path)
    plan = stortune("tune", "run", "-f", str(path), "--dry-run")
    assert plan.code == 0, plan.err
    assert "host/web-1: device loop0" in plan.out
    assert "baseline (the values in effect now): read_ahead_kb=128" in plan.out
    assert experiments(fleet) == []

    result = stortune("tune", "run", "-f", str(path), "--poll", "0.05")
    assert result.code == 0, result.out + result.err
    lines = result.out.splitlines()
    exp_id = lines[0].split()[0].removeprefix("tuningexperiment/")
    assert lines[0].endswith("queued on web-1")
    progress = [line for line in lines if line.startswith("web-1: trial ")]
    assert progress and "of ~" in progress[0]
    assert any("testing read_ahead_kb=" in line for line in progress)
    assert any("leader read_ahead_kb=" in line and "vs runner-up" in line for line in progress)
    assert "recommendation: read_ahead_kb=1024" in result.out
    assert "gain in read_bandwidth: +" in result.out and "significant" in result.out

    listed = stortune("tune", "list")
    assert listed.code == 0 and exp_id in listed.out and "done" in listed.out
    shown = stortune("tune", "show", exp_id)
    assert shown.code == 0 and "baseline-end" in shown.out and "read_ahead_kb=0" in shown.out
    as_json = json.loads(stortune("tune", "show", exp_id, "-o", "json").out)
    assert as_json["status"]["outcome"]["recommendation"]["keepCurrent"] is False

    chart = tmp_path / "values.svg"
    plotted = stortune("tune", "plot", exp_id, "-o", str(chart))
    assert plotted.code == 0 and "read_ahead_kb" in chart.read_text()
    assert stortune("tune", "plot", exp_id, "-o", str(tmp_path / "p.png"), "--kind", "progress").code == 0

    profile = tmp_path / "profile.yaml"
    kept = stortune("tune", "profile", exp_id, "-o", str(profile), "--apply")
    assert kept.code == 0, kept.err
    assert "storageprofile/ra-sweep created" in kept.out
    document = yaml.safe_load(profile.read_text())
    assert document["spec"]["rules"][0]["settings"] == {"read_ahead_kb": 1024}
    assert document["metadata"]["annotations"]["stortune.io/experiment"] == "ra-sweep"
    # The server holds exactly the file (no reconciler here applies it: the host change is pending).
    diff = stortune("diff", "-f", str(profile))
    assert "0 profile difference(s), 1 pending host change(s)" in diff.out, diff.out
    printed = stortune("tune", "profile", exp_id)
    assert yaml.safe_load(printed.out) == document


def test_run_with_json_output_keeps_stdout_for_the_document(
        fleet: ControlPlane, stortune: Run, tmp_path: Path) -> None:
    result = stortune("tune", "run", "-f", str(exp_file(tmp_path)), "-o", "json", "--poll", "0.05")
    assert result.code == 0, result.err
    document = json.loads(result.out)
    rec = document["status"]["outcome"]["recommendation"]
    assert rec["values"] == {"read_ahead_kb": 1024} and rec["keepCurrent"] is False
    assert {"pct", "low", "high"} <= set(rec["gain"])
    assert "queued on web-1" in result.err and "web-1: trial" in result.err


def test_cancel_from_the_command_line(fleet: ControlPlane, stortune: Run, tmp_path: Path,
                                      agent: SurfaceAgent) -> None:
    agent.auto = False  # the first trial's benchmark stays running
    started = stortune("tune", "run", "-f", str(exp_file(tmp_path)), "--no-wait")
    assert started.code == 0, started.err
    exp_id = started.out.split()[0].removeprefix("tuningexperiment/")
    cancelled = stortune("tune", "cancel", exp_id, "--poll", "0.05")
    assert cancelled.code == 0, cancelled.err
    assert cancelled.out.strip() == f"tuningexperiment/{exp_id} cancelled"
    assert agent.read_ahead() == 128
