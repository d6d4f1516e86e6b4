"""The reconciler end to end: the app with its real reconciler, agents faked at the gRPC seam.

Each test runs on SQLite and PostgreSQL. The reconciler works in the app's
event loop while the test drives the REST API and the fake agent; waits poll
with a deadline (``eventually``), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import select

from stortune.server.agentclient import FakeAgentClient, FakeAgentClients, HostInfo
from stortune.server.db.tables import HostConditionChange, HostLease
from tests.server.builders import API, host_key, loop_topology, profile_doc, registration, with_changes
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client

ADDRESS = "h1.example:7443"  # what registration("h1") advertises
INTERVAL = 0.5  # the periodic pass, short for tests


def host_info(boot_id: str = "boot-1") -> HostInfo:
    return HostInfo(hostname="h1", kernel="6.1.0", boot_id=boot_id, agent_version="fake")


@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


@pytest.fixture
def agent(agents: FakeAgentClients) -> FakeAgentClient:
    return agents.add(FakeAgentClient(address=ADDRESS, topology=loop_topology(), info=host_info()))


@pytest.fixture
def app(make_app: AppFactory, agents: FakeAgentClients) -> FastAPI:
    return make_app(agents=agents, reconcile_interval_s=INTERVAL)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with admin_client(app) as test_client:
        yield test_client


# -- reading what the reconciler wrote ----------------------------------------------------
def status(client: TestClient) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"{API}/hosts/h1/status").json()
    return body


def condition(client: TestClient, type: str) -> tuple[str, str]:
    found = next((c for c in status(client)["conditions"] if c["type"] == type), None)
    return ("Unknown", "") if found is None else (found["status"], found["reason"])


def events(client: TestClient, reason: str, **params: str) -> list[dict[str, Any]]:
    items = client.get(f"{API}/events", params={"limit": "1000", **params}).json()["items"]
    return [e for e in items if e["reason"] == reason]


def value(agent: FakeAgentClient, tunable: str = "read_ahead_kb") -> Any:
    loop = agent.topology.device("loop0")
    assert loop is not None
    return loop.tunables[tunable].value


def set_value(agent: FakeAgentClient, value: int, tunable: str = "read_ahead_kb") -> None:
    """Change a setting behind stortune's back."""
    loop = agent.topology.device("loop0")
    assert loop is not None
    loop.tunables[tunable].value, loop.tunables[tunable].raw = value, str(value)


def calls(agent: FakeAgentClient, method: str) -> int:
    return sum(name == method for name, _ in list(agent.calls))


def passes(eventually: Eventually, agent: FakeAgentClient, n: int = 3) -> None:
    """Wait until the reconciler has looked at the agent ``n`` more times."""
    start = len(agent.calls)
    eventually(lambda: sum(m == "get_observed" for m, _ in list(agent.calls)[start:]) >= n,
               what=f"{n} more reconciles")


def converged(client: TestClient, eventually: Eventually, applied: dict[str, int]) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        st = status(client)
        ok = st["appliedGenerations"] == applied and condition(client, "Ready") == ("True", "Reconciled")
        return st if ok else None

    found: dict[str, Any] = eventually(ready, what=f"Ready with {applied} applied")
    return found


def history(app: FastAPI, type: str) -> list[tuple[str, str]]:
    with app.state.sessions() as session:
        rows = session.scalars(select(HostConditionChange).where(HostConditionChange.type == type)
                               .order_by(HostConditionChange.id)).all()
        return [(r.status, r.reason) for r in rows]


def setup_streaming(client: TestClient, eventually: Eventually, **doc: Any) -> dict[str, Any]:
    client.post(f"{API}/agents/register", json=registration("h1"))
    body = profile_doc(**doc)
    assert client.post(f"{API}/profiles", json=body).status_code == 201
    return converged(client, eventually, {body["metadata"]["name"]: 1})


# -- converging ------------------------------------------------------------------------------
def test_profile_applied_and_host_ready_with_its_settings_table(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    st = setup_streaming(client, eventually)
    assert value(agent) == 4096
    assert st["devices"] == [{
        "device": "loop0", "deviceId": "name:loop0", "tunable": "read_ahead_kb", "desired": 4096,
        "observed": 4096, "inSync": True, "profile": "streaming", "rule": "loops", "mode": "enforce",
        "generation": 1, "drifted": False, "pendingReboot": False, "effective": None,
        "message": ""}]
    conditions = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert conditions == {"Ready": ("True", "Reconciled"), "Reachable": ("True", "AgentRegistered"),
                          "Applied": ("True", "Applied"), "Drifted": ("False", "NoDrift")}
    assert st["checkedBootId"] == st["appliedBootId"] == "boot-1"
    assert client.get(f"{API}/hosts/h1/topology").json()["devices"][0]["name"] == "loop0"
    (applied,) = events(client, "Applied", host="h1")
    assert applied["message"].startswith("streaming (generation 1): apply: 1 setting(s) changed")
    profile = eventually(lambda: (p := client.get(f"{API}/profiles/streaming").json())["status"]
                         .get("hosts", {}).get("applied") == 1 and p)
    assert profile["status"] == {"observedGeneration": 1, "phase": "Applied",
                                 "hosts": {"matched": 1, "applied": 1, "failed": 0, "pending": 0,
                                           "rejected": 0}}


def test_generation_bump_is_applied_and_followed(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    updated = client.put(f"{API}/profiles/streaming", json=profile_doc(settings={"read_ahead_kb": 8192}))
    assert updated.json()["metadata"]["generation"] == 2
    st = converged(client, eventually, {"streaming": 2})
    assert value(agent) == 8192
    assert [(d["desired"], d["observed"], d["generation"]) for d in st["devices"]] == [(8192, 8192, 2)]
    eventually(lambda: client.get(f"{API}/profiles/streaming").json()["status"].get("observedGeneration")
               == 2, what="profile status at generation 2")


def test_idle_passes_write_nothing(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    passes(eventually, agent, 2)
    version = client.get(f"{API}/hosts/h1").json()["metadata"]["resourceVersion"]
    applies = calls(agent, "apply")
    passes(eventually, agent, 3)
    assert client.get(f"{API}/hosts/h1").json()["metadata"]["resourceVersion"] == version
    assert calls(agent, "apply") == applies


def settled_then_counting(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually, monkeypatch: pytest.MonkeyPatch,
    *, module: Any, function: str, name_at: int,
) -> list[str]:
    """After the streaming profile settled (its summary written, two idle passes), the host
    names ``module.function`` is called with (argument ``name_at`` is the name or has one)."""
    setup_streaming(client, eventually)
    eventually(lambda: client.get(f"{API}/profiles/streaming").json()["status"].get("hosts", {})
               .get("applied") == 1, what="the profile's summary (the last write)")
    passes(eventually, agent, 2)
    names: list[str] = []
    real = getattr(module, function)

    def counted(*args: Any) -> Any:
        named = args[name_at]
        names.append(named if isinstance(named, str) else named.name)
        return real(*args)

    monkeypatch.setattr(module, function, counted)
    return names


def test_idle_passes_read_the_host_and_its_profiles_again_only_after_a_write(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stortune.server.reconciler import store

    loads = settled_then_counting(client, agent, eventually, monkeypatch,
                                  module=store, function="_load", name_at=1)
    passes(eventually, agent, 3)
    assert loads == [], "nothing was written: the view read at this resourceVersion still holds"
    client.put(f"{API}/hosts/h1/labels", json={"labels": {"tier": "gold"}})  # a write
    passes(eventually, agent, 2)
    assert loads and set(loads) == {"h1"}
    set_value(agent, 128)  # drift is still seen by an idle pass
    eventually(lambda: value(agent) == 4096, what="drift corrected")


def test_an_unchanged_host_is_not_planned_again_until_its_values_or_record_change(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stortune.server.reconciler import reconcile

    decided = settled_then_counting(client, agent, eventually, monkeypatch,
                                    module=reconcile, function="decide", name_at=0)
    passes(eventually, agent, 3)
    assert decided == [], "same record, same answer from the agent: the last look's verdict holds"
    set_value(agent, 128)  # new values: planned, found drifted and corrected
    eventually(lambda: value(agent) == 4096, what="drift corrected")
    assert decided
    converged(client, eventually, {"streaming": 1})
    passes(eventually, agent, 2)
    decided.clear()
    client.put(f"{API}/hosts/h1/labels", json={"labels": {"tier": "gold"}})  # a write
    passes(eventually, agent, 2)
    assert decided, "the host's record changed: looked at in full again"


# -- drift ------------------------------------------------------------------------------------
def test_drift_is_reported_and_corrected_in_enforce_mode(
    app: FastAPI, client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    set_value(agent, 128)
    (corrected,) = eventually(lambda: events(client, "Corrected", host="h1"), what="a Corrected event")
    assert corrected["message"] == ("loop0 read_ahead_kb set back to 4096 (streaming/loops)"
                                    " by the control plane")
    (drift,) = events(client, "Drift", host="h1")
    assert drift["type"] == "Warning" and drift["profile"] == "streaming"
    assert drift["message"] == ("loop0 read_ahead_kb observed 128, desired 4096 (streaming/loops): "
                                "changed while the agent was running")
    assert value(agent) == 4096
    converged(client, eventually, {"streaming": 1})
    assert condition(client, "Drifted") == ("False", "NoDrift")
    assert history(app, "Drifted") == [("False", "NoDrift"), ("True", "Drift"), ("False", "NoDrift")]


def test_drift_is_only_reported_in_audit_mode(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    set_value(agent, 4096)  # already as the profile wants it
    doc = profile_doc("audited")
    doc["spec"]["mode"] = "audit"
    client.post(f"{API}/agents/register", json=registration("h1"))
    client.post(f"{API}/profiles", json=doc)
    converged(client, eventually, {"audited": 1})
    applies = calls(agent, "apply")

    set_value(agent, 128)
    eventually(lambda: condition(client, "Drifted") == ("True", "Drift"), what="Drifted=True")
    assert condition(client, "Ready") == ("False", "Drift")
    passes(eventually, agent, 3)
    assert value(agent) == 128 and calls(agent, "apply") == applies
    assert condition(client, "Drifted") == ("True", "Drift")  # stays while it lasts
    (drift,) = events(client, "Drift", host="h1")  # once, not once per pass
    assert drift["count"] == 1 and drift["message"].endswith("changed while the agent was running")
    (row,) = status(client)["devices"]
    assert (row["observed"], row["inSync"], row["drifted"], row["mode"]) == (128, False, True, "audit")

    set_value(agent, 4096)  # put back by hand
    eventually(lambda: condition(client, "Ready") == ("True", "Reconciled"), what="Ready again")


def test_drift_after_a_reboot_names_the_reboot(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    agent.unreachable()  # down while it reboots, so no look sees half of the change
    eventually(lambda: condition(client, "Reachable")[0] == "False", what="down")
    agent.info = host_info("boot-2")
    set_value(agent, 128)  # the kernel's default came back with the reboot
    agent.fail("*", None)
    (drift,) = eventually(lambda: events(client, "Drift", host="h1"), what="a Drift event")
    assert drift["message"].endswith(": reset since last check (host rebooted)")
    st = eventually(lambda: (s := status(client))["appliedBootId"] == "boot-2" and s)
    assert st["checkedBootId"] == "boot-2" and value(agent) == 4096


# -- failures ----------------------------------------------------------------------------------
def test_unreachable_agent_one_event_then_recovery(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    agent.unreachable("connection refused")
    eventually(lambda: condition(client, "Reachable") == ("False", "AgentUnreachable"), what="unreachable")
    passes(eventually, agent, 3)  # retried meanwhile (the calls fail but are counted)
    reachable = next(c for c in status(client)["conditions"] if c["type"] == "Reachable")
    assert reachable["message"] == f"{ADDRESS}: connection refused"
    assert condition(client, "Ready") == ("False", "AgentUnreachable")
    (warning,) = events(client, "Unreachable", host="h1")
    assert warning["type"] == "Warning" and warning["count"] == 1

    agent.fail("*", None)
    eventually(lambda: condition(client, "Ready") == ("True", "Reconciled"), what="Ready again")
    assert condition(client, "Reachable") == ("True", "AgentResponded")
    assert len(events(client, "Reachable", host="h1")) == 1


def test_hostile_a_rejected_setting_is_reported_and_the_rest_applied_until_the_spec_changes(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    client.post(f"{API}/agents/register", json=registration("h1"))
    # all-at-once: in waves a refused value halts the rollout and rolls the canary back (issue 27).
    refused = profile_doc(settings={"scheduler": "bfq", "read_ahead_kb": 4096})
    client.post(f"{API}/profiles", json=with_changes(refused, rollout={"strategy": "all-at-once"}))
    eventually(lambda: condition(client, "Applied") == ("False", "Rejected"), what="Applied=False")
    passes(eventually, agent, 4)
    # Sent once for the rest (not again every pass): read_ahead_kb is set, the scheduler is not.
    assert calls(agent, "apply") == 1
    assert value(agent, "read_ahead_kb") == 4096 and value(agent, "scheduler") == "none"
    assert condition(client, "Ready") == ("False", "Rejected")
    (warning,) = events(client, "Rejected", host="h1")
    assert warning["count"] == 1
    assert "loop0 scheduler=bfq (streaming/loops)" in warning["message"]
    assert "offered: none, mq-deadline" in warning["message"]
    assert "every other setting is applied" in warning["message"]
    status = eventually(lambda: (p := client.get(f"{API}/profiles/streaming").json()["status"])
                        .get("phase") == "Failed" and p)
    assert status["hosts"]["rejected"] == 1 and status["rejectedHosts"] == ["h1"]

    # The fix goes out in waves: the rejection generation 1 left must not fail its canary (issue 27).
    client.put(f"{API}/profiles/streaming", json=profile_doc(settings={"scheduler": "mq-deadline"}))
    converged(client, eventually, {"streaming": 2})
    assert value(agent, "scheduler") == "mq-deadline" and calls(agent, "apply") == 2


def test_a_value_no_profile_wants_is_put_back_without_a_profile_change(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    """The agent reports read_ahead_kb changed by stortune (its journal's original on the value)
    though no stored profile wants it, e.g. after `stortune-agent apply` by hand: nothing about
    the profiles changed, yet the reconciler applies, and the agent puts it back."""
    setup_streaming(client, eventually, settings={"scheduler": "none"})
    applies = calls(agent, "apply")
    set_value(agent, 4096)
    agent.remember("loop0", "name:loop0", "read_ahead_kb", 128)
    eventually(lambda: value(agent) == 128, what="read_ahead_kb put back")
    assert calls(agent, "apply") == applies + 1

    def stored() -> dict[str, Any]:
        state: dict[str, Any] = client.get(f"{API}/hosts/h1/topology").json()["devices"][0]["tunables"][
            "read_ahead_kb"]
        return state

    eventually(lambda: stored()["value"] == 128, what="the stored topology after the restore")
    assert "original" not in stored()


def test_busy_agent_is_retried(client: TestClient, agent: FakeAgentClient, eventually: Eventually) -> None:
    from stortune.server.agentclient import AgentBusy

    agent.fail("apply", AgentBusy(ADDRESS, "state directory locked", "ABORTED"), times=2)
    setup_streaming(client, eventually)
    assert calls(agent, "apply") == 3 and not events(client, "ApplyFailed", host="h1")


# -- finalizers --------------------------------------------------------------------------------
def test_deleted_profile_is_restored_then_removed(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    response = client.delete(f"{API}/profiles/streaming")
    assert response.status_code == 202
    eventually(lambda: client.get(f"{API}/profiles/streaming").status_code == 404, what="profile gone")
    assert value(agent) == 128  # the original, restored by the agent
    assert status(client)["appliedGenerations"] == {}
    (restored,) = events(client, "Restored", profile="streaming")
    assert restored["involvedObject"] == {"kind": "StorageProfile", "name": "streaming"}
    assert restored["message"] == "h1 restored the settings of streaming: the profile is being deleted"
    assert [e["reason"] for e in events(client, "Deleted", profile="streaming")] == ["Deleted"]
    eventually(lambda: condition(client, "Applied") == ("True", "NoProfiles"))


def test_deleting_the_host_releases_the_finalizer(
    client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    agent.unreachable()
    eventually(lambda: condition(client, "Reachable")[0] == "False", what="unreachable")
    assert client.delete(f"{API}/profiles/streaming").status_code == 202
    passes(eventually, agent, 2)
    pending = eventually(lambda: (p := client.get(f"{API}/profiles/streaming").json())["status"]
                         .get("phase") == "Deleting" and p, what="Deleting status")
    assert pending["metadata"]["deletionTimestamp"] and pending["status"]["restoringHosts"] == ["h1"]

    assert client.delete(f"{API}/hosts/h1").status_code == 200
    assert client.get(f"{API}/profiles/streaming").status_code == 404  # released in the same write


# -- leases and restarts -------------------------------------------------------------------------
def test_lease_expiry_holds_reachable_false_until_a_heartbeat(
    client: TestClient, agent: FakeAgentClient, clock: FakeClock, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    clock.advance(16)
    eventually(lambda: condition(client, "Reachable") == ("False", "LeaseExpired"), what="lease expired")
    reachable = next(c for c in status(client)["conditions"] if c["type"] == "Reachable")
    assert reachable["message"] == "no heartbeat since 2025-03-01T12:00:00+00:00"
    passes(eventually, agent, 3)  # the agent still answers gRPC; that does not renew a lease
    assert condition(client, "Reachable") == ("False", "LeaseExpired")
    assert condition(client, "Ready") == ("False", "LeaseExpired")

    client.post(f"{API}/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"})
    assert condition(client, "Reachable") == ("True", "LeaseRenewed")
    eventually(lambda: condition(client, "Ready") == ("True", "Reconciled"))


def test_a_restarted_server_keeps_status_and_reconciles_again(
    make_app: AppFactory, agents: FakeAgentClients, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    first = make_app(agents=agents, reconcile_interval_s=INTERVAL)
    with admin_client(first) as client:
        before = setup_streaming(client, eventually)
        applied_events = events(client, "Applied", host="h1")
    first.state.engine.dispose()
    looked, applies = calls(agent, "get_observed"), calls(agent, "apply")

    # A long interval: only the pass at start can be what reconciles the host.
    second = make_app(agents=agents, reconcile_interval_s=60)
    with admin_client(second) as client:
        eventually(lambda: calls(agent, "get_observed") > looked, what="a reconcile after the restart")
        after = status(client)
        assert after["conditions"] == before["conditions"]  # lastTransitionTime included
        assert after["appliedGenerations"] == {"streaming": 1}
        assert events(client, "Applied", host="h1") == applied_events
    assert calls(agent, "apply") == applies  # in sync: nothing to apply again


def test_the_server_reconciles_by_default_at_most_every_minute(
    make_app: AppFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    from stortune.server import cli
    from stortune.server.reconciler import Reconciler

    reconciler = make_app(controller=None, reconcile_interval_s=60).state.controller
    assert isinstance(reconciler, Reconciler) and reconciler.interval == 60
    assert cli.main(["--db", "sqlite://", "--reconcile-interval", "61"]) == 1  # a usage error
    assert "reconcile_interval_s" in capsys.readouterr().err


def test_the_periodic_pass_does_not_cut_a_backoff_short(db_url: str) -> None:
    """A host failing with a long backoff is not retried at every pass; the other hosts are looked at."""
    from stortune.server.agentclient import AgentBusy
    from stortune.server.controller import bind
    from stortune.server.db.engine import make_engine, make_sessions
    from stortune.server.db.migrate import upgrade
    from stortune.server.models.agents import Registration
    from stortune.server.reconciler import Reconciler
    from stortune.server.reconciler.queue import Backoff
    from stortune.server.services import hosts, profiles
    from stortune.server.services.host_keys import Proof

    agents = FakeAgentClients()
    failing = agents.add(FakeAgentClient(address=ADDRESS, topology=loop_topology(), info=host_info()))
    healthy = agents.add(FakeAgentClient(address="h2.example:7443", topology=loop_topology("h2")))
    failing.fail("apply", AgentBusy(ADDRESS, "locked", "ABORTED"))
    engine = make_engine(db_url)
    upgrade(engine)
    sessions = make_sessions(engine)
    clock = FakeClock()
    with sessions() as session:
        for name in ("h1", "h2"):
            hosts.register(session, Registration.model_validate(registration(name)),
                           proof=Proof(host_key(name)), lease_duration_s=15, now=clock())
        # all-at-once: both hosts at once, no rollout driver here (issue 27).
        at_once = with_changes(profile_doc(), rollout={"strategy": "all-at-once"})
        profiles.create(session, profiles.validate(at_once), clock())

    async def scenario() -> None:
        reconciler = Reconciler(sessions, agents, interval=0.05, clock=clock,
                                backoff=lambda: Backoff(base=3600, cap=3600))
        bind(sessions, reconciler)
        await reconciler.start()
        try:
            while calls(healthy, "get_observed") < 10:  # ten passes at least
                await asyncio.sleep(0.01)
        finally:
            await reconciler.stop()

    try:
        asyncio.run(asyncio.wait_for(scenario(), timeout=15))
    finally:
        engine.dispose()
    assert calls(failing, "apply") == 1 and calls(healthy, "apply") == 1


def test_later_passes_spread_the_hosts_over_the_interval(db_url: str) -> None:
    """The first pass looks at every host at once; later ones queue them one by one across the
    interval, so a fleet's drift checks do not arrive as one burst."""
    from stortune.server.controller import bind
    from stortune.server.db.engine import make_engine, make_sessions
    from stortune.server.db.migrate import upgrade
    from stortune.server.models.agents import Registration
    from stortune.server.reconciler import Reconciler
    from stortune.server.services import hosts
    from stortune.server.services.host_keys import Proof

    names = ("h1", "h2", "h3", "h4")
    agents = FakeAgentClients()
    fakes = [agents.add(FakeAgentClient(address=f"{n}.example:7443", topology=loop_topology(n)))
             for n in names]
    engine = make_engine(db_url)
    upgrade(engine)
    sessions = make_sessions(engine)
    clock = FakeClock()
    with sessions() as session:
        for name in names:
            hosts.register(session, Registration.model_validate(registration(name)),
                           proof=Proof(host_key(name)), lease_duration_s=15, now=clock())

    def looked_at(name: str) -> bool:  # the reconciler wrote what it saw
        with sessions() as session:
            return hosts.get(session, name).status.get("checkedBootId") is not None

    async def scenario() -> dict[str, float]:
        reconciler = Reconciler(sessions, agents, interval=100, clock=clock)
        bind(sessions, reconciler)
        await reconciler.start()
        try:
            while not await asyncio.to_thread(lambda: all(looked_at(name) for name in names)):
                await asyncio.sleep(0.01)  # the first pass: every host at once
            assert all(calls(fake, "get_observed") == 1 for fake in fakes) and reconciler.scheduled() == {}
            await reconciler.resync()
            return reconciler.scheduled()
        finally:
            await reconciler.stop()

    try:
        scheduled = asyncio.run(asyncio.wait_for(scenario(), timeout=15))
    finally:
        engine.dispose()
    assert sorted(scheduled) == ["h2", "h3", "h4"]  # h1's turn is now
    assert [round(scheduled[n]) for n in ("h2", "h3", "h4")] == [25, 50, 75]


# -- agents that report their values ---------------------------------------------------------
def _digest(agent: FakeAgentClient) -> str:
    """The digest the agent reports: of its values as GetObserved encodes them (read without a call)."""
    from stortune.api.agent.wire import Observation
    from stortune.schemas import planner

    return Observation.of(agent.info, planner.observed_of(agent.topology), "").digest


def _report(client: TestClient, agent: FakeAgentClient) -> None:
    beat = {"topology_hash": "", "boot_id": "boot-1", "observed_digest": _digest(agent)}
    assert client.post(f"{API}/agents/h1/heartbeat", json=beat).status_code == 200


def test_a_host_whose_agent_reports_its_values_is_asked_only_when_they_change(
    make_app: AppFactory, agents: FakeAgentClients, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    # Looks paced far apart: the periodic pass alone would ask every half second.
    app = make_app(agents=agents, reconcile_interval_s=INTERVAL, max_looks_per_s=1e-3)
    with admin_client(app) as client:
        setup_streaming(client, eventually)
        passes(eventually, agent, 2)  # a quiet look: nothing to do
        _report(client, agent)  # the values that look saw
        quiet = calls(agent, "get_observed")
        time.sleep(6 * INTERVAL)
        # (One look may have been under way as the report came.)
        assert calls(agent, "get_observed") <= quiet + 1, \
            "six passes, and the agent's last report matches the last look: not asked"

        set_value(agent, 128)  # drift, and the agent says so at once
        _report(client, agent)
        eventually(lambda: value(agent) == 4096, what="drift corrected after the report")
        # The apply's own answer recorded the values it left: the agent reporting them again
        # asks for no further look.
        def recorded() -> bool:
            with app.state.sessions() as session:
                lease = session.get(HostLease, "h1")
                return lease is not None and lease.observed_digest == _digest(agent)

        eventually(recorded, what="the values the apply left recorded as the agent's report")


def test_looks_at_reporting_agents_are_paced_to_the_fleet_budget() -> None:
    from stortune.server.reconciler.runner import look_every

    assert look_every(100, 30.0, 10.0) == 300.0  # ten intervals
    assert look_every(10_000, 30.0, 10.0) == 1000.0  # the budget: 10 looks a second
    assert look_every(10_000, 30.0, 5.0) == 2000.0
