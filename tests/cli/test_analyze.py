"""`stortune analyze host` and `stortune probe` against the real control plane over TCP; the
agent behind it is the fake RPC seam (the agent's probe runs on loop devices in
tests/agent/test_probe_loop.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from stortune.agent.discovery import discover
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.probe import ProbeResult, ScalingPoint
from stortune.schemas.topology import Topology
from stortune.server import RecordingController, Settings, create_app
from stortune.server.agentclient import FakeAgentClient, FakeAgentClients
from tests.agent.test_render_controllers import inventory
from tests.cli.conftest import ControlPlane, Run, serve
from tests.fixtures.scenarios import SCENARIOS
from tests.schemas.topologies import perc_volume

ADDRESS = "127.0.0.1:9"


@pytest.fixture
def agent(tmp_path: Path) -> FakeAgentClient:
    topology = discover(SCENARIOS["san_8gfc_24lun"](tmp_path / "san"))
    return FakeAgentClient(address=ADDRESS, topology=topology)


@pytest.fixture
def control_plane(tmp_path: Path, agent: FakeAgentClient) -> Iterator[ControlPlane]:
    agents = FakeAgentClients()
    agents.add(agent)
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'control-plane.db'}"),
                     controller=RecordingController(), agents=agents)
    yield from serve(app)


@pytest.fixture
def san(control_plane: ControlPlane, agent: FakeAgentClient) -> ControlPlane:
    with control_plane.http() as http:
        for name, topology in (("san01", agent.topology), ("bare", None)):
            body: dict[str, object] = {"name": name, "address": ADDRESS if topology else "127.0.0.1:10",
                                       "facts": {"kernel": "6.1.0"}}
            if topology is not None:
                body["topology"] = topology.model_dump(mode="json")
            assert http.post("/agents/register", json=body).status_code == 200
    return control_plane


def test_a_host_without_topology_or_no_host_is_an_error_not_a_traceback(san: ControlPlane,
                                                                        stortune: Run) -> None:
    missing = stortune("analyze", "host", "bare")
    assert missing.code == 1 and "not reported its topology" in missing.err
    ghost = stortune("analyze", "host", "ghost")
    assert ghost.code == 1 and "ghost" in ghost.err and "Traceback" not in ghost.err
    bad = stortune("analyze", "host", "san01", "--runs", "0")
    assert bad.code == 1 and "--runs" in bad.err


def test_the_table_shows_each_lun_limited_by_the_two_ports(san: ControlPlane, stortune: Run) -> None:
    shown = stortune("analyze", "host", "san01", "--device", "dm-0")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0].startswith("dm-0 (dm): ceiling 1,594 MB/s, limited by host1+host2 qla2xxx")
    port = next(line for line in lines if "<- limit" in line)
    assert "host1+host2 qla2xxx" in port and "1,594 MB/s" in port and "port" in port
    assert any("4,000 MB/s" in line and "pci" in line for line in lines)
    assert not any(line.startswith("dm-1 ") for line in lines)


def test_json_carries_layers_with_their_sources(san: ControlPlane, stortune: Run) -> None:
    shown = stortune("analyze", "host", "san01", "-o", "json")
    assert shown.code == 0, shown.err
    data = json.loads(shown.out)
    dm0 = next(d for d in data["devices"] if d["device"] == "dm-0")
    assert {"name", "kind", "ceilingBytesPerSecond", "source"} <= set(dm0["layers"][0])
    assert dm0["limit"] == "host1+host2 qla2xxx"
    assert data["hostname"]


def test_probe_needs_consent_then_shows_what_it_measured(san: ControlPlane, stortune: Run,
                                                        agent: FakeAgentClient) -> None:
    refused = stortune("probe", "san01", "--device", "dm-0")
    assert refused.code == 1 and "--consent" in refused.err
    assert agent.probes == {}
    path = stortune("probe", "san01", "--device", "../../etc/passwd", "--consent")
    assert path.code == 1 and "device" in path.err and agent.probes == {}

    started = stortune("probe", "san01", "--device", "dm-0", "--consent", "--no-wait")
    assert started.code == 0, started.err
    pid = started.out.strip()
    assert agent.probes == {pid: "dm-0"}
    busy = stortune("probe", "san01", "--consent", "--no-wait")
    assert busy.code == 1 and "busy" in busy.err

    ceilings = [MeasuredCeiling(device=p, read_bytes_per_second=700e6, read_iops=20000.0, run_id=pid)
                for p in ("sdb", "sdc")]
    ceilings.append(MeasuredCeiling(device="sdb+sdc", read_bytes_per_second=1400e6, run_id=pid))
    agent.probe_results[pid] = ProbeResult(
        probe_id=pid, state="done", device="dm-0", members=["sdb", "sdc"], ceilings=ceilings,
        scaling=[ScalingPoint(count=1, devices=["sdb"], read_bytes_per_second=700e6),
                 ScalingPoint(count=2, devices=["sdb", "sdc"], read_bytes_per_second=1400e6, gain=1.0)])
    shown = stortune("probe", "san01", "--show", pid)
    assert shown.code == 0, shown.err
    assert "done" in shown.out and "700 MB/s" in shown.out and "20,000 IOPS" in shown.out
    assert "+100%" in shown.out
    listed = stortune("probe", "san01", "--list")
    assert listed.code == 0 and pid in listed.out

    # The analysis now takes the measured paths: the LUN's disk layer is no estimate.
    with san.http() as http:
        data = http.get("/hosts/san01/analysis").json()
    dm0 = next(d for d in data["devices"] if d["device"] == "dm-0")
    disk = next(layer for layer in dm0["layers"] if layer["kind"] == "disk")
    assert disk["ceilingBytesPerSecond"] == pytest.approx(1400e6) and disk["estimate"] is False


def test_a_viewer_cannot_probe(san: ControlPlane, stortune: Run, agent: FakeAgentClient) -> None:
    viewer = san.issue("viewer")
    refused = stortune("probe", "san01", "--consent", "--no-wait", token=viewer)
    assert refused.code == 1 and "forbidden" in refused.err
    assert agent.probes == {}
    with httpx.Client(base_url=san.url + "/api/v1", headers={"Authorization": f"Bearer {viewer}"}) as http:
        assert http.get("/hosts/san01/analysis").status_code == 200


def test_a_controller_volume_and_the_hosts_controllers_are_shown(control_plane: ControlPlane,
                                                                 stortune: Run) -> None:
    topology = Topology(hostname="perc01", devices=[perc_volume("sdb", drives=12, state="Dgrd")],
                        controllers=inventory("tool said \x1b[2Jno"))
    with control_plane.http() as http:
        body = {"name": "perc01", "address": "127.0.0.1:11", "facts": {"kernel": "6.1.0"},
                "topology": topology.model_dump(mode="json")}
        assert http.post("/agents/register", json=body).status_code == 200
    shown = stortune("analyze", "host", "perc01")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0].startswith("sdb (disk, PERC H710 VD0 RAID5, 12 drives, 256 KiB strip, state Dgrd,"
                               " CacheVault Optimal): ceiling ")
    at = lines.index("Hardware RAID controllers")
    assert lines[at + 1].startswith("  perc 0: PERC H710, firmware 21.3.5-0002")
    assert lines[at + 2] == "  error: megaraid controller 1 (/usr/sbin/storcli64): tool said \\x1b[2Jno"
    assert lines[at + 3] == "  not managed (no tool on the tool path): arcconf, smartarray"
    assert "raid5-wide" in shown.out and "array-degraded" in shown.out
    data = json.loads(stortune("analyze", "host", "perc01", "-o", "json").out)
    assert data["devices"][0]["volume"].startswith("PERC H710 VD0 RAID5")
    assert data["controllers"]["unmanaged"] == ["smartarray", "arcconf"]
