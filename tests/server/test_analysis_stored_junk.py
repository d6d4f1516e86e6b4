"""What the control plane stored earlier may not validate today (a topology stored before the
model's bounds, a probe result of an older agent): the analysis and a probe request answer 409
or leave it out, never 500."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import select

from stortune.server.db.tables import Host, Probe
from tests.server.builders import API
from tests.server.support import TestClient, admin_client

HOSTS = f"{API}/hosts"
#: Valid when stored by an older server; now past the model's bounds (no kernel reports it).
JUNK_TOPOLOGY = {"hostname": "old01", "devices": [
    {"name": "md0", "kind": "md", "id": "md0", "md": {"level": "raid5", "raid_disks": 10**30}}]}


@pytest.fixture
def admin(app: FastAPI, tmp_path: Path) -> Iterator[TestClient]:
    with admin_client(app) as client:
        body = {"name": "old01", "address": "old01.example:7443",
                "facts": {"kernel": "6.1.0", "hostname": "old01"},
                "topology": {"hostname": "old01", "devices": [
                    {"name": "sda", "kind": "disk", "id": "name:sda", "rotational": True}]}}
        assert client.post(f"{API}/agents/register", json=body).status_code == 200
        yield client


def _store_topology(app: FastAPI, topology: dict[str, object]) -> None:
    with app.state.sessions() as session, session.begin():
        host = session.scalars(select(Host).where(Host.name == "old01")).one()
        host.topology = topology


def test_a_stored_topology_that_no_longer_validates_is_409(app: FastAPI, admin: TestClient) -> None:
    _store_topology(app, JUNK_TOPOLOGY)
    response = admin.get(f"{HOSTS}/old01/analysis")
    assert response.status_code == 409, response.text
    assert "topology" in response.json()["message"]


def test_a_probe_of_a_host_whose_topology_no_longer_validates_is_not_500(
        app: FastAPI, admin: TestClient) -> None:
    _store_topology(app, JUNK_TOPOLOGY)
    # The control plane cannot check the name against the stored topology; the agent checks it
    response = admin.post(f"{HOSTS}/old01/probes", json={"consent": True, "device": "md0"})
    assert response.status_code < 500, response.text


def test_a_stored_probe_result_that_no_longer_validates_is_left_out(app: FastAPI, admin: TestClient) -> None:
    now = datetime.now(UTC)
    with app.state.sessions() as session, session.begin():
        session.add(Probe(id="probe-old-1", host="old01", device="sda", requested_by="tests", state="done",
                          message="", created_at=now, updated_at=now, finished_at=now,
                          result={"probeId": "probe-old-1", "state": "done", "unknownField": 1}))
        session.add(Probe(id="probe-old-2", host="old01", device="sda", requested_by="tests", state="done",
                          message="", created_at=now, updated_at=now, finished_at=now,
                          result={"probeId": "probe-old-2", "state": "done", "ceilings": [
                              {"device": "sda", "readBytesPerSecond": 180e6, "readIops": 200}]}))
    response = admin.get(f"{HOSTS}/old01/analysis")
    assert response.status_code == 200, response.text
    sda = next(d for d in response.json()["devices"] if d["device"] == "sda")
    assert sda["ceilingBytesPerSecond"] == pytest.approx(180e6)
    shown = admin.get(f"{HOSTS}/old01/probes/probe-old-1")
    assert shown.status_code < 500, shown.text
