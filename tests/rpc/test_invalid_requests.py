"""Hostile and repeated agent RPCs over real gRPC on loopback: what a caller gets wrong is
INVALID_ARGUMENT naming the field (never INTERNAL, never a traceback in the agent's log), and
forgetting a benchmark run twice, or twice at once, is not an error."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Iterator

import grpc
import pytest

from stortune.agent.serve import Agent
from stortune.api.agent import wire
from stortune.server.agentclient import AgentClients, AgentRejected, SettingKey
from tests.fixtures.agent_host import LOOP_ID, Host
from tests.rpc.conftest import call, profile


@pytest.fixture
def agent_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The agent's log records (the service runs in this process); none may carry a traceback."""
    caplog.set_level(logging.INFO, logger="stortune")
    yield caplog
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert tracebacks == []


def restore_refused(agent: Agent, keys: set[SettingKey]) -> str:
    with pytest.raises(AgentRejected) as err:
        call(lambda c: c.for_address(agent.address).restore(keys))
    assert err.value.code == "INVALID_ARGUMENT"
    prefix = "invalid Restore request:\n"
    assert err.value.message.startswith(prefix), err.value.message
    return err.value.message.removeprefix(prefix)


KNOWN = ("add_random, controller_read_ahead, controller_write_cache, dev.raid.speed_limit_max,"
         " dev.raid.speed_limit_min, drive_write_cache, group_thread_cnt, iostats, max_sectors_kb, nomerges,"
         " nr_requests, queue_depth, read_ahead_kb, rq_affinity, scheduler, stripe_cache_size,"
         " sync_speed_max, sync_speed_min, wbt_lat_usec")


@pytest.mark.parametrize("tunable", ["no_such_tunable", "scheduler\x00", "read_ahead_kb ", "../queue/x",
                                     "x" * 10_000])
def test_hostile_restore_of_an_unknown_tunable_is_invalid_argument(agent: Agent, host: Host,
                                                                    agent_log: pytest.LogCaptureFixture,
                                                                    tunable: str) -> None:
    call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=4096)], {}, "a"))
    why = restore_refused(agent, {(LOOP_ID, "read_ahead_kb"), (LOOP_ID, tunable)})
    shown = repr(tunable if len(tunable) <= 80 else tunable[:80] + "...")
    assert why.endswith(f".tunable: {shown} is not a tunable of the catalog; known: {KNOWN}")
    assert why.startswith(("only[0].tunable", "only[1].tunable"))
    assert host.queue("read_ahead_kb") == "4096"  # nothing restored: the request was refused whole


@pytest.mark.parametrize(("device_id", "why"), [
    ("../../x", "no device '../../x' on this host, and no recorded original for it"),
    ("/tmp/x", "no device '/tmp/x' on this host, and no recorded original for it"),
    ("wwn:0x5000c500deadbeef", "no device 'wwn:0x5000c500deadbeef' on this host, and no recorded"
                               " original for it"),
    ("loop:/var/tmp/rpc-test.img\n", "'loop:/var/tmp/rpc-test.img\\n' is not a device id (printable"
                                     " text of at most 4200 characters, such as wwn:... or loop:/path)"),
    ("name:" + "x" * 5000, "'name:" + "x" * 75 + "...' is not a device id (printable text of at most"
                           " 4200 characters, such as wwn:... or loop:/path)"),
])
def test_hostile_restore_of_an_unknown_or_bad_device_is_invalid_argument(
        agent: Agent, agent_log: pytest.LogCaptureFixture, device_id: str, why: str) -> None:
    assert restore_refused(agent, {(device_id, "read_ahead_kb")}) == f"only[0].device_id: {why}"


def test_restoring_a_device_here_without_an_original_is_fine(agent: Agent, host: Host,
                                                             agent_log: pytest.LogCaptureFixture) -> None:
    # A repeated restore finds its originals already dropped: nothing to do, not an error.
    result = call(lambda c: c.for_address(agent.address).restore({(LOOP_ID, "nr_requests")}))
    assert result.ok and result.report["messages"] == ["no recorded originals to restore"]
    host_id = f"host:{agent.service.host().hostname}"
    assert call(lambda c: c.for_address(agent.address).restore({(host_id, "dev.raid.speed_limit_max")})).ok


def test_a_device_that_is_gone_can_still_be_named_by_its_recorded_original(
        agent: Agent, host: Host, agent_log: pytest.LogCaptureFixture) -> None:
    call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=4096)], {}, "a"))
    for link in ("block/loop7", "class/block/loop7"):  # unplugged
        (host.fs.sysfs / link).unlink()
    result = call(lambda c: c.for_address(agent.address).restore({(LOOP_ID, "read_ahead_kb")}))
    assert result.ok and [r["status"] for r in result.report["rows"]] == ["vanished"]


def raw_apply(agent: Agent, document: dict[str, object]) -> grpc.RpcError:
    with grpc.insecure_channel(agent.address) as channel:
        stub = wire.agent_stub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Apply(wire.ApplyRequest(profiles_json=[json.dumps(document)], request_id="raw"),
                       timeout=30)
    return err.value


@pytest.mark.parametrize(("rule", "where"), [
    ({"settings": {"no_such_tunable": 1}}, "spec.rules[0].settings.no_such_tunable: unknown field"),
    ({"settings": {"read_ahead_kb": 4096, "scheduler\x00": "none"}}, "spec.rules[0].settings.scheduler\x00"),
    ({"match": {"name": ["../../x"]}},
     "spec.rules[0].match.name: '../../x' is not a kernel device name glob"),
    ({"match": {"name": ["sd\x00a"]}}, "spec.rules[0].match.name"),
])
def test_hostile_apply_naming_an_unknown_tunable_or_a_bad_device_is_invalid_argument(
        agent: Agent, host: Host, agent_log: pytest.LogCaptureFixture, rule: dict[str, object],
        where: str) -> None:
    document = copy.deepcopy(profile(read_ahead_kb=4096).document())
    document["spec"]["rules"][0].update(rule)
    err = raw_apply(agent, document)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"profiles_json[0] (StorageProfile/rpc-test): {where}" in (err.details() or "")
    assert host.queue("read_ahead_kb") == "128"


# -- ForgetBenchmark -----------------------------------------------------------------------------
def stored_run(agent: Agent, run_id: str, files: int) -> None:
    """A finished run on the agent's disk, with many step files (its removal takes a while)."""
    store = agent.service.bench.store
    where = store.create(run_id, {"kind": "BenchmarkSpec"})
    for index in range(files):
        step = store.step_dir(run_id, index, "seq", 0)
        for name in ("job.fio", "fio.json", "stderr.txt"):
            (step / name).write_text("x")
    (where / "result.json").write_text("{}")


def test_a_second_forget_of_the_same_run_is_ok_and_forgets_nothing(
        agent: Agent, agent_log: pytest.LogCaptureFixture) -> None:
    stored_run(agent, "run-1", 3)
    assert call(lambda c: c.for_address(agent.address).forget_benchmark("run-1")) is True
    assert call(lambda c: c.for_address(agent.address).forget_benchmark("run-1")) is False
    assert agent.service.bench.runs() == []


def test_forgets_of_the_same_run_at_once_all_succeed_and_one_forgets_it(
        agent: Agent, agent_log: pytest.LogCaptureFixture) -> None:
    """Two control planes (or a retry while the first call still deletes) forget one run at once."""
    stored_run(agent, "run-2", 1000)

    async def at_once(clients: AgentClients) -> list[bool]:
        client = clients.for_address(agent.address)
        return list(await asyncio.gather(*(client.forget_benchmark("run-2") for _ in range(8))))

    assert sorted(call(at_once)) == [False] * 7 + [True]
    assert agent.service.bench.runs() == []
    assert list(agent.service.bench.store.root.iterdir()) == []


def test_a_forget_interrupted_by_a_crash_is_finished_by_the_next(
        agent: Agent, agent_log: pytest.LogCaptureFixture) -> None:
    stored_run(agent, "run-3", 2)
    stored_run(agent, "run-4", 2)
    root = agent.service.bench.store.root
    (root / "run-3").rename(root / ".forgotten-run-3-0000abcd")  # the agent died while deleting it
    assert agent.service.bench.runs() == ["run-4"]
    assert call(lambda c: c.for_address(agent.address).forget_benchmark("run-3")) is False
    assert call(lambda c: c.for_address(agent.address).forget_benchmark("run-4")) is True
    assert list(root.iterdir()) == []
