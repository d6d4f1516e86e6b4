"""An experiment's result profile and its time bound through the REST API and the real driver
(issue 26, points 3 and 5): applyResult never replaces a profile unasked, neither at submission
nor when it writes hours later, and writes as the experiment's creator; a document with no
time bound is refused, and at budget.duration the host is given back, mid-trial if need be.
Every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from stortune.server import RecordingController
from stortune.server.agentclient import FakeAgentClients
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client, bearer
from tests.server.test_experiments import FAST, ended, register
from tests.server.tunefakes import EXPERIMENTS, SurfaceAgent, experiment_doc

#: The victim of the issue: hand-written, at priority 10, selecting no registered host.
VICTIM = profile_doc("atk-victim", selector={"matchLabels": {"role": "nobody"}}, priority=10,
                     settings={"scheduler": "mq-deadline", "nr_requests": 64})


@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


def _agent(agents: FakeAgentClients, *, hold: bool = False) -> SurfaceAgent:
    found = SurfaceAgent(address=registration("h1")["address"], topology=loop_topology("h1"), hold=hold)
    return agents.add(found)  # type: ignore[return-value]


def _app(make_app: AppFactory, agents: FakeAgentClients) -> FastAPI:
    return make_app(agents=agents, controller=RecordingController(), **FAST)


def _profile(client: TestClient, name: str) -> dict[str, Any]:
    response = client.get(f"{API}/profiles/{name}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def _rules(profile: dict[str, Any]) -> list[dict[str, Any]]:
    return list(profile["spec"]["rules"])


# -- point 3: the result profile ------------------------------------------------------------------
def test_hostile_an_experiment_named_like_a_profile_is_a_409_and_the_profile_is_untouched(
        make_app: AppFactory, agents: FakeAgentClients) -> None:
    agent = _agent(agents)
    with admin_client(_app(make_app, agents)) as client:
        register(client)
        assert client.post(f"{API}/profiles", json=VICTIM).status_code == 201
        before = _profile(client, "atk-victim")
        version = before["metadata"]["resourceVersion"]
        doc = experiment_doc("atk-victim", applyResult=True)
        for params in ({}, {"dryRun": "All"}):
            response = client.post(EXPERIMENTS, json=doc, params=params)
            assert response.status_code == 409, response.text
            body = response.json()
            assert [c["field"] for c in body["details"]["causes"]] == ["spec.result.name"]
            assert "spec.result.name" in body["message"]
            assert f'resourceVersion: "{version}"' in body["message"]
        # Replacing knowingly, with a stale resourceVersion: 409 too.
        stale = experiment_doc("atk-victim", applyResult=True,
                               result={"replace": True, "resourceVersion": str(int(version) - 1)})
        response = client.post(EXPERIMENTS, json=stale)
        assert response.status_code == 409, response.text
        assert [c["field"] for c in response.json()["details"]["causes"]] == ["spec.result.resourceVersion"]
        assert client.get(EXPERIMENTS).json()["items"] == []
        assert _profile(client, "atk-victim") == before
        # Without applyResult the name is free: nothing would be written.
        assert client.post(EXPERIMENTS, json=experiment_doc("atk-victim"),
                           params={"dryRun": "All"}).status_code == 200
    assert not [c for c in agent.calls if c[0] in ("apply", "start_benchmark")]


def test_hostile_a_profile_made_under_the_result_name_while_the_experiment_runs_is_not_overwritten(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    agent = _agent(agents, hold=True)
    with admin_client(_app(make_app, agents)) as client:
        register(client)
        response = client.post(EXPERIMENTS, json=experiment_doc("ra-sweep", applyResult=True,
                                                                 result={"name": "atk-victim"}))
        assert response.status_code == 201, response.text
        exp_id = response.json()["metadata"]["uid"]
        eventually(lambda: agent.started, what="the first trial running")
        assert client.post(f"{API}/profiles", json=VICTIM).status_code == 201
        before = _profile(client, "atk-victim")
        agent.auto = True
        for run_id in list(agent.started):
            agent.finish(run_id)
        doc = eventually(lambda: ended(client, exp_id), timeout=60, what="the experiment's end")
        assert _profile(client, "atk-victim") == before  # generation, rules and priority as written
        status = doc["status"]
        assert status["state"] == "done", status
        assert status["outcome"]["recommendation"]["significant"] is True  # there was a winner to store
        assert "the recommended profile atk-victim was not stored" in status["reason"], status["reason"]
        assert "exists" in status["reason"]
        reasons = [e["reason"] for e in client.get(f"{API}/events", params={"limit": 1000}).json()["items"]]
        assert "ResultNotStored" in reasons and "ResultStored" not in reasons
        refused = client.get(f"{API}/audit", params={"resource": "profiles/atk-victim"}).json()["items"]
        assert next((r["method"], r["code"], r["client"]) for r in refused) == (
            "PUT", 409, f"experiment {exp_id}")


def test_the_result_is_written_as_the_experiment_s_creator_and_replaces_only_the_version_named(
        make_app: AppFactory, agents: FakeAgentClients, token_for: Any, eventually: Eventually) -> None:
    _agent(agents)
    app = _app(make_app, agents)
    operator = bearer(token_for("operator", name="tuner"))
    with admin_client(app) as client:
        register(client)
        assert client.post(f"{API}/profiles", json=VICTIM).status_code == 201
        version = _profile(client, "atk-victim")["metadata"]["resourceVersion"]
        doc = experiment_doc("atk-victim", applyResult=True,
                             result={"replace": True, "resourceVersion": version})
        response = client.post(EXPERIMENTS, json=doc, headers=operator)
        assert response.status_code == 201, response.text
        exp_id = response.json()["metadata"]["uid"]
        status = eventually(lambda: ended(client, exp_id), timeout=60, what="the end")["status"]
        assert status["state"] == "done" and "not stored" not in status["reason"], status
        stored = _profile(client, "atk-victim")
        assert stored["metadata"]["generation"] == 2
        assert stored["metadata"]["annotations"]["stortune.dev/experiment-id"] == exp_id
        assert _rules(stored)[0]["settings"] == {"read_ahead_kb": 1024}
        records = client.get(f"{API}/audit", params={"resource": "profiles/atk-victim"}).json()["items"]
        written = [r for r in records if r["client"] == f"experiment {exp_id}"]
        assert [(r["tokenName"], r["role"], r["method"], r["code"]) for r in written] == [
            ("tuner", "operator", "PUT", 200)]
        submitted = [r for r in client.get(f"{API}/audit", params={"resource": "experiments"}).json()["items"]
                     if r["method"] == "POST" and r["code"] == 201]
        assert written[0]["tokenId"] == submitted[0]["tokenId"]


def test_hostile_a_creator_revoked_while_the_experiment_ran_writes_nothing(
        make_app: AppFactory, agents: FakeAgentClients, token_for: Any, eventually: Eventually) -> None:
    agent = _agent(agents, hold=True)
    app = _app(make_app, agents)
    operator = bearer(token_for("operator", name="leaver"))
    with admin_client(app) as client:
        register(client)
        response = client.post(EXPERIMENTS, json=experiment_doc(applyResult=True), headers=operator)
        assert response.status_code == 201, response.text
        exp_id = response.json()["metadata"]["uid"]
        token_id = response.json()["status"]["createdBy"].rsplit("(token ", 1)[1].rstrip(")")
        eventually(lambda: agent.started, what="the first trial running")
        assert client.delete(f"{API}/tokens/{token_id}").status_code == 200
        agent.auto = True
        for run_id in list(agent.started):
            agent.finish(run_id)
        status = eventually(lambda: ended(client, exp_id), timeout=60, what="the end")["status"]
        assert status["outcome"]["recommendation"]["significant"] is True
        assert "was not stored" in status["reason"] and "revoked" in status["reason"], status["reason"]
        assert client.get(f"{API}/profiles/ra-sweep").status_code == 404
        records = client.get(f"{API}/audit", params={"resource": "profiles/ra-sweep"}).json()["items"]
        # Refused as the creator, never written. (Once in about a dozen PostgreSQL runs the host's
        # end runs twice and the refusal is audited twice: noted in issue 26's closing note.)
        assert records and {(r["tokenId"], r["code"]) for r in records} == {(token_id, 403)}


def test_a_fleet_stores_its_result_once_and_each_host_may_rewrite_its_own(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    """The second host to end finds the profile the first stored: the experiment's own, rewritten,
    not a profile made meanwhile."""
    for name in ("h1", "h2"):
        agents.add(SurfaceAgent(address=registration(name)["address"], topology=loop_topology(name)))
    with admin_client(_app(make_app, agents)) as client:
        for name in ("h1", "h2"):
            body = registration(name, topology=loop_topology(name))
            assert client.post(f"{API}/agents/register", json=body).status_code == 200
        response = client.post(EXPERIMENTS, json=experiment_doc(maxHosts=2, applyResult=True))
        assert response.status_code == 201, response.text
        exp_id = response.json()["metadata"]["uid"]
        status = eventually(lambda: ended(client, exp_id), timeout=90, what="the fleet's end")["status"]
        assert status["state"] == "done" and "not stored" not in status["reason"], status["reason"]
        assert status["outcome"]["holdsEverywhere"] is True
        stored = _profile(client, "ra-sweep")
        assert stored["metadata"]["annotations"]["stortune.dev/experiment-id"] == exp_id
        reasons = [e["reason"] for e in client.get(f"{API}/events", params={"limit": 1000}).json()["items"]]
        assert "ResultNotStored" not in reasons and "ResultStored" in reasons


# -- point 5: time bounds -------------------------------------------------------------------------
def test_hostile_64_workloads_of_a_million_hours_and_10000_trials_are_a_422_naming_the_runtime(
        make_app: AppFactory, agents: FakeAgentClients) -> None:
    agent = _agent(agents)
    workloads = [{"preset": "stream-32k", "name": f"w{i}", "runtime": "1000000h"} for i in range(64)]
    doc = experiment_doc(workloads=workloads, budget={"trials": 10_000})
    with admin_client(_app(make_app, agents)) as client:
        register(client)
        for params in ({}, {"dryRun": "All"}):
            response = client.post(EXPERIMENTS, json=doc, params=params)
            assert response.status_code == 422, response.text
            causes = response.json()["details"]["causes"]
            assert causes[0]["field"] == "spec.workloads[0].runtime" and "a day" in causes[0]["message"]
        assert client.get(EXPERIMENTS).json()["items"] == []
    assert not [c for c in agent.calls if c[0] in ("apply", "start_benchmark")]


def test_the_dry_run_shows_how_long_the_host_is_held(make_app: AppFactory, agents: FakeAgentClients) -> None:
    _agent(agents)
    with admin_client(_app(make_app, agents)) as client:
        register(client)
        response = client.post(EXPERIMENTS, json=experiment_doc(budget={"trials": 30, "duration": "10m"}),
                               params={"dryRun": "All"})
        assert response.status_code == 200, response.text
        (host,) = response.json()["hosts"]
    assert host["trialSeconds"] == 1.0  # stream-32k at runtime 1s
    assert host["estimatedSeconds"] == host["estimatedTrials"] * 1.0
    assert host["durationSeconds"] == 600


@pytest.mark.parametrize("in_flight", ["trial", "apply"])
def test_at_the_deadline_the_trial_is_stopped_and_the_host_given_back(
        make_app: AppFactory, agents: FakeAgentClients, clock: FakeClock, eventually: Eventually,
        in_flight: str) -> None:
    """budget.duration 10m; the agent never finishes a run (or answers every Apply of the trial's
    values with busy): when the clock passes the deadline the driver stops there and puts the host
    back to its desired state."""
    from stortune.server.agentclient import AgentBusy
    from stortune.server.services import experiments

    class Busy(SurfaceAgent):
        async def apply(self, profiles: Any, generations: Any, request_id: str, **kw: Any) -> Any:
            if any(p.metadata.name.startswith("tune-") for p in profiles):
                self.calls.append(("apply", (list(profiles), dict(generations), request_id)))
                raise AgentBusy(self.address, "busy: another apply runs")
            return await super().apply(profiles, generations, request_id, **kw)

    kind = SurfaceAgent if in_flight == "trial" else Busy
    agent = agents.add(kind(address=registration("h1")["address"], topology=loop_topology("h1"), hold=True))
    assert isinstance(agent, SurfaceAgent)
    app = _app(make_app, agents)
    with admin_client(app) as client:
        register(client)
        response = client.post(EXPERIMENTS, json=experiment_doc(budget={"trials": 30, "duration": "10m"}))
        assert response.status_code == 201, response.text
        exp_id = response.json()["metadata"]["uid"]
        if in_flight == "trial":
            eventually(lambda: agent.started, what="the first trial's benchmark running")
        else:
            eventually(lambda: [c for c in agent.calls if c[0] == "apply"], what="a trial's apply refused")
        assert ended(client, exp_id) is None
        with app.state.sessions() as session:
            assert experiments.owners(session) == {"h1": exp_id}
        clock.advance(601)
        done = eventually(lambda: ended(client, exp_id), timeout=60, what="the end at the deadline")
        status = done["status"]
        assert status["state"] == "done" and "time budget ran out" in status["reason"], status
        assert status["hosts"][0]["state"] == "done"
        with app.state.sessions() as session:
            assert experiments.owners(session) == {}  # the host is the reconciler's again
    last_apply = [c for c in agent.calls if c[0] == "apply"][-1]
    assert not [p for p in last_apply[1][0] if p.metadata.name.startswith("tune-")]
    assert agent.read_ahead() == 128
    if in_flight == "trial":
        # The first baseline run, which never ended by itself, and no other.
        (run_id,) = {c[1][0] for c in agent.calls if c[0] == "start_benchmark"}
        assert ("cancel_benchmark", run_id) in agent.calls
        (trial,) = status["trials"] or []
        assert trial["state"] == "failed" and "deadline" in trial["message"], trial
    else:
        assert not [c for c in agent.calls if c[0] == "start_benchmark"] and not status["trials"]
