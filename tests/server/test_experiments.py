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


def held_agent(agents: FakeAgentClients, name: str = "h1") -> SurfaceAgent:
    """The agent of ``name`` whose benchmark runs stay running until the test finishes them."""
    found = SurfaceAgent(address=registration(name)["address"], topology=loop_topology(name), hold=True)
    return agents.add(found)  # type: ignore[return-value]


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
        make_app: AppFactory, agents: FakeAgentClients, agent: SurfaceAgent, what: str, *,
        doc: dict[str, Any], field: str) -> None:
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


# -- the trial plan -----------------------------------------------------------------------------------
def test_a_dry_run_shows_the_device_and_the_trial_plan_and_stores_nothing(
        client: TestClient, agent: SurfaceAgent) -> None:
    response = client.post(EXPERIMENTS, json=experiment_doc(), params={"dryRun": "All"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["kind"] == "TuningExperimentDryRun"
    (host,) = body["hosts"]
    assert (host["host"], host["device"], host["baseline"]) == ("h1", "loop0", {"read_ahead_kb": 128})
    assert host["parameters"] == [{"key": "read_ahead_kb", "values": [0, 128, 1024, 4096]}]
    first = host["trials"][:2]
    assert [t["purpose"] for t in first] == ["baseline", "baseline"]
    assert {t["point"]["read_ahead_kb"] for t in host["trials"]} == {0, 128, 1024, 4096}
    assert host["estimatedTrials"] >= len({t["point"]["read_ahead_kb"] for t in host["trials"]}) * 2
    assert client.get(EXPERIMENTS).json()["items"] == []
    assert not [c for c in agent.calls if c[0] in ("apply", "start_benchmark")]


# -- holding the host: cancel, restart, the reconciler ------------------------------------------------
def running_trial(client: TestClient, agent: SurfaceAgent, exp_id: str) -> str | None:
    """The run id of the trial running now, once its benchmark has started on the agent."""
    for trial in experiment(client, exp_id)["status"]["trials"] or []:
        run_id = trial["runId"]
        if trial["state"] == "running" and run_id in agent.started and run_id not in agent.outcomes:
            return str(run_id)
    return None


def next_trial(client: TestClient, agent: SurfaceAgent, exp_id: str, eventually: Eventually) -> str:
    run_id: str = eventually(lambda: running_trial(client, agent, exp_id), what="a trial's benchmark running")
    return run_id


def past_the_baseline(client: TestClient, agent: SurfaceAgent, exp_id: str, eventually: Eventually) -> str:
    """Finish the baseline's trials; the run id of the first trial testing other values."""
    while True:
        run_id = next_trial(client, agent, exp_id, eventually)
        trial = next(t for t in experiment(client, exp_id)["status"]["trials"] if t["runId"] == run_id)
        if trial["purpose"] != "baseline":
            return run_id
        agent.finish(run_id)


def test_cancel_stops_the_running_trial_and_puts_the_device_back(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    agent = held_agent(agents)
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        register(client)
        exp_id = submit(client, experiment_doc())
        run_id = past_the_baseline(client, agent, exp_id, eventually)
        assert agent.read_ahead() != 128
        response = client.post(f"{EXPERIMENTS}/{exp_id}/cancel")
        assert response.status_code == 202, response.text
        doc = eventually(lambda: ended(client, exp_id), what="the cancelled experiment's end")
        assert doc["status"]["state"] == "cancelled", doc["status"]
        assert doc["status"]["hosts"][0]["state"] == "cancelled"
        assert ("cancel_benchmark", run_id) in agent.calls
        assert all(agent._latest(r).finished for r in agent.started)  # no benchmark left running
        assert agent.read_ahead() == 128  # the original
        last_apply = [c for c in agent.calls if c[0] == "apply"][-1]
        assert not [p for p in last_apply[1][0] if p.metadata.name.startswith("tune-")]
        trial = next(t for t in doc["status"]["trials"] if t["runId"] == run_id)
        assert trial["state"] == "failed" and "cancelled" in trial["message"]
        # Cancelling again, or a queued experiment: nothing more to do, said so.
        assert client.post(f"{EXPERIMENTS}/{exp_id}/cancel").status_code == 200
        queued = submit(client, experiment_doc(name="later"))
        response = client.delete(f"{EXPERIMENTS}/{queued}")
        assert response.status_code in (200, 202)


def test_a_restarted_server_resumes_at_the_next_trial_with_nothing_lost_or_run_twice(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    agent = held_agent(agents)
    first = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(first) as client:
        register(client)
        exp_id = submit(client, experiment_doc())
        for _ in range(3):
            agent.finish(next_trial(client, agent, exp_id, eventually))
        in_flight = next_trial(client, agent, exp_id, eventually)
    # The server is gone while trial 4 runs; its agent finishes it meanwhile.
    agent.finish(in_flight)
    agent.auto = True
    second = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(second) as client:
        doc = eventually(lambda: ended(client, exp_id), timeout=60, what="the resumed experiment's end")
    status = doc["status"]
    assert status["state"] == "done", status
    trials = status["trials"]
    assert [t["index"] for t in trials] == list(range(len(trials)))
    assert all(t["state"] == "done" for t in trials)
    starts = [c[1][0] for c in agent.calls if c[0] == "start_benchmark"]
    assert sorted(set(starts)) == sorted(t["runId"] for t in trials)
    assert len(agent.settings_seen) == len(trials)  # every run started once on the agent
    assert next(t for t in trials if t["runId"] == in_flight)["measurement"]["ok"] is True
    assert status["outcome"]["recommendation"]["values"]["read_ahead_kb"] >= 128
    assert agent.read_ahead() == 128


def condition(client: TestClient, host: str, kind: str) -> dict[str, Any]:
    conditions = client.get(f"{API}/hosts/{host}").json()["status"]["conditions"]
    return dict(next(c for c in conditions if c["type"] == kind))


def test_the_reconciler_holds_off_an_experiment_s_settings_and_enforces_them_again_afterwards(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    """A profile enforces read_ahead_kb=4096; an experiment varies it: no drift event, no correction,
    Applied=False ExperimentRunning naming the experiment; afterwards drift is corrected again."""
    from tests.server.builders import profile_doc

    agent = held_agent(agents)
    app = make_app(agents=agents, reconcile_interval_s=0.2, **FAST)
    with admin_client(app) as client:
        register(client)
        assert client.post(f"{API}/profiles", json=profile_doc()).status_code == 201
        eventually(lambda: agent.read_ahead() == 4096
                   and condition(client, "h1", "Ready")["status"] == "True", what="the profile enforced")
        exp_id = submit(client, experiment_doc(values=[128, 1024, 4096]))
        run_id = past_the_baseline(client, agent, exp_id, eventually)  # the baseline is 4096
        testing = agent.read_ahead()
        assert testing != 4096
        held = eventually(lambda: (c := condition(client, "h1", "Applied"))["reason"] == "ExperimentRunning"
                          and c, what="Applied=False ExperimentRunning")
        assert held["status"] == "False" and exp_id in held["message"]
        looks = len([c for c in agent.calls if c[0] == "get_observed"])
        eventually(lambda: len([c for c in agent.calls if c[0] == "get_observed"]) >= looks + 2,
                   what="two reconciles while the trial runs")
        agent.finish(run_id)
        assert agent.settings_seen[-1]["loop0"]["read_ahead_kb"] == testing  # not corrected under the trial
        agent.auto = True
        eventually(lambda: ended(client, exp_id), what="the experiment's end")
        events = client.get(f"{API}/events", params={"host": "h1", "limit": 200}).json()["items"]
        assert not [e for e in events if e["reason"] in ("Drift", "Corrected")], events
        reconciler_applies = [c for c in agent.calls if c[0] == "apply" and not c[1][2].startswith(exp_id)]
        assert len(reconciler_applies) == 1  # the profile's own apply; none during the experiment
        assert agent.read_ahead() == 4096
        eventually(lambda: condition(client, "h1", "Applied")["status"] == "True", what="Applied again")
        # Enforcement has resumed: drift by hand is reported and corrected.
        agent._set("loop0", "read_ahead_kb", 256)
        eventually(lambda: agent.read_ahead() == 4096, what="the drift corrected")
        events = client.get(f"{API}/events", params={"host": "h1", "limit": 200}).json()["items"]
        assert [e for e in events if e["reason"] == "Drift" and "observed 256" in e["message"]]


# -- who may, charts and the profile ----------------------------------------------------------------------
def test_viewers_read_operators_run_and_support_tokens_see_only_their_hosts(
        server: FastAPI, client: TestClient, token_for: Any, eventually: Eventually) -> None:
    from tests.server.support import bearer

    register(client, "h2", labels={"role": "archive"})
    exp_id = submit(client, experiment_doc(budget={"trials": 14}))
    viewer, operator = bearer(token_for("viewer")), bearer(token_for("operator"))
    support = bearer(token_for("support", hosts="role=archive", expires_in="1h"))
    assert client.post(EXPERIMENTS, json=experiment_doc(), headers=viewer).status_code == 403
    assert client.post(f"{EXPERIMENTS}/{exp_id}/cancel", headers=viewer).status_code == 403
    assert client.delete(f"{EXPERIMENTS}/{exp_id}", headers=viewer).status_code == 403
    assert client.get(f"{EXPERIMENTS}/{exp_id}", headers=viewer).status_code == 200
    # A support token: the experiment's host is outside its selector, so it does not exist for it.
    assert client.get(f"{EXPERIMENTS}/{exp_id}", headers=support).status_code == 404
    assert client.get(EXPERIMENTS, headers=support).json()["items"] == []
    assert client.get(f"{EXPERIMENTS}/{exp_id}/profile", headers=support).status_code == 404
    assert client.post(EXPERIMENTS, json=experiment_doc(), headers=support).status_code == 403
    eventually(lambda: ended(client, exp_id), what="the first experiment's end")
    created = client.post(EXPERIMENTS, json=experiment_doc(name="by-operator", budget={"trials": 14}),
                          headers=operator)
    assert created.status_code == 201, created.text
    assert created.json()["status"]["createdBy"].startswith("operator")
    assert client.post(f"{EXPERIMENTS}/{created.json()['metadata']['uid']}/cancel",
                       headers=operator).status_code in (200, 202)


def test_charts_in_png_and_svg_and_the_recommended_profile(
        client: TestClient, eventually: Eventually) -> None:
    import yaml

    doc = experiment_doc(parameters=[{"tunable": "read_ahead_kb", "values": [0, 128, 1024]},
                                     {"tunable": "scheduler", "values": ["none", "mq-deadline"]}],
                         strategy="grid", repeats={"min": 2, "max": 2}, budget={"trials": 20})
    exp_id = submit(client, doc)
    eventually(lambda: ended(client, exp_id), timeout=60, what="the grid's end")
    for kind in ("values", "progress", "heatmap"):
        png = client.get(f"{EXPERIMENTS}/{exp_id}/charts/{kind}.png")
        assert png.status_code == 200 and png.content.startswith(b"\x89PNG"), (kind, png.text[:200])
        svg = client.get(f"{EXPERIMENTS}/{exp_id}/charts/{kind}.svg")
        assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
        assert "read_bandwidth" in svg.text, kind
    assert "mq-deadline" in client.get(f"{EXPERIMENTS}/{exp_id}/charts/heatmap.svg").text
    # No fairness constraint: that chart has nothing to show, and says so.
    missing = client.get(f"{EXPERIMENTS}/{exp_id}/charts/fairness.png")
    assert missing.status_code == 409 and "fairness" in missing.json()["message"]
    assert client.get(f"{EXPERIMENTS}/{exp_id}/charts/pie.png").status_code == 404
    assert client.get(f"{EXPERIMENTS}/{exp_id}/charts/values.gif").status_code == 404

    text = client.get(f"{EXPERIMENTS}/{exp_id}/profile")
    assert text.status_code == 200 and text.headers["content-type"].startswith("application/yaml")
    profile = yaml.safe_load(text.text)
    assert profile["kind"] == "StorageProfile"
    settings = profile["spec"]["rules"][0]["settings"]
    assert settings["read_ahead_kb"] == 1024
    assert profile["metadata"]["annotations"]["stortune.io/experiment"] == "ra-sweep"
    assert profile["spec"]["hostSelector"] == {"matchLabels": {"role": "streamer"}}
    assert "name" not in profile["spec"]["rules"][0]["match"]  # a class of devices, not loop0
    as_json = client.get(f"{EXPERIMENTS}/{exp_id}/profile", params={"format": "json"}).json()
    assert as_json == profile
    # The profile is a valid StorageProfile for the API.
    assert client.post(f"{API}/profiles", json=profile, params={"dryRun": "All"}).status_code == 200


def test_a_fleet_runs_one_trial_per_host_in_parallel_and_says_whether_it_holds_everywhere(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    fleet = {name: held_agent(agents, name) for name in ("h1", "h2")}
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        for name in fleet:
            register(client, name)
        exp_id = submit(client, experiment_doc(maxHosts=2))
        # Both hosts run a trial at the same time, one each.
        both = eventually(lambda: all(running_trial(client, a, exp_id) for a in fleet.values()),
                          what="a trial running on each host at once")
        assert both
        for index, agent in enumerate(fleet.values()):
            run_id = running_trial(client, agent, exp_id)
            assert run_id is not None and f"-h{index}-" in run_id  # each host its own trials
            agent.auto = True
            agent.finish(str(run_id))
        doc = eventually(lambda: ended(client, exp_id), timeout=60, what="the fleet experiment's end")
    status = doc["status"]
    assert status["state"] == "done", status
    assert {h["host"]: h["state"] for h in status["hosts"]} == {"h1": "done", "h2": "done"}
    outcome = status["outcome"]
    assert set(outcome["perHost"]) == {"h1", "h2"} and outcome["hosts"] == ["h1", "h2"]
    rec = outcome["recommendation"]
    assert rec["keepCurrent"] is False and rec["values"] == {"read_ahead_kb": 1024}, rec
    assert outcome["holdsEverywhere"] is True
    assert {v["host"] for v in outcome["hostVerdicts"]} == {"h1", "h2"}
    for host, agent in fleet.items():
        assert agent.read_ahead() == 128, host
        assert [t["host"] for t in status["trials"]].count(host) == len(agent.settings_seen)


def test_a_benchmark_and_an_experiment_never_run_at_once_on_a_host(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    from tests.server.benchfakes import streamers

    agent = held_agent(agents)
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        register(client)
        bench = client.post(f"{API}/benchmarks/runs", json=streamers("before")).json()["items"][0]
        bench_id = bench["metadata"]["name"]
        eventually(lambda: bench_id in agent.started, what="the benchmark running")
        exp_id = submit(client, experiment_doc())
        waiting = eventually(lambda: "waiting: benchmark" in (
            h := experiment(client, exp_id)["status"]["hosts"][0])["message"] and h,
            what="the experiment waiting for the benchmark")
        assert waiting["state"] == "queued" and bench_id in waiting["message"]
        assert not [r for r in agent.started if r.startswith(exp_id)]
        agent.finish(bench_id)
        first = next_trial(client, agent, exp_id, eventually)
        # A benchmark asked for meanwhile waits for the experiment's end.
        later = client.post(f"{API}/benchmarks/runs", json=streamers("during")).json()["items"][0]
        later_id = later["metadata"]["name"]
        agent.finish(first)
        agent.auto = True
        eventually(lambda: ended(client, exp_id), what="the experiment's end")
        eventually(lambda: ("start_benchmark", later_id) in [(c[0], c[1][0]) for c in agent.calls
                                                             if c[0] == "start_benchmark"],
                   what="the later benchmark started")
    order = [c[1][0] for c in agent.calls if c[0] == "start_benchmark"]
    trials = [r for r in order if r.startswith(exp_id)]
    assert order.index(later_id) > order.index(trials[-1])  # after the experiment's last trial
    assert order.index(bench_id) < order.index(trials[0])


def test_a_fairness_constraint_keeps_out_the_unfair_optimum_and_is_charted(
        client: TestClient, eventually: Eventually) -> None:
    """1024 is fastest, but its two streams differ by 25% (CV about 35%): with maxCV 10% the
    recommendation is the fastest fair value, and the fairness chart shows each trial's CV."""
    doc = experiment_doc(constraints=[{"fairness": "read_bandwidth", "maxCV": "10%"}])
    exp_id = submit(client, doc)
    status = eventually(lambda: ended(client, exp_id), timeout=60, what="the end")["status"]
    assert status["state"] == "done", status
    rec = status["outcome"]["recommendation"]
    assert rec["values"] == {"read_ahead_kb": 128} or rec["keepCurrent"], rec
    infeasible = [t for t in status["outcome"]["trials"] if not t["feasible"]]
    assert {t["point"]["read_ahead_kb"] for t in infeasible} >= {1024, 4096}
    assert all(t["measurement"]["job_cv"] is not None for t in status["trials"] if t["measurement"]["ok"])
    chart = client.get(f"{EXPERIMENTS}/{exp_id}/charts/fairness.svg")
    assert chart.status_code == 200 and "max CV 10%" in chart.text


def test_hostile_queries_and_paths_are_refused_naming_them(client: TestClient) -> None:
    for params, field in (({"limit": 0}, "limit"), ({"limit": "ten"}, "limit"), ({"state": "lost"}, "state"),
                          ({"name": "x" * 300}, "name"), ({"name": "\x00"}, "name"),
                          ({"name": "a b"}, "name")):
        response = client.get(EXPERIMENTS, params=params)
        assert response.status_code == 422, (params, response.text)
        assert field in response.text
    assert client.get(f"{EXPERIMENTS}/not..an/id").status_code == 404
    assert client.get(f"{EXPERIMENTS}/x1").status_code == 404
    assert client.get(f"{EXPERIMENTS}/x1/charts/{'v' * 40}.png").status_code == 422
    assert client.get(f"{EXPERIMENTS}/x1/profile", params={"format": "xml"}).status_code == 422
    profile = {"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": "p"}}
    for body in ([], "text", profile):
        response = client.post(EXPERIMENTS, json=body)
        assert response.status_code == 422, (body, response.text)
    assert client.get(EXPERIMENTS).json()["items"] == []


def test_a_trial_whose_values_the_agent_refuses_is_recorded_failed_and_the_search_goes_on(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    from stortune.server.agentclient import AgentRejected

    class Refusing(SurfaceAgent):
        async def apply(self, profiles: Any, generations: Any, request_id: str, **kw: Any) -> Any:
            overlay = [p for p in profiles if p.metadata.name.startswith("tune-")]
            if overlay and overlay[0].document()["spec"]["rules"][0]["settings"].get("read_ahead_kb") == 0:
                self.calls.append(("apply", (list(profiles), dict(generations), request_id)))
                raise AgentRejected(self.address, "read_ahead_kb 0 refused by this device",
                                    "FAILED_PRECONDITION")
            return await super().apply(profiles, generations, request_id, **kw)

    agents.add(Refusing(address=registration("h1")["address"], topology=loop_topology("h1")))
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        register(client)
        exp_id = submit(client, experiment_doc())
        status = eventually(lambda: ended(client, exp_id), timeout=60, what="the end")["status"]
    assert status["state"] == "done", status
    trials = status["trials"]
    assert [t["index"] for t in trials] == list(range(len(trials)))
    refused = [t for t in trials if t["point"]["read_ahead_kb"] == 0]
    assert refused and all(t["state"] == "failed" for t in refused)
    assert "the agent refused the trial's values: read_ahead_kb 0 refused" in refused[0]["message"]
    assert status["outcome"]["recommendation"]["values"] == {"read_ahead_kb": 1024}


def test_every_apply_of_an_experiment_carries_the_control_planes_stripe_cache_share(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    # Trials and the put-back hold to the server's share as the reconciler's applies do: an agent
    # whose own share is looser never writes a cache the control plane refuses.
    agent = held_agent(agents)
    app = make_app(agents=agents, controller=RecordingController(), stripe_cache_ram_share=0.01, **FAST)
    with admin_client(app) as client:
        register(client)
        exp_id = submit(client, experiment_doc())
        past_the_baseline(client, agent, exp_id, eventually)
        assert client.post(f"{EXPERIMENTS}/{exp_id}/cancel").status_code == 202
        eventually(lambda: ended(client, exp_id), what="the cancelled experiment's end")
    applies = [c for c in agent.calls if c[0] == "apply"]
    assert len(applies) >= 2 and len(agent.ram_shares) == len(applies)
    assert set(agent.ram_shares) == {0.01}
