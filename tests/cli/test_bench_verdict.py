"""The verdict through the control plane: stored in its database with the result, shown by
`stortune bench show` and, for the recommended values' run, by `stortune tune show`; a result
stored before the verdict existed still shows."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stortune.schemas.analysis.members import balance, slow_members
from stortune.schemas.analysis.model import DeviceAnalysis, Layer, LayerKind, Part
from stortune.schemas.analysis.verdict import bottleneck
from stortune.schemas.bench.results import BenchmarkResult, DeviceStats
from stortune.schemas.topology import Device, DeviceKind, DmInfo, ScsiHost, Topology
from stortune.server import RecordingController, Settings, create_app
from stortune.server.agentclient import FakeAgentClients
from tests.cli.conftest import ControlPlane, Run, serve
from tests.cli.test_bench import run_id, spec_file
from tests.cli.test_tune import exp_file
from tests.server.builders import loop_topology
from tests.server.tunefakes import SurfaceAgent

ADDRESS = "127.0.0.1:9"
MB = 1_000_000


def stats(name: str, relation: str, above: str | None, bytes_per_s: float, await_ms: float) -> DeviceStats:
    ios = 1000 if bytes_per_s else 0
    return DeviceStats(device=name, relation=relation, above=above, seconds=1.0, read_ios=ios, write_ios=0,
                       read_bytes=round(bytes_per_s), write_bytes=0, read_iops=ios, write_iops=0.0,
                       read_bytes_per_s=bytes_per_s, write_bytes_per_s=0.0, util_percent=50.0,
                       await_ms=await_ms if ios else None, queue_depth=0.5)


def lun_analysis(target: str) -> DeviceAnalysis:
    ports = [Part(name=host, ceiling_bytes_per_second=797 * MB, source="fc", detail="8GFC", devices=[path])
             for host, path in (("host1", "sdb"), ("host2", "sdc"))]
    return DeviceAnalysis(device=target, kind="dm", layers=[Layer(
        name="host1+host2 qla2xxx", kind=LayerKind.PORT, ceiling_bytes_per_second=1594 * MB,
        source="2 x 8GFC", parts=ports)])


def san() -> Topology:
    paths = [Device(name=p, kind=DeviceKind.DISK, id=f"name:{p}", scsi_host=ScsiHost(name=h))
             for p, h in (("sdb", "host1"), ("sdc", "host2"))]
    lun = Device(name="dm-0", kind=DeviceKind.DM, id="name:dm-0", slaves=["sdb", "sdc"],
                 dm=DmInfo(type="multipath", paths=["sdb", "sdc"]))
    return Topology(devices=[*paths, lun])


def with_verdict(result: BenchmarkResult, measured: float) -> BenchmarkResult:
    """``result`` as an agent judges it: all I/O down sdb (sdc idle), the ports' ceiling the limit."""
    runs = [[stats("dm-0", "target", None, measured, 4.0), stats("sdb", "mpath-path", "dm-0", measured, 4.0),
             stats("sdc", "mpath-path", "dm-0", 0.0, 0.0)] for _ in result.runs]
    steps = dict.fromkeys(r.step for r in result.runs)
    return result.model_copy(update={
        "bottlenecks": [bottleneck(lun_analysis("dm-0"), step, runs[0]) for step in steps],
        "slow_members": slow_members(runs), "balance": balance(san(), [s for run in runs for s in run])})


class VerdictAgent(SurfaceAgent):
    """Results carry a verdict whose measured figure is the run's read bandwidth; ``legacy``:
    results as an agent from before the verdict sends them (without the fields)."""

    legacy: bool = False

    def finish(self, run_id: str, state: str = "done", **kwargs: Any) -> BenchmarkResult:
        result = super().finish(run_id, state, **kwargs)
        bandwidth = result.runs[0].metrics.get("read_bandwidth", 0.0) if result.runs else 0.0
        judged = with_verdict(result, bandwidth)
        if self.legacy:
            old = judged.model_dump(mode="json", exclude={"bottlenecks", "slow_members", "balance"})
            assert "bottlenecks" not in old
            judged = BenchmarkResult.model_validate(old)
        outcome = self.outcomes[run_id]
        self.outcomes[run_id] = type(outcome)(progress=outcome.progress, result=judged,
                                              raw_files=outcome.raw_files, info=outcome.info)
        return judged


@pytest.fixture
def agent() -> VerdictAgent:
    return VerdictAgent(address=ADDRESS, topology=loop_topology("web-1"))


@pytest.fixture
def control_plane(tmp_path: Path, agent: VerdictAgent) -> Iterator[ControlPlane]:
    agents = FakeAgentClients()
    agents.add(agent)
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'control-plane.db'}", benchmark_interval_s=0.05,
                              experiment_interval_s=0.05), controller=RecordingController(), agents=agents)
    yield from serve(app)


@pytest.fixture
def fleet(control_plane: ControlPlane) -> ControlPlane:
    control_plane.register("web-1", {"role": "streamer"}, devices=list(loop_topology("web-1").devices))
    return control_plane


def test_bench_show_says_where_the_limit_is_and_names_the_idle_path(
        fleet: ControlPlane, stortune: Run, tmp_path: Path, agent: VerdictAgent) -> None:
    done = stortune("bench", "run", "-f", str(spec_file(tmp_path, repeats=1)))
    assert done.code == 0, done.err
    rid = run_id(done.out)
    shown = stortune("bench", "show", rid)
    assert shown.code == 0, shown.err
    text = [line.strip() for line in shown.out.splitlines()]
    limit = next(line for line in text if line.startswith("seq-1m/read: limit "))
    assert limit.startswith("seq-1m/read: limit host1+host2 qla2xxx, 2 x 8GFC = 1,594 MB/s: measured ")
    assert "path of dm-0 sdc via host2: idle against an even 50 %" in text
    assert "port host2: idle against an even 50 %" in text
    assert not any(line.startswith("slow member") for line in text)  # idle is not slow


def test_a_result_stored_without_a_verdict_still_shows(fleet: ControlPlane, stortune: Run, tmp_path: Path,
                                                       agent: VerdictAgent) -> None:
    agent.legacy = True  # an agent from before the verdict: its results lack the fields
    done = stortune("bench", "run", "-f", str(spec_file(tmp_path, repeats=1)))
    assert done.code == 0, done.err
    rid = run_id(done.out)
    # ... and the row as a server from before the verdict stored it: without the keys at all
    with sqlite3.connect(tmp_path / "control-plane.db") as db:
        changed = db.execute("UPDATE benchmark_runs SET result = json_remove(result, '$.bottlenecks',"
                             " '$.slow_members', '$.balance') WHERE id = ?", (rid,)).rowcount
        (stored,) = db.execute("SELECT result FROM benchmark_runs WHERE id = ?", (rid,)).fetchone()
    assert changed == 1 and "bottlenecks" not in stored and "runs" in stored
    shown = stortune("bench", "show", rid)
    assert shown.code == 0, shown.err
    assert "Results (mean" in shown.out and "Where the limit is" not in shown.out
    compared = stortune("bench", "compare", rid, rid)  # the server reads the row as a model
    assert compared.code == 0, compared.err


def test_tune_show_gives_the_winners_bottleneck(fleet: ControlPlane, stortune: Run, tmp_path: Path) -> None:
    result = stortune("tune", "run", "-f", str(exp_file(tmp_path)), "--poll", "0.05")
    assert result.code == 0, result.out + result.err
    exp_id = result.out.splitlines()[0].split()[0].removeprefix("tuningexperiment/")
    shown = stortune("tune", "show", exp_id)
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    head = next(i for i, line in enumerate(lines)
                if "where the limit is at the recommendation on web-1" in line)
    assert ": limit host1+host2 qla2xxx, 2 x 8GFC = 1,594 MB/s: measured " in lines[head + 1]
