"""Tuning experiments through the REST API and the real driver, the agent faked at its one seam
(``SurfaceAgent``: benchmarks measure a known response surface with noise). Every test runs on
SQLite and on PostgreSQL."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.server import RecordingController
from stortune.server.agentclient import FakeAgentClients
from tests.server.builders import API, loop_topology, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, TestClient, admin_client
from tests.server.tunefakes import EXPERIMENTS, SurfaceAgent, experiment_doc

FAST = {"benchmark_interval_s": 0.05, "experiment_interval_s": 0.05, "benchmark_unreachable_timeout_s": 60}


@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


@pytest.fixture
def agent(agents: FakeAgentClients) -> SurfaceAgent:
    found = SurfaceAgent(address=registration("h1")["address"], topology=loop_topology("h1"))
    return agents.add(found)  # type: ignore[return-value]


@pytest.fixture
def server(make_app: AppFactory, agents: FakeAgentClients, agent: SurfaceAgent) -> FastAPI:
    return make_app(agents=agents, controller=RecordingController(), **FAST)


def register(client: TestClient, name: str = "h1", labels: dict[str, str] | None = None) -> None:
    body = registration(name, labels=labels, topology=loop_topology(name))
    assert client.post(f"{API}/agents/register", json=body).status_code == 200


@pytest.fixture
def client(server: FastAPI) -> Iterator[TestClient]:
    with admin_client(server) as test_client:
        register(test_client)
        yield test_client


def submit(client: TestClient, doc: dict[str, Any]) -> str:
    response = client.post(EXPERIMENTS, json=doc)
    assert response.status_code == 201, response.text
    return str(response.json()["metadata"]["uid"])


def experiment(client: TestClient, exp_id: str) -> dict[str, Any]:
    response = client.get(f"{EXPERIMENTS}/{exp_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def ended(client: TestClient, exp_id: str) -> dict[str, Any] | None:
    doc = experiment(client, exp_id)
    return doc if doc["status"]["state"] in ("done", "failed", "cancelled") else None


def test_a_read_ahead_sweep_recommends_the_best_value_and_puts_the_device_back(
        client: TestClient, agent: SurfaceAgent, eventually: Eventually) -> None:
    exp_id = submit(client, experiment_doc())
    doc = eventually(lambda: ended(client, exp_id), timeout=60, what="the experiment's end")
    status = doc["status"]
    assert status["state"] == "done", status
    rec = status["outcome"]["recommendation"]
    assert rec["keepCurrent"] is False and rec["values"]["read_ahead_kb"] >= 128, rec
    assert rec["significant"] is True and rec["gain"]["low"] > 0
    trials = status["trials"]
    assert [t["index"] for t in trials] == list(range(len(trials)))
    assert len({t["runId"] for t in trials}) == len(trials)
    # Each trial measured its own values, and the device holds its original afterwards.
    assert [s["loop0"]["read_ahead_kb"] for s in agent.settings_seen] == [t["point"]["read_ahead_kb"]
                                                                          for t in trials]
    assert agent.read_ahead() == 128
    (host,) = status["hosts"]
    assert host["state"] == "done" and host["baseline"] == {"read_ahead_kb": 128}


def _param(**fields: Any) -> list[dict[str, Any]]:
    return [fields]


BAD_INPUTS: list[tuple[str, dict[str, Any], str]] = [
    ("unknown tunable", experiment_doc(parameters=_param(tunable="read_ahead", values=[0, 128])),
     "spec.parameters[0].tunable"),
    ("value out of range", experiment_doc(values=[0, 1 << 40]), "spec.parameters[0].values[1]"),
    ("scheduler the kernel does not offer",
     experiment_doc(parameters=_param(tunable="scheduler", values=["none", "kyber"])),
     "spec.parameters[0].values[1]"),
    ("empty parameter list", experiment_doc(parameters=[]), "spec.parameters"),
    ("duplicate parameter", experiment_doc(parameters=[{"tunable": "read_ahead_kb", "values": [0, 128]},
                                                       {"tunable": "read_ahead_kb", "values": [256]}]),
     "spec.parameters[1].tunable"),
    ("grid over the server's limit", experiment_doc(parameters=[
        {"tunable": "read_ahead_kb", "values": [0, 128, 1024, 4096]},
        {"tunable": "nr_requests", "values": [32, 64, 128]}], strategy="grid"), "spec.parameters"),
    ("beneath a device with nothing beneath",
     experiment_doc(parameters=_param(tunable="scheduler", at="beneath", values=["none", "mq-deadline"])),
     "spec.parameters[0].at"),
    ("unknown metric", experiment_doc(objective={"metric": "read_speed"}), "spec.objective.metric"),
    ("a string for an integer", experiment_doc(repeats={"min": "2", "max": 3}), "spec.repeats.min"),
    ("no host selector", experiment_doc(hostSelector=None), "spec.hostSelector"),
    ("a selector matching no host", experiment_doc(hostSelector={"matchLabels": {"role": "nobody"}}),
     "spec.hostSelector"),
    ("no such device", experiment_doc(target={"device": {"kind": ["disk"]}}), "spec.target.device"),
    ("NUL in a name", experiment_doc(target={"device": {"kind": ["loop"], "model": "a\x00b"}}),
     "spec.target.device.model"),
]


@pytest.mark.parametrize(("what", "doc", "field"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_every_bad_input_is_a_422_naming_the_field_and_nothing_runs(
        make_app: AppFactory, agents: FakeAgentClients, agent: SurfaceAgent, what: str, doc: dict[str, Any],
        field: str) -> None:
    app = make_app(agents=agents, controller=RecordingController(), experiment_max_grid=8, **FAST)
    doc = copy.deepcopy(doc)
    with admin_client(app) as client:
        register(client)
        if doc["spec"].get("hostSelector") is None:
            doc["spec"].pop("hostSelector")
        for params in ({}, {"dryRun": "All"}):
            response = client.post(EXPERIMENTS, json=doc, params=params)
            assert response.status_code == 422, (what, response.text)
            fields = [c["field"] for c in response.json()["details"]["causes"]]
            assert field in fields, (what, response.json())
        assert client.get(EXPERIMENTS).json()["items"] == []
        assert client.get(f"{API}/benchmarks/runs").json()["items"] == []
    assert not [c for c in agent.calls if c[0] in ("apply", "start_benchmark")]
