"""Rollout analysis (issue 27, point 2): canaries benchmarked before and after the change,
judged by the noise rule, through the real benchmark queue and dispatcher with a scripted agent.

The rollout's state is built with the pure machine and the profile's generations are stored
directly, so these tests exercise ``rollout_analysis`` alone (no driver, no Profile row that
would start a rollout of its own). Every test runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import select

from stortune.schemas.bench.spec import parse_benchmark
from stortune.schemas.bench.steps import WorkloadStep
from stortune.schemas.rollout import machine
from stortune.schemas.rollout.spec import parse_rollout
from stortune.server import RecordingController, rollout_analysis
from stortune.server.agentclient import AgentRejected, FakeAgentClient, FakeAgentClients, HostInfo
from stortune.server.db.tables import (
    BenchmarkRun,
    Event,
    Profile,
    ProfileGeneration,
    Rollout,
    RolloutAnalysis,
)
from stortune.server.services import benchmarks
from stortune.server.services.versions import next_resource_version
from tests.server.benchfakes import BenchAgent, Values, make_result, spec_doc, steady
from tests.server.builders import API, loop_topology, profile_doc, registration, with_changes
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client

PROFILE = "streaming"
STREAM = {"preset": "stream-32k", "runtime": "1s"}
PLAIN = {"benchmark": STREAM}  # the analysis with its defaults
FAST = {"benchmark_interval_s": 0.05, "benchmark_unreachable_timeout_s": 60}
WAIT = 60.0  # generous: the dispatcher runs in the app's loop on a loaded machine


def _rules(read_ahead_kb: int) -> dict[str, Any]:
    return {"hostSelector": {"matchLabels": {"role": "streamer"}},
            "rules": [{"name": "reads", "match": {"kind": ["loop"]},
                       "settings": {"read_ahead_kb": read_ahead_kb}}]}


@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


@pytest.fixture
def agent(agents: FakeAgentClients) -> BenchAgent:
    return agents.add(BenchAgent(address=registration("h1")["address"]))  # type: ignore[return-value]


@pytest.fixture
def server(make_app: AppFactory, agents: FakeAgentClients, agent: BenchAgent) -> FastAPI:
    return make_app(agents=agents, controller=RecordingController(), **FAST)


@pytest.fixture
def client(server: FastAPI, clock: FakeClock) -> Iterator[TestClient]:
    with admin_client(server) as test_client:
        body = registration("h1", topology=loop_topology("h1"))
        assert test_client.post(f"{API}/agents/register", json=body).status_code == 200
        with server.state.sessions() as session:  # generation 1 read-ahead 4096, 2 sets 0
            session.add_all([ProfileGeneration(profile=PROFILE, generation=g, spec=_rules(kb),
                                               created_at=clock.now) for g, kb in ((1, 4096), (2, 0))])
            session.commit()
        yield test_client


def _done_run(app: FastAPI, host: str, doc: dict[str, Any], *, now: datetime | None = None) -> str:
    """A run stored done in one INSERT (never queued: the test's dispatcher would race to run it),
    measured under generation 1 of the profile, on loop0."""
    spec = parse_benchmark(doc)
    when = now or app.state.clock()
    row = benchmarks.queued_run(spec, host, requested_by="tests", now=when)
    result = make_result(row.id, spec, steady(), hostname=host, profiles={PROFILE: 1})
    row.state, row.message, row.finished_at, row.profiles = "done", "done", when, {PROFILE: 1}
    row.result = result.model_dump(mode="json")
    with app.state.sessions() as session:
        session.add(row)
        session.commit()
        return row.id


def _state(analysis: dict[str, Any], hosts: tuple[str, ...] = ("h1",)) -> machine.RolloutState:
    """A rollout of generation 2 from 1 whose first wave (one canary, gated) is in its baseline."""
    spec = parse_rollout({"waves": [{"hosts": 1}, {"percent": 100}], "analysis": analysis})
    state, actions = machine.start(PROFILE, spec, 2, 1, hosts, now=0.0)
    assert machine.StartAnalysis("h1", "before") in actions
    return state


def _at(state: machine.RolloutState, stage: machine.Stage, host: str = "h1") -> machine.RolloutState:
    moved = state.hosts[host].model_copy(update={"stage": stage, "generation": state.generation})
    return state.model_copy(update={"hosts": {**state.hosts, host: moved}})


def _start(app: FastAPI, state: machine.RolloutState, stage: machine.AnalysisStage) -> None:
    with app.state.sessions() as session:
        next_resource_version(session)  # as a step's transaction: it begins with a write
        rollout_analysis.start(session, state, "h1", stage, app.state.clock())
        session.commit()


def _observe(app: FastAPI, state: machine.RolloutState) -> rollout_analysis.Observation | None:
    with app.state.sessions() as session:
        # As the driver's step, a write transaction begins with a write: on SQLite a read-first
        # one cannot write once the dispatcher has committed meanwhile (verdicts are written).
        next_resource_version(session)
        seen = rollout_analysis.observe(session, state)
        session.commit()
    return seen.get("h1")


def _row(app: FastAPI) -> RolloutAnalysis:
    with app.state.sessions() as session:
        row: RolloutAnalysis | None = session.get(RolloutAnalysis, (PROFILE, 2, "h1"))
        assert row is not None
        session.expunge(row)
        return row


def _runs(app: FastAPI) -> list[tuple[str, str, str]]:
    with app.state.sessions() as session:
        return [(r[0], r[1], r[2]) for r in session.execute(
            select(BenchmarkRun.id, BenchmarkRun.state, BenchmarkRun.message).order_by(BenchmarkRun.seq))]


def _until(eventually: Eventually, app: FastAPI, state: machine.RolloutState, what: str,
           timeout: float = WAIT) -> rollout_analysis.Observation:
    def check() -> rollout_analysis.Observation | None:
        seen = _observe(app, state)
        return seen if seen is not None and (seen.baseline if state.hosts["h1"].stage == "baseline"
                                             else seen.verdict is not None) else None
    found: rollout_analysis.Observation = eventually(check, timeout=timeout, what=what)
    return found


def _judged(app: FastAPI, agent: BenchAgent, eventually: Eventually, analysis: dict[str, Any], *,
            before: Values, after: Values) -> tuple[rollout_analysis.Observation, list[dict[str, Any]]]:
    """Before-run with ``before``'s figures, after-run with ``after``'s: the verdict, the evidence."""
    state = _state(analysis)
    agent.values = before
    _start(app, state, "before")
    assert _until(eventually, app, state, "the before-run is ready") == (True, None)
    agent.values = after
    analysing = _at(state, "analysing")
    _start(app, analysing, "after")
    seen = _until(eventually, app, analysing, "the after-run's verdict")
    with app.state.sessions() as session:
        return seen, rollout_analysis.evidence(session, PROFILE, 2)


# -- hostile -------------------------------------------------------------------------------
def test_hostile_stored_spec_writing_to_a_raw_device_is_refused_at_start(
        client: TestClient, server: FastAPI) -> None:
    # "seq" is stored (the control plane keeps a spec with each run): seq-1m writes to loop0.
    _done_run(server, "h1", spec_doc("seq"))
    before = _runs(server)
    state = _state({"benchmark": "seq"})
    _start(server, state, "before")
    row = _row(server)
    assert row.verdict == "failed" and row.before_run is None
    assert "write to the raw device" in row.detail["reason"], row.detail
    assert _runs(server) == before  # nothing was queued
    assert _observe(server, state) == (False, "failed")
    with server.state.sessions() as session:
        reasons = session.scalars(select(Event.message).where(Event.reason == "AnalysisRefused")).all()
    assert len(reasons) == 1 and "write to the raw device" in reasons[0]
    with server.state.sessions() as session:  # what a profile write may check up front
        why = rollout_analysis.check_benchmark(session, state.spec.analysis)  # type: ignore[arg-type]
    assert why is not None and why.startswith("@benchmark ") and "write to the raw device" in why
    # The machine fails the canary (a host whose before-run cannot be had) and, past
    # maxFailures 0, halts without changing it.
    new, actions = machine.step(state, machine.Observed(hosts={"h1": machine.HostObservation(
        generation=1, baseline=False, verdict="failed")}), 1.0)
    assert new.hosts["h1"].stage == "failed" and new.hosts["h1"].failure == "analysis"
    assert new.phase == "Halted" and new.reason == "FailureLimit"
    assert not any(isinstance(a, machine.Advance) for a in actions)


@pytest.mark.parametrize(("benchmark", "words"), [("seq", "write to the raw device"),
                                                 ("nowhere", "'nowhere'")])
def test_hostile_a_profile_naming_a_stored_spec_that_cannot_judge_is_refused_at_the_write(
        client: TestClient, server: FastAPI, benchmark: str, words: str) -> None:
    """Hostile: found out only when the first canary's before-run should start, after the write
    was accepted; now the create and the replace are 422 naming the field, and nothing is stored."""
    _done_run(server, "h1", spec_doc("seq"))  # stored, and seq-1m writes to loop0
    doc = profile_doc(PROFILE, settings={"read_ahead_kb": 0})
    gated = with_changes(doc, rollout={"analysis": {"benchmark": benchmark}})
    for method, url in (("post", f"{API}/profiles"), ("put", f"{API}/profiles/{PROFILE}")):
        if method == "put":
            assert client.post(f"{API}/profiles", json=doc).status_code == 201
        refused = client.request(method, url, json=gated)
        assert refused.status_code == 422, refused.text
        (cause,) = refused.json()["details"]["causes"]
        assert cause["field"] == "spec.rollout.analysis.benchmark" and words in cause["message"], cause
    assert client.get(f"{API}/profiles/{PROFILE}").json()["metadata"]["generation"] == 1


def test_hostile_stored_spec_that_does_not_exist_is_refused_naming_it(
        client: TestClient, server: FastAPI) -> None:
    state = _state({"benchmark": "nowhere"})
    _start(server, state, "before")
    row = _row(server)
    assert row.verdict == "failed" and "'nowhere'" in row.detail["reason"]
    assert _runs(server) == []


def test_hostile_a_stored_read_only_spec_runs_on_the_changed_device_not_its_own_target(
        client: TestClient, server: FastAPI, eventually: Eventually) -> None:
    # Stored aimed at another device (loop9) and selecting other hosts: the run is this host's,
    # aimed at the device the change touches.
    doc = spec_doc("reads", workloads=[STREAM], target={"device": {"name": ["loop9"]}},
                   selector={"matchLabels": {"role": "elsewhere"}})
    doc["spec"]["allowDestructive"] = False
    _done_run(server, "h1", doc)
    state = _state({"benchmark": "reads"})
    _start(server, state, "before")
    row = _row(server)
    assert row.verdict is None and row.detail["device"] == "loop0", row.detail
    assert row.detail["spec"]["spec"]["target"] == {"device": {"id": ["name:loop0"], "kind": ["loop"]}}
    assert "hostSelector" not in row.detail["spec"]["spec"]
    assert _until(eventually, server, state, "the before-run is ready") == (True, None)


def test_hostile_a_before_run_that_fails_fails_the_host_with_why(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    agent.fail("start_benchmark", AgentRejected(agent.address, "fio is not installed", "FAILED_PRECONDITION"))
    state = _state({"benchmark": STREAM})
    _start(server, state, "before")
    seen = eventually(lambda: _observe(server, state) == (False, "failed"), timeout=WAIT,
                      what="the before-run's failure observed")
    assert seen
    assert "fio is not installed" in _row(server).detail["reason"]


def test_hostile_an_after_run_that_fails_is_a_failed_verdict_with_why(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    state = _state({"benchmark": STREAM})
    _start(server, state, "before")
    _until(eventually, server, state, "the before-run is ready")
    agent.fail("start_benchmark", AgentRejected(agent.address, "target is protected", "FAILED_PRECONDITION"))
    analysing = _at(state, "analysing")
    _start(server, analysing, "after")
    assert _until(eventually, server, analysing, "the after-run's verdict") == (True, "failed")
    with server.state.sessions() as session:
        (item,) = rollout_analysis.evidence(session, PROFILE, 2)
    assert item["verdict"] == "failed" and "target is protected" in item["reason"]
    assert item["after"] is not None and item["after"] in item["reason"]


def test_hostile_a_run_older_than_max_age_is_not_reused(
        client: TestClient, server: FastAPI, clock: FakeClock) -> None:
    old = clock.now - timedelta(hours=1, seconds=1)
    run_id = _done_run(server, "h1", spec_doc("mine", workloads=[STREAM]), now=old)
    state = _state({"benchmark": STREAM, "maxAge": "1h"})
    _start(server, state, "before")
    row = _row(server)
    assert row.detail["reused"] is False
    assert [r[0] for r in _runs(server)] == [run_id, row.before_run]  # a run of its own queued


@pytest.mark.parametrize("why", ["another workload", "another device", "another generation"])
def test_hostile_a_younger_run_that_did_not_measure_the_same_thing_is_not_reused(
        client: TestClient, server: FastAPI, clock: FakeClock, why: str) -> None:
    workloads = [{"preset": "stream-32k", "runtime": "2s"}] if why == "another workload" else [STREAM]
    run_id = _done_run(server, "h1", spec_doc("mine", workloads=workloads),
                          now=clock.now - timedelta(minutes=59))
    with server.state.sessions() as session:
        stored = session.scalars(select(BenchmarkRun).where(BenchmarkRun.id == run_id)).one()
        if why == "another generation":  # measured under the new generation: no "before"
            stored.profiles = {PROFILE: 2}
        elif why == "another device":
            result = dict(stored.result or {})
            result["context"] = {**result["context"], "target": {**result["context"]["target"],
                                                                 "device_id": "name:loop1"}}
            stored.result = result
        session.commit()
    state = _state({"benchmark": STREAM, "maxAge": "1h"})
    _start(server, state, "before")
    row = _row(server)
    assert row.detail["reused"] is False
    assert [r[0] for r in _runs(server)] == [run_id, row.before_run]  # a run of its own queued


def test_a_same_workload_run_younger_than_max_age_is_reused(
        client: TestClient, server: FastAPI, clock: FakeClock) -> None:
    recent = clock.now - timedelta(minutes=59, seconds=59)
    run_id = _done_run(server, "h1", spec_doc("mine", workloads=[STREAM]), now=recent)
    state = _state({"benchmark": STREAM, "maxAge": "1h"})
    _start(server, state, "before")
    row = _row(server)
    assert row.before_run == run_id and row.detail["reused"] is True
    assert len(_runs(server)) == 1  # nothing queued
    assert _observe(server, state) == (True, None)


def test_hostile_the_before_run_asked_twice_is_queued_once(
        client: TestClient, server: FastAPI, agent: BenchAgent) -> None:
    agent.auto = False
    state = _state({"benchmark": STREAM})
    _start(server, state, "before")
    _start(server, state, "before")
    assert len(_runs(server)) == 1 and _row(server).before_run == _runs(server)[0][0]


def test_hostile_an_after_run_without_a_before_run_fails(client: TestClient, server: FastAPI) -> None:
    analysing = _at(_state({"benchmark": STREAM}), "analysing")
    _start(server, analysing, "after")
    assert _runs(server) == []
    assert _observe(server, analysing) == (True, "failed")
    assert "no before-run" in _row(server).detail["reason"]


# -- the noise rule --------------------------------------------------------------------------
def test_a_regression_beyond_the_noise_fails(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    seen, (item,) = _judged(server, agent, eventually, PLAIN, before=steady(1.0), after=steady(0.5))
    assert seen == (True, "failed")
    (objective,) = item["objectives"]
    assert objective["metric"] == "read_bandwidth" and objective["verdict"] == "worse"
    assert objective["changePct"] == pytest.approx(-50.0)
    assert objective["noiseLowPct"] == pytest.approx(-5.0) and objective["noiseHighPct"] == pytest.approx(5.0)
    # steady(): 400 MB/s times the scale, the first repeat 1% low
    assert objective["beforeMedian"] == pytest.approx(396e6)
    assert objective["afterMedian"] == pytest.approx(198e6)
    assert "regressed beyond the noise" in item["reason"] and "-50.0%" in item["reason"]
    assert item["before"] != item["after"] and item["device"] == "loop0"


def test_a_change_inside_the_noise_passes(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    seen, (item,) = _judged(server, agent, eventually, PLAIN, before=steady(1.0), after=steady(0.96))
    assert seen == (True, "passed")
    assert [o["verdict"] for o in item["objectives"]] == ["within noise"]


def test_require_improvement_needs_a_gain_beyond_the_noise(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    analysis = {"benchmark": STREAM, "requireImprovement": True}
    seen, (item,) = _judged(server, agent, eventually, analysis, before=steady(1.0), after=steady(1.04))
    assert seen == (True, "failed") and "requireImprovement" in item["reason"]


def test_require_improvement_passes_a_gain_beyond_the_noise(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    analysis = {"benchmark": STREAM, "requireImprovement": True}
    seen, (item,) = _judged(server, agent, eventually, analysis, before=steady(1.0), after=steady(1.5))
    assert seen == (True, "passed")
    assert item["objectives"][0]["verdict"] == "better" and "improved" in item["reason"]


def test_an_objective_to_minimize_a_figure_fails_when_it_rises(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually) -> None:
    # Latency up 2x (steady(0.5) halves bandwidth, doubles latency): worse for "minimize".
    analysis = {"benchmark": STREAM, "objectives": [{"metric": "read_lat_p99", "goal": "minimize"}]}
    seen, (item,) = _judged(server, agent, eventually, analysis, before=steady(1.0), after=steady(0.5))
    assert seen == (True, "failed")
    assert [(o["metric"], o["verdict"]) for o in item["objectives"]] == [("read_lat_p99", "worse")]


def test_evidence_shows_the_gain_an_experiment_claimed_next_to_the_measured_one(
        client: TestClient, server: FastAPI, agent: BenchAgent, eventually: Eventually,
        clock: FakeClock) -> None:
    with server.state.sessions() as session:
        session.add(_profile_row(clock.now, {"stortune.io/experiment": "ra-sweep",
                                             "stortune.io/objective": "maximize read_bandwidth",
                                             "stortune.io/gain": "+20.0%",
                                             "stortune.io/interval": "+12.0%..+28.0%"}))
        session.commit()
    _, (item,) = _judged(server, agent, eventually, PLAIN, before=steady(1.0), after=steady(1.1))
    claim = item["experiment"]
    assert claim["name"] == "ra-sweep" and claim["metric"] == "read_bandwidth"
    assert claim["claimedGain"] == "+20.0%" and claim["measuredGainPct"] == pytest.approx(10.0)


def _profile_row(now: datetime, annotations: dict[str, str]) -> Profile:
    return Profile(name=PROFILE, uid="00000000-0000-4000-8000-0000000000aa", generation=2,
                   resource_version=1, spec=_rules(0), labels={}, annotations=annotations, status={},
                   finalizers=[], created_at=now, updated_at=now, deletion_timestamp=None)


def test_a_queued_analysis_run_wakes_the_dispatcher(
        make_app: AppFactory, agents: FakeAgentClients, agent: BenchAgent, clock: FakeClock,
        eventually: Eventually) -> None:
    # The dispatcher looks on its own only each minute here (the most Settings allow), past the
    # deadline below: the run starts because the commit that queued it woke it.
    app = make_app(agents=agents, controller=RecordingController(), benchmark_interval_s=60)
    with admin_client(app) as test_client:
        body = registration("h1", topology=loop_topology("h1"))
        assert test_client.post(f"{API}/agents/register", json=body).status_code == 200
        with app.state.sessions() as session:
            session.add_all([ProfileGeneration(profile=PROFILE, generation=g, spec=_rules(kb),
                                               created_at=clock.now) for g, kb in ((1, 4096), (2, 0))])
            session.commit()
        state = _state(PLAIN)
        _start(app, state, "before")
        assert _until(eventually, app, state, "the before-run is ready", timeout=45) == (True, None)


# -- through the control plane: profile write, driver, reconciler, dispatcher -------------------
FLEET = ("c1", "c2", "c3")


def _bench_agent(name: str) -> BenchAgent:
    """A fake agent whose stream reads at 400 MB/s with read-ahead 4096 and at a third with less."""
    agent = BenchAgent(address=registration(name)["address"], topology=loop_topology(name, 4096),
                       info=HostInfo(hostname=name, kernel="6.1.0", boot_id="boot-1", agent_version="fake"))

    def values(step: WorkloadStep, repeat: int) -> dict[str, float]:
        loop = agent.topology.device("loop0")
        assert loop is not None
        return steady(1.0 if loop.tunables["read_ahead_kb"].value == 4096 else 1 / 3)(step, repeat)

    agent.values = values
    return agent


def _read_ahead(agent: FakeAgentClient) -> Any:
    loop = agent.topology.device("loop0")
    assert loop is not None
    return loop.tunables["read_ahead_kb"].value


def _profile(name: str, read_ahead_kb: int, rollout: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": name},
            "spec": {**_rules(read_ahead_kb), "rollout": rollout}}


def _rollout(app: FastAPI, name: str) -> machine.RolloutState | None:
    with app.state.sessions() as session:
        row = session.get(Rollout, name)
        return None if row is None else machine.RolloutState.model_validate(row.state)


@pytest.mark.parametrize("then", [4096, 0], ids=["improvement-completes", "regression-halts"])
def test_a_canary_proves_the_change_before_the_fleet_takes_it(
        make_app: AppFactory, eventually: Eventually, then: int) -> None:
    fleet = FakeAgentClients()
    fakes = {name: fleet.add(_bench_agent(name)) for name in FLEET}
    app = make_app(agents=fleet, reconcile_interval_s=0.5, rollout_interval_s=0.05, **FAST)
    first = 0 if then == 4096 else 4096
    # A name of its own: services/rollouts caches parsed generations process-wide by (profile,
    # generation, created_at), and every test's FakeClock starts at the same instant.
    profile = f"canary-{then}"
    gated = {"waves": [{"hosts": 1}, {"percent": 100}], "analysis": PLAIN}
    with admin_client(app) as client:
        for name in FLEET:
            body = registration(name, topology=loop_topology(name, 4096))
            assert client.post(f"{API}/agents/register", json=body).status_code == 200
        response = client.post(f"{API}/profiles", json=_profile(profile, first, {"strategy": "all-at-once"}))
        assert response.status_code == 201, response.text
        eventually(lambda: all(_read_ahead(a) == first for a in fakes.values()), timeout=WAIT,
                   what=f"read-ahead {first} everywhere at once")
        seen: set[tuple[str, Any]] = set()  # (host, read-ahead) each fake was seen at while rolling
        response = client.put(f"{API}/profiles/{profile}", json=_profile(profile, then, gated))
        assert response.status_code == 200, response.text

        def ended() -> machine.RolloutState | None:
            seen.update((n, _read_ahead(a)) for n, a in fakes.items())
            st = _rollout(app, profile)
            done = st is not None and (st.phase == "Complete" or (st.phase == "Halted" and st.rolledBack))
            return st if done else None

        st: machine.RolloutState = eventually(ended, timeout=WAIT, what="the rollout ended")
        (canary,) = [h for h, hs in st.hosts.items() if hs.wave == 0]
        status = client.get(f"{API}/profiles/{profile}/rollout")
        assert status.status_code == 200, status.text
        (item,) = status.json()["analysis"]
        assert item["host"] == canary and item["before"] and item["after"]
        (objective,) = item["objectives"]
        if then == 4096:  # from 0 (a third of the bandwidth) to 4096: better, and everyone takes it
            assert st.phase == "Complete" and item["verdict"] == "passed"
            assert objective["verdict"] == "better" and objective["changePct"] == pytest.approx(200.0)
            eventually(lambda: all(_read_ahead(a) == 4096 for a in fakes.values()), timeout=WAIT,
                       what="read-ahead 4096 everywhere")
        else:  # the canary regressed: halted, put back, and no other host ever changed
            assert st.phase == "Halted" and st.reason == "AnalysisFailed" and item["verdict"] == "failed", (
                st, item)
            assert objective["verdict"] == "worse" and "regressed beyond the noise" in item["reason"]
            assert st.hosts[canary].verdict == "failed"
            eventually(lambda: _read_ahead(fakes[canary]) == 4096, timeout=WAIT, what="the canary put back")
            assert {(n, ra) for n, ra in seen if n != canary} == {(n, 4096) for n in FLEET if n != canary}


def test_hostile_evidence_is_bounded_failed_hosts_first(client: TestClient, server: FastAPI,
                                                        clock: FakeClock) -> None:
    verdicts = {"a1": "passed", "a2": None, "a3": "failed"}
    with server.state.sessions() as session:
        session.add_all([RolloutAnalysis(profile=PROFILE, generation=2, host=h, before_run=f"b-{h}",
                                         after_run=None, verdict=v, detail={}, created_at=clock.now,
                                         updated_at=clock.now) for h, v in verdicts.items()])
        session.commit()
        listed = {n: [i["host"] for i in rollout_analysis.evidence(session, PROFILE, 2, limit=n)]
                  for n in (0, 2, 3, 4)}
    assert listed == {0: [], 2: ["a3", "a1"], 3: ["a3", "a1", "a2"], 4: ["a3", "a1", "a2"]}
