"""A correction the agent makes on its own is recorded with its cause and counted.

The real control plane (uvicorn on 127.0.0.1, its reconciler dialling the agent over gRPC), the
real agent on this machine's /sys, and a real loop device: the profile is applied by the
reconciler; while the agent is down the value is changed by hand; the agent's re-apply at its
start sets it back before the control plane can look, so the reconciler never sees that drift.
Before the agent reported its corrections, no Drift event was written and
``stortune_drift_events_total`` stayed at 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from stortune.agent import corrections
from stortune.agent.kernelfs import KernelFS
from stortune.agent.serve import Agent, ServeOptions
from stortune.server.agentclient import AgentClients, Timeouts
from stortune.server.auth import Role
from tests.cli.conftest import ControlPlane, serve
from tests.server.builders import profile_doc
from tests.server.conftest import Eventually
from tests.server.support import AppFactory
from tests.server.test_metrics import parse, sample, scrape

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the API tests cover PostgreSQL


@pytest.fixture
def plane(make_app: AppFactory) -> Iterator[tuple[Any, ControlPlane]]:
    app = make_app(agents=AgentClients(timeouts=Timeouts(read=5, apply=20)), reconcile_interval_s=0.5,
                   lease_duration_s=6, heartbeat_interval_s=1)
    for served in serve(app):
        yield app, served


def _agent(plane: ControlPlane, token: str, state: Path) -> Agent:
    agent = Agent(KernelFS.at(), state, ServeOptions(
        listen="127.0.0.1:0", server=plane.url, token=token, name="loophost", labels={"e2e": "corrections"},
        heartbeat=0.5, rescan_interval=3600, observe_interval=0.5, grace=1, backoff_base=0.05,
        backoff_cap=0.5, insecure=True))
    agent.start()
    return agent


def _events(plane: ControlPlane, reason: str) -> list[str]:
    with plane.http() as c:
        items = c.get("/events", params={"host": "loophost", "limit": 200}).json()["items"]
    return [e["message"] for e in items if e["reason"] == reason]


def test_a_hand_change_the_agent_sets_back_at_its_start_is_a_drift_event_with_its_cause(
        plane: tuple[Any, ControlPlane], loop_devices: Callable[[int], list[str]], tmp_path: Path,
        eventually: Eventually) -> None:
    app, cp = plane
    (dev,) = loop_devices(1)
    ra = Path("/sys/block") / dev / "queue" / "read_ahead_kb"
    state = tmp_path / "agent-state"
    token = cp.issue(Role.AGENT, name="fleet")
    doc = profile_doc("corrections", selector={"matchLabels": {"e2e": "corrections"}},
                      settings={"read_ahead_kb": 4096})
    doc["spec"]["rules"][0]["match"] = {"kind": ["loop"], "name": [dev]}  # this test's device only

    agent = _agent(cp, token, state)
    try:
        with cp.http() as c:
            assert c.post("/profiles", json=doc).status_code == 201

        def applied() -> bool:
            with cp.http() as c:
                status = c.get("/hosts/loophost/status").json()
            return status.get("appliedGenerations") == {"corrections": 1}

        eventually(applied, timeout=60, what="the profile applied by the reconciler")
        assert ra.read_text().strip() == "4096"
    finally:
        agent.stop()

    ra.write_text("256")  # by hand, while the agent is down
    agent = _agent(cp, token, state)
    try:
        assert ra.read_text().strip() == "4096"  # its start set it back, before it even listened
        drift = eventually(lambda: _events(cp, "Drift"), timeout=30, what="a Drift event")
        assert drift == [f"{dev} read_ahead_kb observed 256, desired 4096 (corrections/loops): changed"
                         " outside stortune; the agent set it back at its start"]
        assert _events(cp, "Corrected") == [
            f"{dev} read_ahead_kb set back to 4096 (corrections/loops) by the agent at its start"]
        with cp.http() as c:  # what the host applies: on the profile's events too
            on_profile = c.get("/events", params={"profile": "corrections"}).json()["items"]
        assert [e["message"] for e in on_profile if e["reason"] == "Drift"] == drift
        samples = parse(scrape(app))
        assert sample(samples, "stortune_drift_events_total", tunable="read_ahead_kb", cause="runtime") == 1
        assert sample(samples, "stortune_correction_events_total", tunable="read_ahead_kb",
                      cause="runtime") == 1
        # Recorded: the agent dropped it, and sends it no more.
        eventually(lambda: corrections.batch(state) is None, timeout=30, what="the correction dropped")
    finally:
        agent.stop()
