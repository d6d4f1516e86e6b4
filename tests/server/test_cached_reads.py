"""Host reads answered before routing (api/cached_reads.py): the same answers, the same checks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from stortune.schemas.profile import LabelSelector
from stortune.server.api.access import PRINCIPAL
from stortune.server.api.cached_reads import CachedReads
from stortune.server.auth import Principal, Role
from tests.server.builders import API, registration
from tests.server.conftest import TokenFor
from tests.server.support import TestClient, bearer

HOSTS = f"{API}/hosts"
PATHS = [HOSTS, f"{HOSTS}/h1", f"{HOSTS}/h1/status"]


def two_hosts(client: TestClient) -> None:
    client.post(f"{API}/agents/register", json=registration("h1"))
    other = registration("h2")
    other["labels"] = {"role": "database"}
    client.post(f"{API}/agents/register", json=other)


@pytest.mark.parametrize("path", PATHS)
def test_a_kept_body_is_answered_exactly_as_the_route_answers_it(client: TestClient, path: str) -> None:
    two_hosts(client)
    for encoding in ("identity", "gzip"):
        rendered = client.get(path, headers={"Accept-Encoding": encoding})  # a miss: the route
        kept = client.get(path, headers={"Accept-Encoding": encoding})  # kept: answered before routing
        assert kept.status_code == rendered.status_code == 200
        assert kept.content == rendered.content
        for header in ("etag", "cache-control", "vary", "content-type", "content-encoding"):
            assert kept.headers.get(header) == rendered.headers.get(header), header
        again = client.get(path, headers={"If-None-Match": kept.headers["ETag"]})
        assert again.status_code == 304 and not again.content


def test_a_write_is_seen_at_once(client: TestClient) -> None:
    two_hosts(client)
    before = client.get(f"{HOSTS}/h1").json()
    assert client.get(f"{HOSTS}/h1").json() == before  # kept
    client.patch(f"{HOSTS}/h1/labels", json={"labels": {"tier": "gold"}})
    assert client.get(f"{HOSTS}/h1").json()["metadata"]["labels"]["tier"] == "gold"
    assert [h["metadata"]["labels"].get("tier") for h in client.get(HOSTS).json()["items"]] == ["gold", None]


def test_scoped_and_unauthorised_callers_still_meet_the_routes_checks(
        client: TestClient, token_for: TokenFor) -> None:
    two_hosts(client)
    for path in [*PATHS, f"{HOSTS}/h2", f"{HOSTS}/h2/status"]:
        assert client.get(path).status_code == 200  # kept for the admin
    support = bearer(token_for(Role.SUPPORT, hosts="role=streamer", expires_in="72h"))
    assert client.get(f"{HOSTS}/h2", headers=support).status_code == 404  # outside its reach
    assert client.get(f"{HOSTS}/h2/status", headers=support).status_code == 404
    assert [h["metadata"]["name"] for h in client.get(HOSTS, headers=support).json()["items"]] == ["h1"]
    agent = bearer(token_for(Role.AGENT))
    for path in PATHS:
        assert client.get(path, headers=agent).status_code == 403


# -- the middleware on its own: when it answers and when it leaves the request to the route ----------
class Downstream:
    def __init__(self) -> None:
        self.called: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.called.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def ask(app: FastAPI, principal: Principal | None, path: str, *, method: str = "GET",
        query: bytes = b"") -> tuple[int, bool]:
    """(status, whether the route was reached) for one request through CachedReads."""
    downstream = Downstream()
    middleware = CachedReads(downstream, api_prefix=API)
    scope: dict[str, Any] = {"type": "http", "method": method, "path": path, "query_string": query,
                             "headers": [], "app": app}
    if principal is not None:
        scope[PRINCIPAL] = principal
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"], bool(downstream.called)


def test_only_kept_reads_of_unscoped_readers_skip_the_route(app: FastAPI, client: TestClient) -> None:
    two_hosts(client)
    for path in PATHS:
        client.get(path)  # rendered and kept
    def principal(role: Role, hosts: LabelSelector | None = None) -> Principal:
        return Principal(f"id-{role.value}", role.value, role, hosts)

    admin, viewer, agent = principal(Role.ADMIN), principal(Role.VIEWER), principal(Role.AGENT)
    scoped = principal(Role.SUPPORT, LabelSelector.model_validate({"matchLabels": {"role": "streamer"}}))
    for path in PATHS:
        assert ask(app, admin, path) == (200, False)
        assert ask(app, viewer, path) == (200, False)
        assert ask(app, scoped, path)[1], path
        assert ask(app, agent, path)[1], path
        assert ask(app, None, path)[1], path
        assert ask(app, admin, path, query=b"labelSelector=role%3Dstreamer")[1], path
        assert ask(app, admin, path, method="DELETE")[1], path
    for path in [f"{HOSTS}/h1/lease", f"{HOSTS}/h1/topology", f"{HOSTS}/", f"{HOSTS}/h3", f"{HOSTS}/h1/x"]:
        assert ask(app, admin, path)[1], path  # not a kept read: h3 was never rendered


PAGED = ["limit=1", "limit=1&condition=Reachable=True", "labelSelector=role%3Dstreamer",
         "condition=Reachable=True&condition=Drifted=Unknown&limit=5"]


@pytest.mark.parametrize("query", PAGED)
def test_a_kept_page_is_answered_before_routing_exactly_as_the_route_answers_it(
        app: FastAPI, client: TestClient, query: str) -> None:
    two_hosts(client)
    rendered = client.get(f"{HOSTS}?{query}", headers={"Accept-Encoding": "gzip"})  # the route renders
    kept = client.get(f"{HOSTS}?{query}", headers={"Accept-Encoding": "gzip"})
    assert rendered.status_code == kept.status_code == 200 and kept.content == rendered.content
    assert kept.headers["etag"] == rendered.headers["etag"]
    admin = Principal("id-admin", "admin", Role.ADMIN, None)
    assert ask(app, admin, HOSTS, query=query.encode()) == (200, False)
    # The next page is a page of its own: the route renders it once.
    token = client.get(f"{HOSTS}?limit=1").json()["metadata"].get("continue")
    if token is not None:
        assert ask(app, admin, HOSTS, query=f"limit=1&continue={token}".encode())[1]


@pytest.mark.parametrize("query", [
    b"limit=1&limit=2", b"limit=0", b"limit=1001", b"limit=x", b"limit=1&extra=1", b"continue=abc",
    b"condition=Drifted", b"labelSelector=role+in+((", b"limit=1&continue=%FF%FE", b"\xff\xfe",
    b"limit=1&" + b"condition=Drifted=True&" * 9, b"labelSelector=" + b"a" * 9000,
], ids=["twice", "zero", "too-many", "not-a-number", "unknown-key", "token-without-limit",
        "bad-condition", "bad-selector", "bad-token", "non-ascii", "too-many-conditions", "huge"])
def test_hostile_queries_the_middleware_cannot_read_as_the_route_go_to_the_route(
        app: FastAPI, client: TestClient, query: bytes) -> None:
    two_hosts(client)
    client.get(f"{HOSTS}?limit=1")
    admin = Principal("id-admin", "admin", Role.ADMIN, None)
    assert ask(app, admin, HOSTS, query=query)[1], query
