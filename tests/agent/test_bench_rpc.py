"""A benchmark in the managed agent: applies and restores over gRPC are ABORTED (busy) meanwhile,
and its progress streams through WatchBenchmark."""

from __future__ import annotations

from pathlib import Path

import pytest

from stortune.agent.serve import Agent, ServeOptions
from stortune.api.agent.wire import BenchmarkProgress
from stortune.schemas.bench.spec import BenchmarkSpec, parse_benchmark
from stortune.server.agentclient import AgentBusy, AgentClients, AgentNotFound, AgentRejected
from tests.agent.fakefio import FakeFio, capture
from tests.fixtures.agent_host import Host
from tests.rpc.conftest import call, profile

STREAM = {
    "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "ra-check"},
    "spec": {"target": {"device": {"name": ["loop7"]}},
             "workloads": [{"preset": "stream-32k", "runtime": "1s"}]},
}


def test_an_apply_during_a_benchmark_is_busy_and_waits_for_its_end(agent: Agent, host: Host) -> None:
    node = host.fs.device_node("loop7")
    node.parent.mkdir(parents=True, exist_ok=True)
    with open(node, "wb") as fh:
        fh.truncate(64 << 20)
    fio = FakeFio(capture("fio-3.33-group-reporting.json"), hold=True)
    agent.service.bench.runner = fio
    run_id = agent.service.bench.start(parse_benchmark(STREAM), "bench-1")
    assert fio.running.wait(10)

    with pytest.raises(AgentBusy) as err:
        call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=4096)], {}, "during"))
    assert err.value.retryable and err.value.code == "ABORTED"
    assert "busy: benchmark bench-1 running" in str(err.value)
    with pytest.raises(AgentBusy, match="busy: benchmark bench-1 running"):
        call(lambda c: c.for_address(agent.address).restore())
    assert host.queue("read_ahead_kb") == "128"

    async def watch(clients: AgentClients) -> list[BenchmarkProgress]:
        seen: list[BenchmarkProgress] = []
        async for progress in clients.for_address(agent.address).watch_benchmark(run_id):
            seen.append(progress)
            fio.release.set()  # let the run end once the watcher is attached
        return seen

    seen = call(watch)
    assert seen[0].state == "running" and "stream-32k" in seen[0].message
    assert seen[-1].state == "done" and seen[-1].percent == 100.0
    assert agent.service.bench.wait(run_id, timeout=30).state == "done"

    result = call(lambda c: c.for_address(agent.address).apply([profile(read_ahead_kb=4096)], {}, "after"))
    assert result.ok and host.queue("read_ahead_kb") == "4096"


def _device(host: Host) -> None:
    node = host.fs.device_node("loop7")
    node.parent.mkdir(parents=True, exist_ok=True)
    with open(node, "wb") as fh:
        fh.truncate(64 << 20)


def test_start_cancel_result_and_forget_over_grpc(agent: Agent, host: Host) -> None:
    _device(host)
    fio = FakeFio(capture("fio-3.33-group-reporting.json"), hold=True)
    agent.service.bench.runner = fio
    spec = parse_benchmark(STREAM)

    started = call(lambda c: c.for_address(agent.address).start_benchmark("cp-run-1", spec))
    assert started.run_id == "cp-run-1" and started.state in ("queued", "running")
    assert fio.running.wait(10)
    # A repeated start (the control plane lost the answer) does not start a second run ...
    again = call(lambda c: c.for_address(agent.address).start_benchmark("cp-run-1", spec))
    assert again.run_id == "cp-run-1" and len(fio.calls) == 1
    # ... and another run waits for this one.
    with pytest.raises(AgentBusy, match="busy: benchmark cp-run-1 running"):
        call(lambda c: c.for_address(agent.address).start_benchmark("cp-run-2", spec))

    pending = call(lambda c: c.for_address(agent.address).get_benchmark_result("cp-run-1"))
    assert pending.result is None and not pending.progress.finished

    cancelled, progress = call(lambda c: c.for_address(agent.address).cancel_benchmark("cp-run-1"))
    assert cancelled and progress.run_id == "cp-run-1"
    assert agent.service.bench.wait("cp-run-1", timeout=30).state == "cancelled"
    outcome = call(lambda c: c.for_address(agent.address).get_benchmark_result("cp-run-1"))
    assert outcome.progress.state == "cancelled" and outcome.result is not None
    assert outcome.result.state == "cancelled" and outcome.info.hostname == "rpc-host"

    assert call(lambda c: c.for_address(agent.address).forget_benchmark("cp-run-1")) is True
    assert call(lambda c: c.for_address(agent.address).forget_benchmark("cp-run-1")) is False
    with pytest.raises(AgentNotFound):
        call(lambda c: c.for_address(agent.address).get_benchmark_result("cp-run-1"))


def test_a_finished_run_comes_with_fios_raw_files(agent: Agent, host: Host) -> None:
    _device(host)
    agent.service.bench.runner = FakeFio(capture("fio-3.33-group-reporting.json"))
    spec = parse_benchmark(STREAM)
    call(lambda c: c.for_address(agent.address).start_benchmark("cp-run-3", spec))
    assert agent.service.bench.wait("cp-run-3", timeout=30).state == "done"

    outcome = call(lambda c: c.for_address(agent.address).get_benchmark_result("cp-run-3"))

    assert outcome.result is not None and outcome.result.state == "done"
    outputs = [text for path, text in outcome.raw_files.items() if path.endswith("fio.json")]
    assert outputs == [capture("fio-3.33-group-reporting.json")]
    assert any(path.endswith("job.fio") for path in outcome.raw_files)


def test_an_invalid_spec_is_refused_naming_the_field(agent: Agent) -> None:
    from stortune.api.agent import wire
    from stortune.schemas.documents import DocumentError

    with pytest.raises(DocumentError, match=r"spec_json"):
        wire.start_call(wire.StartBenchmarkRequest(run_id="x", spec_json='{"kind": "BenchmarkSpec"}'))


def file_spec(path: Path) -> BenchmarkSpec:
    return parse_benchmark({
        "apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "file-check"},
        "spec": {"target": {"file": {"path": str(path), "size": "4M"}}, "allowDestructive": True,
                 "workloads": [{"name": "w", "pattern": "write", "blockSize": "4k", "size": "64k"}]},
    })


def test_hostile_a_file_target_outside_the_agents_directories_is_refused_with_the_reason(
        agent: Agent, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    with pytest.raises(AgentRejected) as err:
        call(lambda c: c.for_address(agent.address).start_benchmark("cp-file-1", file_spec(victim)))
    assert err.value.code == "FAILED_PRECONDITION"
    assert err.value.message == (
        f"spec.target.file.path '{victim}': is not inside a benchmark directory of this host"
        f" ({agent.state_dir}/bench-files); the host decides where benchmark files may be written:"
        " stortune-agent serve --bench-dir DIR")
    assert victim.read_text() == "precious\n" and agent.service.bench.runs() == []


def test_a_file_target_in_a_directory_the_host_gave_runs(host: Host, tmp_path: Path) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    served = Agent(host.fs, tmp_path / "state", ServeOptions(
        listen="127.0.0.1:0", rescan_interval=3600, grace=1, insecure=True, bench_dirs=(bench,)))
    served.start()
    try:
        served.service.bench.runner = FakeFio(capture("fio-3.33-group-reporting.json"))
        call(lambda c: c.for_address(served.address).start_benchmark("cp-file-2", file_spec(bench / "x.dat")))
        assert served.service.bench.wait("cp-file-2", timeout=30).state == "done"
        assert list(bench.iterdir()) == []  # made by the run, removed after it
    finally:
        served.stop()
