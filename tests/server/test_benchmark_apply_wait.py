"""No profile apply while a host benchmarks: the apply waits, and says why, without a storm of failures.

The agent refuses Apply while a benchmark holds the host (ABORTED, "busy:
benchmark <id> running"); the reconciler retries with backoff, shows
Applied=False WaitingForBenchmark (one Normal event, no warning), and applies as
soon as the run's end is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stortune.schemas.profile import StorageProfile
from stortune.server.agentclient import AgentBusy, ApplyResult, FakeAgentClients
from stortune.server.reconciler.report import WAITING, Outcome, conclude
from tests.server.benchfakes import BenchAgent, streamers
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, admin_client
from tests.server.test_reconcile import host_info
from tests.server.test_reconcile_decide import decision_for, profile, seen, topology, view

ADDRESS = registration("h1")["address"]


@dataclass
class BenchmarkingAgent(BenchAgent):
    """Refuses applies while one of its benchmark runs has not ended, as the real agent does."""

    async def apply(self, profiles: Sequence[StorageProfile], generations: Mapping[str, int],
                    request_id: str, *, ram_share: float | None = None) -> ApplyResult:
        running = [r for r in self.started if not self._latest(r).finished]
        if running:
            self.calls.append(("apply", (list(profiles), dict(generations), request_id)))
            message = (f"busy: benchmark {running[0]} running; settings cannot change until it ends "
                       "(wait, or cancel the benchmark) and retry")
            raise AgentBusy(self.address, message, "ABORTED")
        return await super().apply(profiles, generations, request_id, ram_share=ram_share)


def test_an_apply_waits_for_the_benchmark_and_says_so(
        make_app: AppFactory, eventually: Eventually) -> None:
    agents = FakeAgentClients()
    agent = agents.add(BenchmarkingAgent(address=ADDRESS, topology=loop_topology(), info=host_info(),
                                         auto=False))
    assert isinstance(agent, BenchmarkingAgent)
    app = make_app(agents=agents, reconcile_interval_s=0.2, benchmark_interval_s=0.05)
    with admin_client(app) as client:
        body = registration("h1", topology=loop_topology())
        assert client.post(f"{API}/agents/register", json=body).status_code == 200
        (item,) = client.post(f"{API}/benchmarks/runs", json=streamers()).json()["items"]
        run_id = item["metadata"]["name"]
        eventually(lambda: client.get(f"{API}/benchmarks/runs/{run_id}").json()["status"]["state"]
                   == "running", what="benchmark running")

        assert client.post(f"{API}/profiles", json=profile_doc()).status_code == 201

        def applied() -> dict[str, Any] | None:
            conditions = client.get(f"{API}/hosts/h1/status").json()["conditions"]
            return next((c for c in conditions if c["type"] == "Applied"), None)

        waiting = eventually(lambda: (c := applied()) is not None and c["reason"] == WAITING and c,
                             what="Applied=False WaitingForBenchmark")
        assert waiting["status"] == "False"
        assert waiting["message"] == (f"the apply waits for benchmark {run_id} to end: settings do not "
                                      "change under a measurement")
        conditions = client.get(f"{API}/hosts/h1/status").json()["conditions"]
        ready = next(c for c in conditions if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", WAITING)
        tries = sum(name == "apply" for name, _ in agent.calls)
        eventually(lambda: sum(name == "apply" for name, _ in agent.calls) >= tries + 2, what="retried")
        events = client.get(f"{API}/events", params={"host": "h1"}).json()["items"]
        assert [(e["type"], e["count"]) for e in events if e["reason"] == WAITING] == [("Normal", 1)]
        assert not [e for e in events if e["type"] == "Warning"], events

        agent.finish(run_id)
        eventually(lambda: (c := applied()) is not None and c["status"] == "True",
                   what="applied after the run")
        loop = agent.topology.device("loop0")
        assert loop is not None and loop.tunables["read_ahead_kb"].value == 4096


def test_only_a_benchmark_makes_the_apply_wait() -> None:
    v = view((profile(),), {})
    d = decision_for(v, 128)
    locked = conclude(v, seen(topology(128)), d, Outcome(error=AgentBusy(ADDRESS, "state directory locked")))
    assert locked.retry and "Applied" not in locked.conditions and not locked.events
    busy = AgentBusy(ADDRESS, "busy: benchmark 20250301-120000-ab12cd34 running; settings cannot change")
    waiting = conclude(v, seen(topology(128)), d, Outcome(error=busy))
    assert waiting.retry
    assert waiting.conditions["Applied"] == ("False", WAITING, "the apply waits for benchmark "
                                             "20250301-120000-ab12cd34 to end: settings do not change under "
                                             "a measurement")
    assert [(e.type, e.reason) for e in waiting.events] == [("Normal", WAITING)]


def test_an_apply_waits_for_an_experiment_the_agent_runs_itself() -> None:
    """stortune-agent tune holds the host: the apply waits and the host says which experiment."""
    from stortune.server.reconciler.report import EXPERIMENT_RUNNING

    v = view((profile(),), {})
    busy = AgentBusy(ADDRESS, "busy: experiment local-demo-readahead-1a2b running; settings cannot change")
    waiting = conclude(v, seen(topology(128)), decision_for(v, 128), Outcome(error=busy))
    assert waiting.retry
    status, reason, message = waiting.conditions["Applied"]
    assert (status, reason) == ("False", EXPERIMENT_RUNNING) and "local-demo-readahead-1a2b" in message
    assert [(e.type, e.reason) for e in waiting.events] == [("Normal", EXPERIMENT_RUNNING)]
