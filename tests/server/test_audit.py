"""The audit log: every mutating call and every audited read, whatever its outcome; admins read it."""

from __future__ import annotations

import logging
from typing import Annotated, Any

import pytest
from fastapi import APIRouter, FastAPI

from stortune.server.api.audit import audited
from stortune.server.api.security import Authorized, VisibleHostName
from stortune.server.auth import Permission, Principal
from tests.server.builders import API, keyed, profile_doc, registration
from tests.server.conftest import TokenFor
from tests.server.support import FakeClock, TestClient, bearer

AUDIT = f"{API}/audit"


def records(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    response = client.get(AUDIT, params=params)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def token_id(client: TestClient, name: str) -> str:
    return next(str(t["id"]) for t in client.get(f"{API}/tokens").json()["items"] if t["name"] == name)


def test_who_what_when_from_where_for_every_outcome(
    client: TestClient, token_for: TokenFor, clock: FakeClock,
) -> None:
    operator = bearer(token_for("operator", name="alice"))
    viewer = bearer(token_for("viewer", name="bob"))
    start = clock.now
    assert client.post(f"{API}/profiles", json=profile_doc("vod"), headers=operator).status_code == 201
    clock.advance(5)
    assert client.post(f"{API}/profiles", json=profile_doc("nope"), headers=viewer).status_code == 403
    bad = profile_doc("bad", settings={"read_ahead_kb": -1})
    assert client.put(f"{API}/profiles/bad", json=bad, headers=operator).status_code == 422
    assert client.put(f"{API}/profiles/vod", content=b"{oops", headers={
        **operator, "content-type": "application/json"}).status_code == 400
    assert client.delete(f"{API}/profiles/missing", headers=operator).status_code == 404
    assert client.get(f"{API}/profiles/vod", headers=operator).status_code == 200  # reads: not audited

    rows = records(client, limit=10)
    summary = [(r["tokenName"], r["role"], r["method"], r["resource"], r["code"]) for r in rows]
    assert summary == [  # newest first
        ("alice", "operator", "DELETE", "profiles/missing", 404),
        ("alice", "operator", "PUT", "profiles/vod", 400),
        ("alice", "operator", "PUT", "profiles/bad", 422),
        ("bob", "viewer", "POST", "profiles", 403),  # refused before the body was read
        ("alice", "operator", "POST", "profiles/vod", 201),
    ]
    first = rows[-1]
    assert first["path"] == f"{API}/profiles" and first["client"] == "testclient"
    assert first["time"] == start.isoformat().replace("+00:00", "Z")
    assert first["tokenId"] == token_id(client, "alice")


def test_agent_calls_token_management_and_filters(client: TestClient, token_for: TokenFor) -> None:
    agent = bearer(token_for("agent", name="fleet"))
    client.post(f"{API}/agents/register", json=registration("h1"), headers={**agent, **keyed("h1")})
    for _ in range(3):
        client.post(f"{API}/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"},
                    headers={**agent, **keyed("h1")})
    made = client.post(f"{API}/tokens", json={"role": "viewer", "name": "temp"}).json()
    client.delete(f"{API}/tokens/{made['id']}")
    client.post(f"{API}/profiles?dryRun=All", json=profile_doc())

    rows = records(client)
    assert [(r["method"], r["resource"]) for r in rows] == [
        ("POST", "profiles/streaming"),
        ("DELETE", f"tokens/{made['id']}"),
        ("POST", f"tokens/{made['id']}"),
        ("POST", "hosts/h1"),  # registration; heartbeats are no one's action
    ]
    assert rows[0]["path"] == f"{API}/profiles?dryRun=All"
    dump = repr(rows)
    assert made["token"] not in dump and "Bearer" not in dump
    assert [r["resource"] for r in records(client, token=token_id(client, "fleet"))] == ["hosts/h1"]
    assert [r["resource"] for r in records(client, resource="tokens")] == [f"tokens/{made['id']}"] * 2
    assert [r["method"] for r in records(client, method="DELETE")] == ["DELETE"]
    assert len(records(client, limit=2)) == 2
    assert records(client, since="2100-01-01T00:00:00") == []
    assert client.get(AUDIT, params={"token": "not-an-id"}).status_code == 422


def test_unauthenticated_calls_are_logged_not_stored(
    client: TestClient, caplog: pytest.LogCaptureFixture,
) -> None:
    # Refused credentials are logged by the sign-in throttle (api/signins.py), one line per address a minute.
    with caplog.at_level(logging.INFO, logger="stortune.server.api.signins"):
        response = client.post(f"{API}/profiles", json=profile_doc(), headers=bearer("stt_" + "y" * 43))
    assert response.status_code == 401
    assert records(client) == []
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "POST /api/v1/profiles: unknown token" in line and "from testclient" in line
    assert "stt_y" not in line


def test_a_read_marked_audited_is_audited(app: FastAPI, token_for: TokenFor) -> None:
    """How a diagnostics download is audited: the endpoint says @audited."""
    router = APIRouter(prefix=f"{API}/hosts")

    @router.get("/{name}/diagnostics-example")
    @audited
    def download(who: Annotated[Principal, Authorized(Permission.READ_DIAGNOSTICS)],
                 name: VisibleHostName) -> dict[str, str]:
        return {"host": name}

    app.include_router(router)
    support = bearer(token_for("support", name="vendor", hosts="role=streamer", expires_in="1h"))
    with TestClient(app, headers=bearer(token_for("admin"))) as admin:
        admin.post(f"{API}/agents/register", json=registration("h1", labels={"role": "streamer"}))
        admin.post(f"{API}/agents/register", json=registration("h2", labels={"role": "db"}))
        assert admin.get(f"{API}/hosts/h1/diagnostics-example", headers=support).status_code == 200
        assert admin.get(f"{API}/hosts/h2/diagnostics-example", headers=support).status_code == 404
        viewer = bearer(token_for("viewer", name="bob"))
        assert admin.get(f"{API}/hosts/h1/diagnostics-example", headers=viewer).status_code == 403
        admin.get(f"{API}/hosts/h1")  # an ordinary read
        rows = records(admin)
    assert [(r["tokenName"], r["method"], r["resource"], r["code"]) for r in rows[:3]] == [
        ("bob", "GET", "hosts/h1/diagnostics-example", 403),
        ("vendor", "GET", "hosts/h2/diagnostics-example", 404),
        ("vendor", "GET", "hosts/h1/diagnostics-example", 200),
    ]


@pytest.mark.parametrize("since", [
    # Hostile: pydantic read these as times although the parameter is documented as an RFC 3339
    # date-time: a Unix time, a date alone, a space for the T, no seconds.
    "1", "1700000000", "1e10", "2025-03-01", "2025-03-01 12:00:00Z", "2025-03-01T12:00Z",
    "yesterday", "", "2025-13-01T00:00:00Z", "2025-02-30T12:00:00Z", "2025-03-01T12:00:00+25:00",
    "\uff12\uff10\uff12\uff15-03-01T12:00:00Z", "2025-03-01T12:00:00Z" + "0" * 1000,
    "2025-03-01T12:00:00\x00Z",
    # Hostile: valid RFC 3339 text whose offset takes the time out of the representable range
    # (a 500 from the UTC conversion before the query).
    "0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-23:59",
])
def test_since_takes_an_rfc3339_date_time_and_nothing_else(client: TestClient, since: str) -> None:
    response = client.get(AUDIT, params={"since": since})
    assert response.status_code == 422, (since, response.text)
    (cause,) = response.json()["details"]["causes"]
    assert cause["field"] == "query.since"
    assert "date-time" in cause["message"]


def test_since_reads_zones(client: TestClient, clock: FakeClock) -> None:
    client.post(f"{API}/profiles", json=profile_doc("vod"))  # audited at 2025-03-01T12:00:00Z
    for since, found in [("2025-03-01T12:00:00Z", 1), ("2025-03-01T12:00:00.000001Z", 0),
                         ("2025-03-01T12:00:00", 1),  # no zone: UTC
                         ("2025-03-01T13:00:00+01:00", 1), ("2025-03-01T12:00:01+00:00", 0),
                         ("2025-03-01t11:59:59z", 1)]:
        assert len(records(client, since=since)) == found, since
    parameters = client.get("/openapi.json").json()["paths"][AUDIT]["get"]["parameters"]
    (documented,) = [p for p in parameters if p["name"] == "since"]
    assert documented["schema"]["anyOf"][0] == {"type": "string", "format": "date-time"}
