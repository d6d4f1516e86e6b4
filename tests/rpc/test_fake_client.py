"""FakeAgentClient behaves like the real agent behind AgentClient.

The same scenarios run against the real agent over gRPC and against the fake
built from the same host's topology; the server's unit tests can then trust
the fake.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from stortune.agent import local
from stortune.agent.serve import Agent
from stortune.api.agent.wire import BenchmarkProgress
from stortune.server.agentclient import (
    AgentClient,
    AgentClients,
    AgentNotFound,
    AgentUnreachable,
    FakeAgentClient,
    FakeAgentClients,
)
from tests.fixtures.agent_host import LOOP_ID, Host
from tests.rpc.conftest import call, profile

Scenario = Callable[[AgentClient], Awaitable[Any]]


@pytest.fixture(params=["real", "fake"])
def run(request: pytest.FixtureRequest, host: Host) -> Iterator[Callable[[Scenario], Any]]:
    if request.param == "real":
        agent: Agent = request.getfixturevalue("agent")
        agent.benchmarks.publish(BenchmarkProgress("b1", "running", percent=50))
        agent.benchmarks.publish(BenchmarkProgress("b1", "done", percent=100))

        def real(scenario: Scenario) -> Any:
            return call(lambda clients: scenario(clients.for_address(agent.address)))

        yield real
    else:
        fake = FakeAgentClient(topology=local.discover(host.fs),
                               benchmarks={"b1": [BenchmarkProgress("b1", "done", percent=100)]})

        def faked(scenario: Scenario) -> Any:
            return call(lambda _clients: scenario(fake))

        yield faked


async def _value(client: AgentClient, tunable: str) -> Any:
    return (await client.get_observed()).observed["loop7"][tunable].value


def test_plan_apply_replan_restore(run: Callable[[Scenario], Any]) -> None:
    async def scenario(client: AgentClient) -> None:
        wanted = [profile(read_ahead_kb=4096, nr_requests=64)]
        plan = await client.plan(wanted)
        assert sorted((c.tunable, c.desired) for c in plan.changes) == [
            ("nr_requests", 64), ("read_ahead_kb", 4096)]
        result = await client.apply(wanted, {"rpc-test": 2}, "r1")
        assert result.ok and result.plan.changes == [] and result.applied_generations == {"rpc-test": 2}
        assert sorted(r["tunable"] for r in result.report["rows"] if r["status"] == "applied") == [
            "nr_requests", "read_ahead_kb"]
        assert (await client.plan(wanted)).changes == []
        assert await _value(client, "read_ahead_kb") == 4096

        narrower = await client.apply([profile(read_ahead_kb=4096)], {}, "r2")
        assert [(r["tunable"], r["status"]) for r in narrower.report["rows"]] == [
            ("nr_requests", "restored")]
        assert await _value(client, "nr_requests") == 128

        restored = await client.restore({(LOOP_ID, "read_ahead_kb")})
        assert restored.ok and [r["tunable"] for r in restored.report["rows"]] == ["read_ahead_kb"]
        assert await _value(client, "read_ahead_kb") == 128

    run(scenario)


def test_topology_and_observed_agree(run: Callable[[Scenario], Any]) -> None:
    async def scenario(client: AgentClient) -> None:
        _, topology, topo_hash = await client.get_topology()
        answer = await client.get_observed()
        assert topo_hash == answer.topology_hash == topology.structure_hash()
        assert answer.observed["loop7"] == topology.devices[0].tunables

    run(scenario)


def test_benchmark_watch(run: Callable[[Scenario], Any]) -> None:
    async def scenario(client: AgentClient) -> None:
        seen = [p async for p in client.watch_benchmark("b1")]
        assert seen[-1] == BenchmarkProgress("b1", "done", percent=100)
        with pytest.raises(AgentNotFound):
            async for _ in client.watch_benchmark("missing"):
                pass

    run(scenario)


def test_the_fake_fails_on_demand_and_records_calls() -> None:
    clients = FakeAgentClients()
    fake = clients.for_address("10.0.0.1:50051")
    assert clients.for_address("10.0.0.1:50051") is fake
    fake.fail("apply", AgentUnreachable(fake.address, "deadline exceeded"), times=1)

    async def scenario() -> None:
        with pytest.raises(AgentUnreachable, match="deadline exceeded"):
            await fake.apply([], {}, "x")
        assert (await fake.apply([], {}, "y")).ok
        fake.unreachable()
        with pytest.raises(AgentUnreachable, match="connection refused"):
            await fake.get_observed()

    call(lambda _c: scenario())
    assert [name for name, _ in fake.calls] == ["apply", "apply", "get_observed"]


def test_the_real_factory_and_the_fake_factory_fit_the_same_seam() -> None:
    def address_of(factory: Any, address: str) -> str:
        client: AgentClient = factory.for_address(address)
        return client.address

    assert address_of(FakeAgentClients(), "a:1") == "a:1"
    assert address_of(AgentClients(), "b:2") == "b:2"
