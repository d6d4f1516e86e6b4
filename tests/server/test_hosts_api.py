"""Agents register and renew leases; operators label hosts; hosts can be declared gone."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select, update

from stortune.server import RecordingController
from stortune.server.db.tables import Host, HostConditionChange
from stortune.server.services import hosts
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.support import FakeClock, TestClient, admin_client

AGENTS = f"{API}/agents"
HOSTS = f"{API}/hosts"


def test_register_then_read_the_host(client: TestClient, controller: RecordingController) -> None:
    response = client.post(f"{AGENTS}/register", json=registration("h1"))
    assert response.status_code == 200, response.text
    assert response.json() == {"name": "h1", "heartbeat_interval_s": 5.0, "lease_duration_s": 15.0,
                               "topology_wanted": True, "accepts_corrections": True}
    assert controller.requests[-1] == ("h1", "agent registered")

    host = client.get(f"{HOSTS}/h1").json()
    assert host["kind"] == "Host" and host["apiVersion"] == "stortune/v1"
    assert host["metadata"]["labels"] == {"role": "streamer"}
    assert host["spec"] == {"labels": {}, "address": "h1.example:7443"}
    status = host["status"]
    # Reachable comes from the agent; Ready waits for the reconciler's first verdict.
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("Ready", "Unknown", "Reconciling"), ("Reachable", "True", "AgentRegistered")]
    assert status["bootId"] == "boot-1" and status["facts"]["kernel"] == "6.1.0"
    assert client.get(f"{HOSTS}/h1/status").json() == status
    assert [h["metadata"]["name"] for h in client.get(HOSTS).json()["items"]] == ["h1"]


def test_unknown_host_is_404(client: TestClient) -> None:
    calls: list[tuple[str, str, dict[str, Any] | None]] = [
        ("GET", f"{HOSTS}/ghost", None), ("GET", f"{HOSTS}/ghost/status", None),
        ("GET", f"{HOSTS}/ghost/topology", None), ("DELETE", f"{HOSTS}/ghost", None),
        ("PUT", f"{HOSTS}/ghost/labels", {"labels": {}}),
        ("PATCH", f"{HOSTS}/ghost/labels", {"labels": {}}),
        ("POST", f"{AGENTS}/ghost/heartbeat", {"topology_hash": "", "boot_id": ""}),
        ("PUT", f"{AGENTS}/ghost/topology", {"topology": loop_topology().model_dump(mode="json")}),
    ]
    for method, path, body in calls:
        response = client.request(method, path, json=body)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["details"]["kind"] == "Host"


def test_topology_with_registration_and_hash_tracking(client: TestClient) -> None:
    topology = loop_topology()
    digest = topology.structure_hash()
    response = client.post(f"{AGENTS}/register", json=registration(topology=topology, topology_hash=digest))
    assert response.json()["topology_wanted"] is False
    assert client.get(f"{HOSTS}/h1/topology").json()["devices"][0]["name"] == "loop0"

    beat = client.post(f"{AGENTS}/h1/heartbeat", json={"topology_hash": digest, "boot_id": "boot-1"})
    assert beat.status_code == 200 and beat.json()["topology_wanted"] is False
    beat = client.post(f"{AGENTS}/h1/heartbeat", json={"topology_hash": "different", "boot_id": "boot-1"})
    assert beat.json()["topology_wanted"] is True

    # Re-registering with the known hash and no topology keeps the stored one.
    again = client.post(f"{AGENTS}/register", json=registration(topology_hash=digest))
    assert again.json()["topology_wanted"] is False


def test_topology_upload(client: TestClient, controller: RecordingController) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    assert client.get(f"{HOSTS}/h1/topology").json() is None
    controller.clear()
    body = {"topology": loop_topology().model_dump(mode="json")}
    response = client.put(f"{AGENTS}/h1/topology", json=body)
    assert response.status_code == 200, response.text
    accepted = response.json()
    assert accepted["changed"] is True
    assert accepted["topology_hash"] == loop_topology().structure_hash()  # computed when not given
    assert controller.requests[-1] == ("h1", "topology changed")
    assert client.put(f"{AGENTS}/h1/topology", json=body).json()["changed"] is False

    beat = client.post(f"{AGENTS}/h1/heartbeat",
                       json={"topology_hash": accepted["topology_hash"], "boot_id": "boot-1"})
    assert beat.json()["topology_wanted"] is False
    bad = {"topology": {"devices": [{"name": "x", "kind": "floppy", "id": "x"}]}}
    response = client.put(f"{AGENTS}/h1/topology", json=bad)
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0]["field"] == "topology.devices[0].kind"


def _loop_named(name: str, **fields: Any) -> dict[str, Any]:
    device = loop_topology().devices[0].model_dump(mode="json")
    return {**device, "name": name, "id": f"name:{name}", **fields}


def test_a_hostile_topology_is_neither_stored_nor_planned_against(client: TestClient) -> None:
    """Hostile: devices named '..', '/tmp/x' and '../../x', a sysfs_path of '../../x', and
    100,000 devices (under the 8 MiB body limit), uploaded and registered: each a 422 naming the
    field, and what the host reported before is what the control plane still plans against."""
    good = loop_topology()
    client.post(f"{AGENTS}/register", json=registration(topology=good, topology_hash=good.structure_hash()))
    before = client.get(f"{HOSTS}/h1/topology").json()
    hostile = [(_loop_named(name), "topology.devices[1].name") for name in ("..", "/tmp/x", "../../x")]
    hostile.append((_loop_named("loop1", sysfs_path="../../x"), "topology.devices[1].sysfs_path"))
    for device, field in hostile:
        topology = {"hostname": "h1", "devices": [before["devices"][0], device]}
        for response in (client.put(f"{AGENTS}/h1/topology", json={"topology": topology}),
                         client.post(f"{AGENTS}/register", json={**registration(), "topology": topology})):
            assert response.status_code == 422, response.text
            assert response.json()["details"]["causes"][0]["field"] == field
    crowd = {"devices": [{"name": f"loop{i}", "kind": "loop", "id": f"name:loop{i}"} for i in range(100_000)]}
    response = client.put(f"{AGENTS}/h1/topology", json={"topology": crowd})
    assert response.status_code == 422, response.text[:300]
    cause = response.json()["details"]["causes"][0]
    assert cause["field"] == "topology.devices" and "at most 16384" in cause["message"]

    assert client.get(f"{HOSTS}/h1/topology").json() == before
    doc = profile_doc(kinds=("loop", "disk"))
    plans = client.post(f"{API}/profiles?dryRun=All", json=doc).json()["plans"]
    assert {c["device"] for c in plans["h1"]["changes"]} == {"loop0"}


def test_a_topology_stored_before_the_limits_is_not_planned_against(app: Any, client: TestClient) -> None:
    """An older server stored what agents sent unchecked: such a topology counts as not reported
    (the reconciler asks the agent again) instead of failing the dry run."""
    client.post(f"{AGENTS}/register", json=registration(topology=loop_topology()))
    legacy = {"hostname": "h1", "devices": [_loop_named("../../x")]}
    with app.state.sessions() as session:
        session.execute(update(Host).where(Host.name == "h1").values(topology=legacy))
        session.commit()
    response = client.post(f"{API}/profiles?dryRun=All", json=profile_doc())
    assert response.status_code == 200, response.text
    assert response.json()["plans"]["h1"]["topologyReported"] is False


def test_heartbeat_renews_the_lease_without_a_resource_write(client: TestClient, clock: FakeClock) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    before_etag = client.get(f"{HOSTS}/h1").headers["ETag"]
    clock.advance(5)
    beat = client.post(f"{AGENTS}/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"})
    assert beat.json()["lease_expires"] == "2025-03-01T12:00:20Z"
    lease = client.get(f"{HOSTS}/h1/lease").json()
    assert (lease["renewTime"], lease["expireTime"], lease["expired"]) == (
        "2025-03-01T12:00:05Z", "2025-03-01T12:00:20Z", False)
    # The host document is untouched, so its cached body and ETag stay valid.
    after = client.get(f"{HOSTS}/h1", headers={"If-None-Match": before_etag})
    assert after.status_code == 304


def test_host_reads_are_cached_until_the_next_write(client: TestClient) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    first = client.get(HOSTS)
    etag = first.headers["ETag"]
    assert client.get(HOSTS, headers={"If-None-Match": etag}).status_code == 304
    assert client.get(HOSTS).content == first.content
    client.patch(f"{HOSTS}/h1/labels", json={"labels": {"tier": "gold"}})
    second = client.get(HOSTS, headers={"If-None-Match": etag})
    assert second.status_code == 200 and second.headers["ETag"] != etag
    assert second.json()["items"][0]["metadata"]["labels"]["tier"] == "gold"
    version = (int(r.json()["metadata"]["resourceVersion"]) for r in (first, second))
    assert next(version) < next(version)
    # Another selector is another body.
    assert client.get(HOSTS, params={"labelSelector": "tier=silver"}).json()["items"] == []


def test_lease_expiry_and_recovery(app: Any, client: TestClient, clock: FakeClock,
                                   controller: RecordingController) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    clock.advance(14)
    with app.state.sessions() as session:
        assert hosts.expire_leases(session, clock()) == []
    clock.advance(2)
    with app.state.sessions() as session:
        assert hosts.expire_leases(session, clock()) == ["h1"]
        assert hosts.expire_leases(session, clock()) == []  # already marked
    ready, reachable = client.get(f"{HOSTS}/h1/status").json()["conditions"]
    assert (reachable["status"], reachable["reason"]) == ("False", "LeaseExpired")
    assert reachable["message"] == "no heartbeat since 2025-03-01T12:00:00+00:00"
    assert reachable["lastTransitionTime"] == "2025-03-01T12:00:16Z"
    assert (ready["status"], ready["reason"]) == ("False", "LeaseExpired")

    controller.clear()
    clock.advance(1)
    client.post(f"{AGENTS}/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"})
    reachable = client.get(f"{HOSTS}/h1/status").json()["conditions"][1]
    assert (reachable["status"], reachable["reason"]) == ("True", "LeaseRenewed")
    assert controller.requests[-1] == ("h1", "lease renewed")

    with app.state.sessions() as session:
        history = session.scalars(select(HostConditionChange).order_by(HostConditionChange.id)).all()
        assert [(h.type, h.status, h.reason) for h in history if h.type == "Reachable"] == [
            ("Reachable", "True", "AgentRegistered"), ("Reachable", "False", "LeaseExpired"),
            ("Reachable", "True", "LeaseRenewed")]
    warnings = client.get(f"{API}/events?host=h1").json()["items"]
    assert any(e["type"] == "Warning" and e["reason"] == "LeaseExpired" for e in warnings)


def test_reboot_seen_in_a_heartbeat(client: TestClient, controller: RecordingController) -> None:
    client.post(f"{AGENTS}/register", json=registration(boot_id="boot-1"))
    controller.clear()
    client.post(f"{AGENTS}/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-2"})
    assert client.get(f"{HOSTS}/h1").json()["status"]["bootId"] == "boot-2"
    assert controller.requests[-1] == ("h1", "host rebooted")
    assert client.get(f"{API}/events?host=h1&limit=1").json()["items"][0]["reason"] == "Rebooted"


def test_api_labels_win_over_reported_ones(client: TestClient, controller: RecordingController) -> None:
    client.post(f"{AGENTS}/register", json=registration(labels={"role": "streamer", "rack": "r1"}))
    controller.clear()
    response = client.put(f"{HOSTS}/h1/labels", json={"labels": {"role": "db", "tier": "gold"}})
    assert response.status_code == 200, response.text
    host = response.json()
    assert host["metadata"]["labels"] == {"role": "db", "rack": "r1", "tier": "gold"}
    assert host["spec"]["labels"] == {"role": "db", "tier": "gold"}
    assert host["status"]["reportedLabels"] == {"role": "streamer", "rack": "r1"}
    assert controller.requests[-1] == ("h1", "labels changed")

    # The agent registering again does not undo the operator's label.
    client.post(f"{AGENTS}/register", json=registration(labels={"role": "streamer"}))
    assert client.get(f"{HOSTS}/h1").json()["metadata"]["labels"] == {"role": "db", "tier": "gold"}

    merged = client.patch(f"{HOSTS}/h1/labels", json={"labels": {"role": None, "zone": "a"}}).json()
    assert merged["spec"]["labels"] == {"tier": "gold", "zone": "a"}
    assert merged["metadata"]["labels"] == {"role": "streamer", "tier": "gold", "zone": "a"}

    selected = client.get(HOSTS, params={"labelSelector": "role=streamer,zone"}).json()["items"]
    assert [h["metadata"]["name"] for h in selected] == ["h1"]


def test_bad_labels_are_422_naming_the_label(client: TestClient) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    for method in ("PUT", "PATCH"):
        response = client.request(method, f"{HOSTS}/h1/labels", json={"labels": {"ok": "yes", "tier": "a b"}})
        assert response.status_code == 422, response.text
        (cause,) = response.json()["details"]["causes"]
        assert cause["field"] == "labels" and "'tier'" in cause["message"]
    bad = registration(labels={"-bad-key": "x"})
    response = client.post(f"{AGENTS}/register", json=bad)
    assert response.status_code == 422 and "'-bad-key'" in response.json()["message"]


def test_registration_validation(client: TestClient) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"name": "Not_A_Name"}, "name"), ({"address": "no-port"}, "address"), ({"extra": 1}, "extra"),
        ({"facts": {"boot_id": "x" * 100}}, "facts.boot_id"),
        ({"facts": {"nested": {"a": 1}}}, "facts"), ({"facts": {"load": 1.5}}, "facts"),
    ]
    for change, field in cases:
        response = client.post(f"{AGENTS}/register", json={**registration(), **change})
        assert response.status_code == 422, (change, response.text)
        assert response.json()["details"]["causes"][0]["field"] == field
    facts = {"kernel": "6.1.0", "boot_id": "b", "cpus": 8, "virtual": True, "site": None}
    accepted = client.post(f"{AGENTS}/register", json={**registration(), "facts": facts})
    assert accepted.status_code == 200, accepted.text
    stored = client.get(f"{HOSTS}/h1").json()["status"]["facts"]
    assert stored == {k: v for k, v in facts.items() if v is not None}
    response = client.post(f"{AGENTS}/register", json={**registration(), "address": "h\x00:1"})
    assert response.status_code == 422 and "NUL" in response.json()["message"]


@pytest.mark.parametrize("address", [
    "evil\u001b[2J\u001b[H:6", "h1\n2026-01-01 INFO forged line:7443", "h1\r:7443", "h1\u0085:7443",
    "h1\u200f.example:7443", "h\u00e9.example:7443", "h 1:7443", "h1.example:0", "h1.example:65536",
    "h1.example:+80", "::1:7443", "[not-v6]:7443", "-h1.example:7443", "h1..example:7443",
    "a" * 254 + ":7443", ("a" * 64 + ".") * 3 + "b:7443", "x" * 10_000 + ":1"])
def test_hostile_agent_addresses_are_refused_naming_the_field(client: TestClient, address: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """An address is written into the log, the events and the dashboard: control characters in
    one rewrote the operator's terminal. It is a host name or IP literal and a port, or 422."""
    response = client.post(f"{AGENTS}/register", json={**registration(), "address": address})
    assert response.status_code == 422, response.text
    (cause,) = response.json()["details"]["causes"]
    assert cause["field"] == "address" and "HOST:PORT" in cause["message"]
    assert "\x1b" not in response.text and "\n2026" not in response.text  # not echoed raw either
    assert client.get(f"{HOSTS}/h1").status_code == 404
    assert not [r for r in caplog.records if "\x1b" in r.getMessage() or "forged" in r.getMessage()]


@pytest.mark.parametrize("address", [
    "h1.example:7443", "h1:1", "10.0.0.1:65535", "[::1]:7443", "[fe80::1%eth0]:7443", "web_1.local:50051",
    "a" * 63 + ".example:7443"])
def test_agent_addresses_a_host_may_have_are_accepted(client: TestClient, address: str) -> None:
    response = client.post(f"{AGENTS}/register", json={**registration(), "address": address})
    assert response.status_code == 200, response.text
    assert client.get(f"{HOSTS}/h1").json()["spec"]["address"] == address


def test_delete_host(client: TestClient) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    response = client.delete(f"{HOSTS}/h1")
    assert response.status_code == 200 and response.json()["metadata"]["name"] == "h1"
    assert client.get(f"{HOSTS}/h1").status_code == 404
    # It may come back: registering creates it again.
    assert client.post(f"{AGENTS}/register", json=registration()).status_code == 200


def test_large_bodies_go_gzip_compressed_to_clients_that_accept_it(client: TestClient) -> None:
    for i in range(40):
        client.post(f"{AGENTS}/register", json=registration(f"h{i:02d}"))
    plain = client.get(HOSTS, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and len(plain.content) > 4096
    packed = client.get(HOSTS, headers={"Accept-Encoding": "gzip"})
    assert packed.headers["content-encoding"] == "gzip" and packed.headers["vary"] == "Accept-Encoding"
    assert packed.content == plain.content  # httpx decoded it
    assert int(packed.headers["content-length"]) < len(plain.content) / 5
    refused = client.get(HOSTS, headers={"Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in refused.headers
    small = client.get(f"{HOSTS}/h00", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in small.headers


def test_many_pollers_after_a_write_share_one_render_and_all_see_the_write(
        app: Any, client: TestClient, monkeypatch: Any) -> None:
    import anyio
    import httpx

    client.post(f"{AGENTS}/register", json=registration())
    client.get(HOSTS)
    renders = []
    fleet = app.state.fleet
    real = fleet.snapshot

    def counted() -> Any:
        renders.append(1)
        return real()

    monkeypatch.setattr(fleet, "snapshot", counted)
    client.patch(f"{HOSTS}/h1/labels", json={"labels": {"tier": "gold"}})

    async def poll() -> list[dict[str, Any]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://cp",
                                     headers=dict(client.headers)) as ac:
            answers: list[dict[str, Any]] = []

            async def one() -> None:
                answers.append((await ac.get(HOSTS)).json())

            async with anyio.create_task_group() as tg:
                for _ in range(30):
                    tg.start_soon(one)
            return answers

    answers = anyio.run(poll)
    assert len(answers) == 30
    assert all(a["items"][0]["metadata"]["labels"]["tier"] == "gold" for a in answers)
    assert len(renders) == 1, "one render served every poller"


def test_after_writes_the_list_encodes_only_the_hosts_that_changed(
        app: Any, client: TestClient, monkeypatch: Any) -> None:
    from stortune.server.models.hosts import HostDocument

    for i in range(5):
        client.post(f"{AGENTS}/register", json=registration(f"h{i}"))
    assert len(client.get(HOSTS).json()["items"]) == 5
    real, encoded = hosts.rows, []

    def counted(session: Any, names: Any) -> Any:
        encoded.extend(names)
        return real(session, names)

    monkeypatch.setattr(hosts, "rows", counted)
    client.patch(f"{HOSTS}/h3/labels", json={"labels": {"tier": "gold"}})
    client.delete(f"{HOSTS}/h1")
    client.post(f"{AGENTS}/register", json=registration("h5"))
    listed = client.get(HOSTS).json()
    assert encoded == ["h3", "h5"], "unchanged hosts are joined as they were encoded"
    names = ["h0", "h2", "h3", "h4", "h5"]
    with app.state.sessions() as session:
        fresh = {r.name: HostDocument.from_row(r).model_dump(mode="json") for r in real(session, names)}
    assert listed["items"] == [fresh[n] for n in names]
    assert listed["items"][2]["metadata"]["labels"]["tier"] == "gold"
    assert int(listed["metadata"]["resourceVersion"]) >= max(
        int(i["metadata"]["resourceVersion"]) for i in listed["items"])
    assert client.get(f"{HOSTS}/h3").json() == fresh["h3"] and encoded == ["h3", "h5"]
    assert client.get(f"{HOSTS}/h1").status_code == 404


def test_a_growing_fleet_is_told_to_heartbeat_less_often_with_longer_leases(
        make_app: Any, clock: FakeClock) -> None:
    from stortune.server.services.pacing import FleetSize

    app = make_app(max_heartbeats_per_s=0.5)  # a budget of one heartbeat every 2 s
    app.state.fleet_size = FleetSize(app.state.sessions, ttl_s=0)
    with admin_client(app) as client:
        first = client.post(f"{AGENTS}/register", json=registration("h0")).json()
        assert (first["heartbeat_interval_s"], first["lease_duration_s"]) == (5.0, 15.0)
        for i in range(1, 4):
            client.post(f"{AGENTS}/register", json=registration(f"h{i}"))
        beat = client.post(f"{AGENTS}/h0/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"}).json()
    # 4 hosts at 0.5/s: every 8 s, and the lease keeps its 3 heartbeats (15 s for 5 s)
    assert (beat["heartbeat_interval_s"], beat["lease_duration_s"]) == (8.0, 24.0)
    assert beat["lease_expires"] == "2025-03-01T12:00:24Z"


def test_pace_keeps_the_configured_interval_for_a_small_fleet() -> None:
    from stortune.server.services.pacing import Pace, pace

    assert pace(50, interval_s=10, lease_s=40, max_per_s=10) == Pace(10, 40)
    assert pace(200, interval_s=10, lease_s=40, max_per_s=10) == Pace(20, 80)
    assert pace(5000, interval_s=10, lease_s=40, max_per_s=50) == Pace(100, 400)
