"""Every AgentService RPC through the control plane's real client, over loopback gRPC."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from stortune.agent import journal
from stortune.agent.serve import Agent
from stortune.api.agent.wire import BenchmarkProgress
from stortune.server.agentclient import (
    AgentBusy,
    AgentClients,
    AgentNotFound,
    AgentRejected,
    AgentUnreachable,
    Timeouts,
)
from tests.fixtures.agent_host import BOOT_ID, LOOP_ID, Host
from tests.rpc.conftest import call, free_port, profile


def test_get_topology_returns_the_host_and_its_devices(agent: Agent) -> None:
    info, topology, topology_hash = call(lambda c: c.for_address(agent.address).get_topology())
    assert (info.hostname, info.kernel, info.boot_id) == ("rpc-host", "6.1.0-18-amd64", BOOT_ID)
    assert info.agent_version and info.agent_started_unix > 0
    loop = topology.device("loop7")
    assert loop is not None and loop.id == LOOP_ID
    assert loop.tunables["read_ahead_kb"].value == 128
    assert topology_hash == topology.structure_hash()


def test_get_observed_returns_current_values_and_the_same_hash(agent: Agent) -> None:
    async def both(clients: AgentClients) -> tuple[str, object, str]:
        client = clients.for_address(agent.address)
        _, _, topo_hash = await client.get_topology()
        answer = await client.get_observed()
        return topo_hash, answer.observed, answer.topology_hash

    topo_hash, observed, obs_hash = call(both)
    assert obs_hash == topo_hash
    assert isinstance(observed, dict)
    assert observed["loop7"]["read_ahead_kb"].value == 128
    assert observed["loop7"]["scheduler"].value == "none"


def test_plan_is_a_dry_run(agent: Agent, host: Host) -> None:
    plan = call(lambda c: c.for_address(agent.address).plan([profile(read_ahead_kb=4096)]))
    assert [(c.device, c.tunable, c.current, c.desired) for c in plan.changes] == [
        ("loop7", "read_ahead_kb", 128, 4096)]
    assert host.queue("read_ahead_kb") == "128"


def test_apply_writes_the_device_and_reports(agent: Agent, host: Host) -> None:
    result = call(lambda c: c.for_address(agent.address).apply(
        [profile(read_ahead_kb=4096)], {"rpc-test": 3}, "req-1"))
    assert result.ok, result.report
    assert host.queue("read_ahead_kb") == "4096"
    assert [(r["tunable"], r["before"], r["after"], r["status"]) for r in result.report["rows"]] == [
        ("read_ahead_kb", 128, 4096, "applied")]
    assert result.applied_generations == {"rpc-test": 3}
    assert result.request_id == "req-1"
    assert result.plan.changes == []  # planned again after the apply: in sync
    assert [d.in_sync for d in result.plan.desired] == [True]
    assert result.info.boot_id == BOOT_ID

    answer = call(lambda c: c.for_address(agent.address).get_observed())
    assert answer.observed["loop7"]["read_ahead_kb"].value == 4096


def test_apply_with_no_profiles_restores_the_originals(agent: Agent, host: Host) -> None:
    async def scenario(clients: AgentClients) -> tuple[bool, bool]:
        client = clients.for_address(agent.address)
        first = await client.apply([profile(read_ahead_kb=4096, nr_requests=64)], {}, "a")
        assert host.queue("read_ahead_kb") == "4096" and host.queue("nr_requests") == "64"
        second = await client.apply([], {}, "b")
        return first.ok, second.ok

    assert call(scenario) == (True, True)
    assert (host.queue("read_ahead_kb"), host.queue("nr_requests")) == ("128", "128")


def test_values_carry_their_recorded_originals_and_plans_show_restorations(agent: Agent, host: Host) -> None:
    """What the control plane plans dry runs and drift with: after an apply, GetObserved and
    GetTopology report each changed value's original, and Plan without that setting shows it
    put back (the agent's journal is the only place that knows it)."""
    async def scenario(clients: AgentClients) -> None:
        client = clients.for_address(agent.address)
        before = await client.get_observed()
        assert before.observed["loop7"]["read_ahead_kb"].original is None
        await client.apply([profile(read_ahead_kb=4096)], {}, "a")
        answer = await client.get_observed()
        state = answer.observed["loop7"]["read_ahead_kb"]
        assert (state.value, state.original and state.original.value) == (4096, 128)
        assert answer.digest != before.digest  # a new original is a change the reconciler must see
        _, topology, _ = await client.get_topology()
        loop = topology.device("loop7")
        assert loop is not None and loop.tunables["read_ahead_kb"].original is not None
        plan = await client.plan([profile(nr_requests=64)])
        assert [(r.device, r.tunable, r.current, r.desired, r.to) for r in plan.restorations] == [
            ("loop7", "read_ahead_kb", 4096, 128, "original")]
        assert not plan.empty

    call(scenario)


def test_restore_puts_back_all_or_only_the_given_keys(agent: Agent, host: Host) -> None:
    async def scenario(clients: AgentClients) -> None:
        client = clients.for_address(agent.address)
        await client.apply([profile(read_ahead_kb=4096, nr_requests=64)], {}, "a")
        partial = await client.restore({(LOOP_ID, "read_ahead_kb")})
        assert partial.ok
        assert (host.queue("read_ahead_kb"), host.queue("nr_requests")) == ("128", "64")
        everything = await client.restore()
        assert everything.ok
        assert [r["tunable"] for r in everything.report["rows"]] == ["nr_requests"]

    call(scenario)
    assert host.queue("nr_requests") == "128"


def test_an_invalid_profile_is_rejected_with_its_field_path(agent: Agent, host: Host) -> None:
    valid = profile(read_ahead_kb=4096)
    rule = valid.spec.rules[0]
    # model_copy skips validation: this is what a buggy or hostile control plane could send.
    bad_rule = rule.model_copy(update={"settings": rule.settings.model_copy(update={"read_ahead_kb": -5})})
    bad = valid.model_copy(update={"spec": valid.spec.model_copy(update={"rules": [bad_rule]})})
    with pytest.raises(AgentRejected) as err:
        call(lambda c: c.for_address(agent.address).apply([bad], {}, "bad"))
    assert err.value.code == "INVALID_ARGUMENT"
    where = "profiles_json[0] (StorageProfile/rpc-test): spec.rules[0].settings.read_ahead_kb"
    assert where in str(err.value)
    assert host.queue("read_ahead_kb") == "128"


def test_generations_must_name_a_profile_of_the_request(agent: Agent) -> None:
    with pytest.raises(AgentRejected, match="generations: other"):
        call(lambda c: c.for_address(agent.address).apply([profile()], {"other": 1}, "g"))


def test_a_closed_port_is_unreachable_connection_refused() -> None:
    with pytest.raises(AgentUnreachable) as err:
        call(lambda c: c.for_address(f"127.0.0.1:{free_port()}").get_topology())
    assert err.value.reason == "connection refused"
    assert err.value.retryable


def test_a_silent_peer_is_unreachable_deadline_exceeded() -> None:
    # Accepts TCP connections but never speaks HTTP/2.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(AgentUnreachable) as err:
            call(lambda c: c.for_address(address).get_observed(), Timeouts(read=0.5))
    assert err.value.reason == "deadline exceeded"


def test_applies_wait_for_each_other(agent: Agent, host: Host) -> None:
    """The servicer's lock (shared with the hot-plug loop) serialises applies."""
    with agent.apply_lock, pytest.raises(AgentUnreachable, match="deadline exceeded"):
        call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=8192)], {}, "blocked"),
             Timeouts(apply=0.5))
    # The blocked call's caller is gone: the agent drops it instead of applying it late.
    time.sleep(0.5)
    assert host.queue("read_ahead_kb") == "128"
    result = call(lambda c: c.for_address(agent.address).apply([profile()], {}, "after"))
    assert result.ok and host.queue("read_ahead_kb") == "4096"


def test_a_state_dir_locked_by_another_process_is_busy(agent: Agent, tmp_path: Path) -> None:
    with journal.lock(tmp_path / "state"), pytest.raises(AgentBusy) as err:
        call(lambda c: c.for_address(agent.address).apply([profile()], {}, "busy"))
    assert err.value.retryable and err.value.code == "ABORTED"


def test_watch_benchmark_streams_until_the_run_ends(agent: Agent) -> None:
    steps = [BenchmarkProgress("run-1", "queued"),
             BenchmarkProgress("run-1", "running", percent=10, read_iops=1000, eta_seconds=9),
             BenchmarkProgress("run-1", "running", percent=60, read_iops=1200, eta_seconds=4),
             BenchmarkProgress("run-1", "done", percent=100, read_iops=1100, message="ok")]
    agent.benchmarks.publish(steps[0])

    async def watch(clients: AgentClients) -> list[BenchmarkProgress]:
        seen: list[BenchmarkProgress] = []
        async for progress in clients.for_address(agent.address).watch_benchmark("run-1"):
            seen.append(progress)
            if len(seen) < len(steps):  # the test drives the run one step per update seen
                agent.benchmarks.publish(steps[len(seen)])
        return seen

    assert call(watch) == steps


def test_watch_benchmark_sees_the_end_of_a_run_driven_by_another_thread(agent: Agent) -> None:
    agent.benchmarks.publish(BenchmarkProgress("run-2", "queued"))

    def run() -> None:
        for pct in range(0, 101, 5):
            agent.benchmarks.publish(BenchmarkProgress("run-2", "running", percent=pct))
        agent.benchmarks.publish(BenchmarkProgress("run-2", "failed", percent=100, message="fio died"))

    publisher = threading.Thread(target=run)

    async def watch(clients: AgentClients) -> list[BenchmarkProgress]:
        seen: list[BenchmarkProgress] = []
        async for progress in clients.for_address(agent.address).watch_benchmark("run-2"):
            if not seen:
                publisher.start()
            seen.append(progress)
        return seen

    seen = call(watch)
    publisher.join(5)
    assert seen[-1].state == "failed" and seen[-1].message == "fio died"
    percents = [p.percent for p in seen]
    assert percents == sorted(percents)  # may skip updates, never goes back


def test_watching_an_unknown_run_is_not_found(agent: Agent) -> None:
    async def watch(clients: AgentClients) -> None:
        async for _ in clients.for_address(agent.address).watch_benchmark("nope"):
            pass

    with pytest.raises(AgentNotFound, match="no benchmark run 'nope'"):
        call(watch)


def test_a_watcher_that_stops_early_releases_the_agent(agent: Agent) -> None:
    agent.benchmarks.publish(BenchmarkProgress("run-3", "running", percent=1))

    async def first(clients: AgentClients) -> BenchmarkProgress:
        async for progress in clients.for_address(agent.address).watch_benchmark("run-3"):
            return progress
        raise AssertionError("no progress")

    for _ in range(agent.options.workers + 2):  # more than the worker threads
        assert call(first).percent == 1
    # Had the cancelled watches kept their worker threads, this would time out.
    call(lambda c: c.for_address(agent.address).get_observed(), Timeouts(read=5))


def test_channels_are_cached_per_address(agent: Agent) -> None:
    async def scenario(clients: AgentClients) -> bool:
        await clients.for_address(agent.address).get_observed()
        stub = clients.stub(agent.address)
        await clients.for_address(agent.address).get_observed()
        return clients.stub(agent.address) is stub

    assert call(scenario)


def test_collect_diagnostics_streams_the_hosts_bundle(host: Host, tmp_path: Path) -> None:
    from stortune.agent.serve import Agent, ServeOptions
    from stortune.schemas.bundle import unpack, verify

    no_tools = tmp_path / "no-tools"
    no_tools.mkdir()
    running = Agent(host.fs, tmp_path / "diag-state",
                    ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1,
                                 tool_path=str(no_tools), insecure=True))
    running.start()
    try:
        data = call(lambda c: c.for_address(running.address).collect_diagnostics(5.0))
    finally:
        running.stop()
    assert verify(data) == []
    bundle = unpack(data)
    assert bundle.info.host == "rpc-host"
    assert "topology.json" in bundle.files and "proc/partitions" in bundle.files
    assert {m.tool for m in bundle.info.missing} >= {"lsblk", "dmesg"}
