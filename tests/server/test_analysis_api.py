"""/api/v1/hosts/{name}/analysis: the host's layers from the topology it reported, its probe
ceilings as measured ceilings, slow members across its stored runs; and in the support bundle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from stortune.agent.discovery import discover
from stortune.api.agent.wire import BenchmarkProgress
from stortune.schemas.analysis.model import MeasuredCeiling
from stortune.schemas.analysis.probe import ProbeResult
from stortune.schemas.bench.results import DeviceStats
from stortune.schemas.bench.spec import parse_benchmark
from stortune.server.agentclient import BenchmarkOutcome, FakeAgentClient
from stortune.server.auth import Role
from stortune.server.services import benchmarks, probes
from tests.fixtures.scenarios import SCENARIOS
from tests.server.benchfakes import make_result, raw_files, spec_doc, steady
from tests.server.builders import API
from tests.server.support import TestClient, admin_client, bearer, issue_token

HOSTS = f"{API}/hosts"


def _register(client: TestClient, name: str, scenario: str | None, root: Path) -> None:
    body: dict[str, object] = {"name": name, "address": f"{name}.example:7443",
                               "facts": {"kernel": "6.1.0", "hostname": name}}
    if scenario is not None:
        topology = discover(SCENARIOS[scenario](root))
        body |= {"topology_hash": topology.structure_hash(), "topology": topology.model_dump(mode="json")}
    response = client.post(f"{API}/agents/register", json=body)
    assert response.status_code == 200, response.text


@pytest.fixture
def admin(app: FastAPI, tmp_path: Path) -> Iterator[TestClient]:
    with admin_client(app) as client:
        _register(client, "san01", "san_8gfc_24lun", tmp_path / "san")
        _register(client, "files01", "md_raid5_fileserver", tmp_path / "files")
        _register(client, "bare", None, tmp_path / "bare")
        yield client


@pytest.mark.parametrize("query", ["runs=0", "runs=51", "runs=-1", "runs=ten", "runs=1e9"])
def test_a_hostile_query_is_refused_naming_runs(admin: TestClient, query: str) -> None:
    response = admin.get(f"{HOSTS}/san01/analysis?{query}")
    assert response.status_code == 422, response.text
    assert "runs" in response.text


def test_unknown_host_is_404_and_a_host_without_topology_409(admin: TestClient) -> None:
    assert admin.get(f"{HOSTS}/ghost/analysis").status_code == 404
    assert admin.get(f"{HOSTS}/..%2F..%2Fetc/analysis").status_code in (404, 422)
    bare = admin.get(f"{HOSTS}/bare/analysis")
    assert bare.status_code == 409 and "topology" in bare.json()["message"]


def test_a_support_token_sees_only_the_hosts_it_was_given(app: FastAPI, admin: TestClient) -> None:
    admin.put(f"{HOSTS}/san01/labels", json={"labels": {"vendor": "yes"}})
    support = bearer(issue_token(app, Role.SUPPORT, hosts="vendor=yes", expires_in="72h"))
    assert admin.get(f"{HOSTS}/san01/analysis", headers=support).status_code == 200
    assert admin.get(f"{HOSTS}/files01/analysis", headers=support).status_code == 404
    assert admin.get(f"{HOSTS}/san01/analysis", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_each_lun_is_limited_by_the_two_8gfc_ports(admin: TestClient) -> None:
    data = admin.get(f"{HOSTS}/san01/analysis").json()
    luns = [d for d in data["devices"] if any(layer["kind"] == "multipath" for layer in d["layers"])]
    assert len(luns) == 24
    for lun in luns:
        assert lun["limit"] == "host1+host2 qla2xxx"
        assert lun["ceilingBytesPerSecond"] == pytest.approx(2 * 797e6, rel=1e-3)
        port = next(layer for layer in lun["layers"] if layer["kind"] == "port")
        assert "8 Gbit" in port["source"] or "8GFC" in port["source"]


def test_layout_checks_of_the_md_file_server(admin: TestClient) -> None:
    data = admin.get(f"{HOSTS}/files01/analysis").json()
    codes = {(c["code"], c["device"]) for d in data["devices"] for c in d["checks"]} | {
        (c["code"], c["device"]) for c in data["checks"]}
    assert ("partition-misaligned", "sdd1") in codes


def test_probe_ceilings_replace_class_estimates(app: FastAPI, admin: TestClient) -> None:
    before = admin.get(f"{HOSTS}/files01/analysis").json()
    disk = next(layer for layer in next(d for d in before["devices"] if d["device"] == "md126")["layers"]
                if layer["kind"] == "disk")
    assert disk["estimate"] is True
    ceilings = [MeasuredCeiling(device=m, read_bytes_per_second=90e6, read_iops=120.0, run_id="probe-1")
                for m in ("sdb", "sdc", "sdd", "sde", "sdf")]
    with app.state.sessions() as session:
        probes.create(session, "probe-1", "files01", "md126", requested_by="tests",
                      progress=BenchmarkProgress(run_id="probe-1", state="queued"), now=app.state.clock())
        row = probes.get(session, "files01", "probe-1")
        probes.refresh(session, row, BenchmarkProgress(run_id="probe-1", state="done", percent=100.0),
                       ProbeResult(probe_id="probe-1", state="done", device="md126",
                                   members=[c.device for c in ceilings], ceilings=ceilings),
                       app.state.clock())
        session.commit()
    after = admin.get(f"{HOSTS}/files01/analysis").json()
    md = next(d for d in after["devices"] if d["device"] == "md126")
    disk = next(layer for layer in md["layers"] if layer["kind"] == "disk")
    assert disk["estimate"] is False and disk["ceilingBytesPerSecond"] == pytest.approx(5 * 90e6)
    assert {m["device"] for m in after["measured"]} == {c.device for c in ceilings}


def _member_stats(slow: str, await_ms: float) -> list[DeviceStats]:
    out = [DeviceStats(device="md126", relation="target", seconds=10.0, read_ios=1000, write_ios=0,
                       read_bytes=1 << 30, write_bytes=0, read_iops=100.0, write_iops=0.0,
                       read_bytes_per_s=1e8, write_bytes_per_s=0.0, util_percent=None)]
    for member in ("sdb1", "sdc1", "sdd1", "sde1", "sdf1"):
        wait = await_ms if member == slow else 8.0
        out.append(DeviceStats(device=member, relation="md-member", above="md126", seconds=10.0,
                               read_ios=250, write_ios=0, read_bytes=1 << 28, write_bytes=0,
                               read_iops=25.0, write_iops=0.0, read_bytes_per_s=2.6e7,
                               write_bytes_per_s=0.0, util_percent=60.0, await_ms=wait,
                               read_await_ms=wait))
    return out


def _stored_run(app: FastAPI, host: str, stats: list[DeviceStats]) -> None:
    spec = parse_benchmark(spec_doc("seq"))
    with app.state.sessions() as session:
        (row,) = benchmarks.create_runs(session, spec, [host], requested_by="tests", now=app.state.clock())
        result = make_result(row.id, spec, steady(), hostname=host)
        for run in result.runs:
            run.devices = stats
        outcome = BenchmarkOutcome(progress=BenchmarkProgress(run_id=row.id, state="done", percent=100.0),
                                   result=result, raw_files=raw_files(result), info=FakeAgentClient().info)
        assert benchmarks.conclude(session, row.id, outcome, app.state.clock())


def test_a_member_slow_in_every_stored_run_is_named_a_one_off_is_not(app: FastAPI,
                                                                      admin: TestClient) -> None:
    for _ in range(3):
        _stored_run(app, "files01", _member_stats("sdd1", 30.0))
    _stored_run(app, "files01", _member_stats("sdb1", 40.0))  # one spike in the newest run
    slow = admin.get(f"{HOSTS}/files01/analysis").json()["slowMembers"]
    assert [(s["group"], s["member"]) for s in slow] == [("md126", "sdd1")]
    # every step run of a stored run is one sample: 4 runs of 2 steps each
    assert slow[0]["message"] == "sdd1: await 3.8 x its 4 peers' median in 6 of 8 runs"
    # Only the newest run looked at: one sample is no evidence of anything.
    assert admin.get(f"{HOSTS}/files01/analysis?runs=1").json()["slowMembers"] == []
