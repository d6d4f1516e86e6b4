"""API tokens: issued once, stored hashed, revoked at once; support tokens see only their hosts."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import select

from stortune.server.db.tables import ApiToken, Base
from tests.server.builders import API, keyed, loop_topology, profile_doc, registration
from tests.server.conftest import TokenFor
from tests.server.support import FakeClock, TestClient, bearer

TOKENS = f"{API}/tokens"


def create(client: TestClient, **body: Any) -> dict[str, Any]:
    response = client.post(TOKENS, json=body)
    assert response.status_code == 201, response.text
    data: dict[str, Any] = response.json()
    return data


def test_a_token_is_shown_once_works_and_is_revoked_at_once(client: TestClient, clock: FakeClock) -> None:
    made = create(client, role="viewer", name="dashboards", description="grafana")
    secret = made.pop("token")
    assert secret.startswith("stt_") and len(secret) >= 40
    assert made["role"] == "viewer" and made["name"] == "dashboards" and made["expiresAt"] is None
    assert made["createdBy"].startswith("token ") and "role admin" in made["createdBy"]
    listed = {t["id"]: t for t in client.get(TOKENS).json()["items"]}
    assert listed[made["id"]] == made  # the same view, never the secret again
    assert all("token" not in t for t in listed.values())
    assert client.get(f"{TOKENS}/{made['id']}").json() == made

    assert client.get(f"{API}/profiles", headers=bearer(secret)).status_code == 200
    revoked = client.delete(f"{TOKENS}/{made['id']}")
    assert revoked.status_code == 200 and revoked.json()["revokedAt"] == clock.now.isoformat().replace(
        "+00:00", "Z")
    refused = client.get(f"{API}/profiles", headers=bearer(secret))
    assert refused.status_code == 401 and "revoked" in refused.json()["message"]
    assert client.delete(f"{TOKENS}/{made['id']}").status_code == 200  # revoking again changes nothing
    assert client.delete(f"{TOKENS}/000000000000").status_code == 404
    assert client.get(f"{TOKENS}/not-an-id").status_code == 404


def test_the_database_holds_no_token_in_plain_text(app: FastAPI, client: TestClient,
                                                   token_for: TokenFor) -> None:
    secrets = [create(client, role=role)["token"] for role in ("viewer", "operator", "agent")]
    secrets.append(token_for("support", hosts="role=streamer", expires_in="1h"))
    for secret in secrets:  # used, so they have been looked up, noted as used and audited
        client.post(f"{API}/agents/register", json=registration("h1"), headers=bearer(secret))
        client.post(f"{API}/profiles", json=profile_doc(), headers=bearer(secret))
    with app.state.engine.connect() as conn:
        dump = "\n".join(repr(tuple(row)) for table in Base.metadata.sorted_tables
                         for row in conn.execute(select(table)))
    for secret in secrets:
        assert secret not in dump and secret.removeprefix("stt_") not in dump
        assert hashlib.sha256(secret.encode()).hexdigest() in dump  # what is kept instead
    with app.state.sessions() as session:
        assert len(session.scalars(select(ApiToken)).all()) == len(secrets) + 1  # + the client's admin


@pytest.mark.parametrize(("body", "field", "message"), [
    ({"role": "support", "expiresIn": "72h"}, "hostSelector", "must name the hosts"),
    ({"role": "support", "hostSelector": "role=streamer"}, "expiresIn", "must expire"),
    ({"role": "viewer", "hostSelector": "role=streamer"}, "hostSelector", "only support tokens"),
    ({"role": "support", "hostSelector": "role in x", "expiresIn": "1h"}, "hostSelector", "cannot parse"),
    ({"role": "support", "hostSelector": "role=bad value", "expiresIn": "1h"}, "hostSelector", ""),
    ({"role": "viewer", "expiresIn": "soon"}, "expiresIn", "not a duration"),
    ({"role": "viewer", "expiresIn": "0h"}, "expiresIn", "more than 0"),
    ({"role": "root"}, "role", ""),
    ({"role": "viewer", "name": "a\nb"}, "name", ""),
    ({"role": "viewer", "secret": "mine"}, "secret", "unknown field"),
])
def test_bad_token_requests_are_422_naming_the_field(
    client: TestClient, body: dict[str, Any], field: str, message: str,
) -> None:
    response = client.post(TOKENS, json=body)
    assert response.status_code == 422, response.text
    cause = response.json()["details"]["causes"][0]
    assert cause["field"] == field and message in cause["message"]


def test_expiry_is_exact(client: TestClient, clock: FakeClock) -> None:
    secret = create(client, role="viewer", expiresIn="2h")["token"]
    clock.advance(2 * 3600 - 1)
    assert client.get(f"{API}/events", headers=bearer(secret)).status_code == 200
    clock.advance(1)
    refused = client.get(f"{API}/events", headers=bearer(secret))
    assert refused.status_code == 401 and "expired" in refused.json()["message"]
    assert 'error="invalid_token"' in refused.headers["www-authenticate"]


def test_last_used_is_written_about_once_a_minute(client: TestClient, clock: FakeClock) -> None:
    made = create(client, role="agent")
    assert made["lastUsedAt"] is None
    start = clock.now

    def last_used() -> str:
        return str(client.get(f"{TOKENS}/{made['id']}").json()["lastUsedAt"])

    beat = {"topology_hash": "", "boot_id": "boot-1"}
    client.post(f"{API}/agents/register", json=registration("h1"), headers={**bearer(made["token"]),
                                                                            **keyed("h1")})
    assert last_used().startswith(start.isoformat()[:19])
    for _ in range(5):  # heartbeats within the minute: no write
        clock.advance(11)
        client.post(f"{API}/agents/h1/heartbeat", json=beat, headers={**bearer(made["token"]),
                                                                      **keyed("h1")})
    assert last_used().startswith(start.isoformat()[:19])
    clock.advance(11)
    client.post(f"{API}/agents/h1/heartbeat", json=beat, headers={**bearer(made["token"]), **keyed("h1")})
    assert last_used().startswith(clock.now.isoformat()[:19])


def host_names(response: Any) -> list[str]:
    return [h["metadata"]["name"] for h in response.json()["items"]]


def test_a_support_token_sees_only_the_hosts_it_selects_until_it_expires(
    client: TestClient, token_for: TokenFor, clock: FakeClock,
) -> None:
    client.post(f"{API}/agents/register", json=registration("h1", labels={"role": "streamer"},
                                                            topology=loop_topology("h1")))
    client.post(f"{API}/agents/register", json=registration("h2", labels={"role": "db"},
                                                            topology=loop_topology("h2")))
    support = bearer(token_for("support", hosts="role=streamer", expires_in="72h"))

    assert host_names(client.get(f"{API}/hosts")) == ["h1", "h2"]
    assert host_names(client.get(f"{API}/hosts", headers=support)) == ["h1"]  # not the admin's cached list
    for tail in ("", "/status", "/lease", "/topology"):
        assert client.get(f"{API}/hosts/h1{tail}", headers=support).status_code == 200, tail
        outside = client.get(f"{API}/hosts/h2{tail}", headers=support)
        # Exactly what a host that does not exist answers: nothing to learn about h2.
        assert outside.status_code == 404, tail
        assert outside.json()["message"] == 'Host "h2" not found'
    events = client.get(f"{API}/events", headers=support).json()["items"]
    assert events and {e["host"] for e in events} == {"h1"}
    assert client.get(f"{API}/events", params={"host": "h2"}, headers=support).json()["items"] == []
    assert client.get(f"{API}/profiles", headers=support).status_code == 403
    assert client.patch(f"{API}/hosts/h1/labels", json={"labels": {"a": "b"}},
                        headers=support).status_code == 403

    # The selector is evaluated at each call: a host labelled into it becomes visible.
    client.patch(f"{API}/hosts/h2/labels", json={"labels": {"role": "streamer"}})
    assert client.get(f"{API}/hosts/h2", headers=support).status_code == 200

    clock.advance(72 * 3600)
    expired = client.get(f"{API}/hosts/h1", headers=support)
    assert expired.status_code == 401 and "expired" in expired.json()["message"]


def test_an_agent_token_may_only_report(client: TestClient, token_for: TokenFor) -> None:
    agent = bearer(token_for("agent"))
    assert client.post(f"{API}/agents/register", json=registration("h1"),
                       headers={**agent, **keyed("h1")}).status_code == 200
    assert client.get(f"{API}/hosts/h1", headers=agent).status_code == 403
    assert client.get(f"{API}/tokens", headers=agent).status_code == 403
    assert client.post(TOKENS, json={"role": "admin"}, headers=agent).status_code == 403
