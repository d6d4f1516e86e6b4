"""/api/v1/hosts/{name}/probes: consent, the device a name of the host's, the role that runs
benchmarks, one holder of the host at a time, and the ceilings stored and returned.

The agent is the fake RPC seam; the agent side is tested on real loop devices in
tests/agent/test_probe_loop.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.agent.discovery import discover
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.probe import ProbeResult, ScalingPoint
from stortune.server.agentclient import FakeAgentClients
from stortune.server.auth import Role
from stortune.server.services import probes
from tests.fixtures.sysfs_builder import Queue, SysfsBuilder
from tests.server.builders import API
from tests.server.support import TestClient, admin_client, bearer, issue_token

HOST = "array01"
ADDRESS = "10.1.2.3:7443"
PROBES = f"{API}/hosts/{HOST}/probes"


@pytest.fixture
def admin(app: FastAPI, tmp_path: Path) -> Any:
    b = SysfsBuilder(tmp_path / "host", hostname=HOST)
    host = b.scsi_host(b.pci("0000:00:17.0"), 0, "ahci")
    disks = [b.scsi_disk(host, (0, 0, i, 0), vendor="ATA", model="ST4000NM0035", rev="SN04",
                         size=1 << 24, queue=Queue.hdd())[1] for i in range(4)]
    b.md(0, disks, level="raid5", chunk=512 << 10)
    topology = discover(b.finish())
    with admin_client(app) as client:
        registered = client.post(f"{API}/agents/register", json={
            "name": HOST, "address": ADDRESS, "facts": {"kernel": "6.1.0", "hostname": HOST},
            "topology_hash": topology.structure_hash(), "topology": topology.model_dump(mode="json")})
        assert registered.status_code == 200, registered.text
        yield client


@pytest.mark.parametrize(("body", "code", "field"), [
    ({}, 400, "consent"),
    ({"consent": False, "device": "md0"}, 400, "consent"),
    ({"consent": True, "device": "../../etc/passwd"}, 400, "device"),
    ({"consent": True, "device": "/dev/sda"}, 400, "device"),
    ({"consent": True, "device": "sdz"}, 422, "device"),
    ({"consent": True, "device": "x" * 500}, 422, "device"),
    ({"consent": True, "device": "md0", "fio": {"rw": "write"}}, 422, "fio"),
    ({"consent": "yes please", "device": "md0"}, 422, "consent"),
])
def test_a_hostile_request_is_refused_naming_the_field(app: FastAPI, admin: TestClient,
                                                       body: dict[str, Any], code: int, field: str) -> None:
    response = admin.post(PROBES, json=body)
    assert response.status_code == code, response.text
    assert field in response.text
    agents: FakeAgentClients = app.state.agents
    assert agents.for_address(ADDRESS).probes == {}


def test_a_viewer_may_read_but_not_probe(app: FastAPI, admin: TestClient) -> None:
    viewer = bearer(issue_token(app, Role.VIEWER))
    assert admin.post(PROBES, json={"consent": True}, headers=viewer).status_code == 403
    assert admin.get(PROBES, headers=viewer).status_code == 200
    operator = bearer(issue_token(app, Role.OPERATOR))
    assert admin.post(PROBES, json={"consent": True, "device": "md0"}, headers=operator).status_code == 201


def test_a_probe_is_stored_with_its_ceilings_and_refused_while_another_runs(
        app: FastAPI, admin: TestClient) -> None:
    started = admin.post(PROBES, json={"consent": True, "device": "md0"})
    assert started.status_code == 201, started.text
    pid = started.json()["id"]
    agent = app.state.agents.for_address(ADDRESS)
    assert agent.probes == {pid: "md0"}
    busy = admin.post(PROBES, json={"consent": True})
    assert busy.status_code == 409 and "busy" in busy.text
    assert admin.get(f"{PROBES}/{pid}").json()["state"] == "queued"
    members = ["sda", "sdb", "sdc", "sdd"]
    ceilings = [MeasuredCeiling(device=m, read_bytes_per_second=180e6, read_iops=160.0, run_id=pid)
                for m in members]
    ceilings.append(MeasuredCeiling(device="+".join(members), read_bytes_per_second=520e6, run_id=pid))
    agent.probe_results[pid] = ProbeResult(
        probe_id=pid, state="done", device="md0", members=members, ceilings=ceilings,
        scaling=[ScalingPoint(count=1, devices=members[:1], read_bytes_per_second=180e6),
                 ScalingPoint(count=2, devices=members[:2], read_bytes_per_second=350e6, gain=0.94),
                 ScalingPoint(count=4, devices=members, read_bytes_per_second=520e6, gain=0.49)],
        message="done")
    got = admin.get(f"{PROBES}/{pid}").json()
    assert got["state"] == "done" and got["result"]["scalingStopsAt"] is None
    assert [c["device"] for c in got["result"]["ceilings"]] == [*members, "sda+sdb+sdc+sdd"]
    assert got["result"]["ceilings"][0]["readBytesPerSecond"] == 180e6
    listed = admin.get(PROBES).json()["items"]
    assert [p["id"] for p in listed] == [pid] and listed[0]["result"] is None
    with app.state.sessions() as session:
        assert probes.measured(session, HOST) == sorted(ceilings, key=lambda c: c.device)
    assert admin.post(f"{PROBES}/{pid}/cancel").status_code == 409  # it has ended


def test_cancel_stops_the_probe_on_the_agent(app: FastAPI, admin: TestClient) -> None:
    pid = admin.post(PROBES, json={"consent": True, "device": "md0"}).json()["id"]
    cancelled = admin.post(f"{PROBES}/{pid}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    agent = app.state.agents.for_address(ADDRESS)
    assert ("cancel_benchmark", pid) in agent.calls
    with app.state.sessions() as session:
        assert probes.measured(session, HOST) == []
    assert admin.get(f"{PROBES}/probe-nope").status_code == 404
    assert admin.get(f"{PROBES}/..%2F..%2Fetc").status_code == 404


def test_a_support_token_reads_probes_of_its_hosts_only_and_never_starts_or_cancels(
        app: FastAPI, admin: TestClient) -> None:
    started = admin.post(PROBES, json={"consent": True, "device": "md0"})
    assert started.status_code == 201, started.text
    pid = started.json()["id"]
    elsewhere = bearer(issue_token(app, Role.SUPPORT, hosts="vendor=yes", expires_in="72h"))
    for path in (PROBES, f"{PROBES}/{pid}"):  # outside its selector: not even there
        assert admin.get(path, headers=elsewhere).status_code == 404
    assert admin.post(PROBES, json={"consent": True}, headers=elsewhere).status_code == 403
    assert admin.post(f"{PROBES}/{pid}/cancel", headers=elsewhere).status_code == 403
    assert admin.put(f"{API}/hosts/{HOST}/labels", json={"labels": {"vendor": "yes"}}).status_code == 200
    for path in (PROBES, f"{PROBES}/{pid}"):
        assert admin.get(path, headers=elsewhere).status_code == 200
    assert admin.post(f"{PROBES}/{pid}/cancel", headers=elsewhere).status_code == 403
    viewer = bearer(issue_token(app, Role.VIEWER))
    assert admin.post(f"{PROBES}/{pid}/cancel", headers=viewer).status_code == 403
    assert admin.get(f"{PROBES}/{pid}", headers=viewer).status_code == 200
