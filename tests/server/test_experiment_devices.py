"""Issue 26, point 2 on the control plane: a trial tunes its device by stable id, and the device
fio reads must be that one; a host where one id names two devices is not taken."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from stortune.schemas.bench.results import BenchmarkResult
from stortune.schemas.topology import Device, DeviceKind, Topology
from stortune.server import RecordingController
from stortune.server.agentclient import BenchmarkOutcome, FakeAgentClients
from tests.server.builders import loop_topology, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, admin_client
from tests.server.test_experiments import FAST, ended, experiment, past_the_baseline, register, submit
from tests.server.tunefakes import SurfaceAgent, experiment_doc


@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


@dataclass
class ReadsElsewhere(SurfaceAgent):
    """Its runs report the target fio opened as ``reads`` (when set): the device names moved
    between the trial's Apply and its benchmark, so fio read another device than the one tuned."""

    reads: str | None = None

    def finish(self, run_id: str, state: str = "done", **kwargs: Any) -> BenchmarkResult:
        result = super().finish(run_id, state, **kwargs)
        if self.reads is None or result.context is None:
            return result
        target = result.context.target.model_copy(update={"device_id": self.reads})
        moved = result.model_copy(update={"context": result.context.model_copy(update={"target": target})})
        outcome = self.outcomes[run_id]
        self.outcomes[run_id] = BenchmarkOutcome(progress=outcome.progress, result=moved,
                                                 raw_files=outcome.raw_files, info=outcome.info)
        return moved


def test_hostile_a_trial_whose_fio_read_another_device_stops_the_experiment_and_puts_the_host_back(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    agent = ReadsElsewhere(address=registration("h1")["address"], topology=loop_topology("h1"), hold=True)
    agents.add(agent)
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        register(client)
        exp_id = submit(client, experiment_doc())
        run_id = past_the_baseline(client, agent, exp_id, eventually)
        assert agent.read_ahead() != 128  # the trial's value is on loop0 (id name:loop0)
        agent.reads = "loop:/srv/other.img"
        agent.finish(run_id)
        doc = eventually(lambda: ended(client, exp_id), what="the experiment stopped")
        status = doc["status"]
        assert status["state"] == "failed", status
        assert "fio read loop:/srv/other.img" in status["hosts"][0]["message"], status["hosts"]
        trial = next(t for t in status["trials"] if t["runId"] == run_id)
        assert trial["state"] == "failed" and "fio read loop:/srv/other.img" in trial["message"]
        assert status["trials"][-1]["runId"] == run_id  # no trial after it
        started = [c[1][0] for c in agent.calls if c[0] == "start_benchmark"]
        assert started[-1] == run_id
        assert agent.read_ahead() == 128  # put back
        last_apply = [c for c in agent.calls if c[0] == "apply"][-1]
        assert not [p for p in last_apply[1][0] if p.metadata.name.startswith("tune-")]
        # The evidence holds no measurement of the run that read the other device.
        measured = [t for t in status["trials"] if t["state"] == "done"]
        assert run_id not in {t["runId"] for t in measured}


def _two_loops_over_one_file() -> Topology:
    one = loop_topology("h1").devices[0].model_copy(update={"id": "loop:/srv/a.img"})
    two = one.model_copy(update={"name": "loop1"})
    other = Device(name="loop2", kind=DeviceKind.LOOP, id="loop:/srv/b.img")
    return Topology(hostname="h1", kernel="6.1.0", devices=[one, two, other])


def test_hostile_a_target_whose_id_another_device_shares_is_not_taken(
        make_app: AppFactory, agents: FakeAgentClients, eventually: Eventually) -> None:
    topology = _two_loops_over_one_file()
    agent = SurfaceAgent(address=registration("h1")["address"], topology=topology)
    agents.add(agent)
    app = make_app(agents=agents, controller=RecordingController(), **FAST)
    with admin_client(app) as client:
        body = registration("h1", topology=topology)
        assert client.post("/api/v1/agents/register", json=body).status_code == 200
        exp_id = submit(client, experiment_doc(target={"device": {"kind": ["loop"], "name": ["loop0"]}}))
        doc = eventually(lambda: ended(client, exp_id), what="the experiment refused on the host")
        status = experiment(client, exp_id)["status"]
        assert doc["status"]["state"] == "failed", status
        assert "loop1 has the id of loop0 (loop:/srv/a.img)" in status["hosts"][0]["message"], status
        assert not [c for c in agent.calls if c[0] in ("apply", "start_benchmark")]
