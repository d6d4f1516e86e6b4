"""Agents' watches: held heartbeats whose leases the server keeps in batches, and reported digests."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from stortune.server import RecordingController, serving
from stortune.server.services import hosts
from tests.server.builders import API, keyed, loop_topology, registration
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client, bearer, issue_token

AGENTS = f"{API}/agents"
DIGEST_A, DIGEST_B = "a" * 32, "b" * 32


def _beat(**extra: Any) -> dict[str, Any]:
    return {"topology_hash": "", "boot_id": "boot-1", **extra}


def _lease(client: TestClient, name: str = "h1") -> dict[str, Any]:
    lease: dict[str, Any] = client.get(f"{API}/hosts/{name}/lease").json()
    return lease


@pytest.fixture
def quick(make_app: AppFactory) -> FastAPI:
    return make_app(agent_watch_s=0.3)


# -- hostile first ---------------------------------------------------------------------------

@pytest.mark.parametrize("digest", ["A" * 32, "a" * 31, "a" * 33, "g" * 32, "", "a" * 10_000, 7, None],
                         ids=["upper-case", "short", "long", "not-hex", "empty", "huge", "a-number",
                              "null-is-fine"])
def test_hostile_observed_digests_are_refused_naming_the_field(client: TestClient, digest: Any) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    for path in (f"{AGENTS}/h1/heartbeat", f"{AGENTS}/h1/watch"):
        response = client.post(path, json=_beat(observed_digest=digest))
        if digest is None:
            assert response.status_code == 200, response.text
            continue
        assert response.status_code == 422, (path, response.text)
        assert "observed_digest" in response.text


def test_hostile_a_watch_for_an_enrolled_host_without_its_key_is_403_and_audited(quick: FastAPI) -> None:
    agent_token = issue_token(quick, "agent", name="fleet")
    with TestClient(quick, headers=bearer(agent_token)) as agent:
        assert agent.post(f"{AGENTS}/register", json=_with_topology(), headers=keyed()).status_code == 200
        refused = agent.post(f"{AGENTS}/h1/watch", json=_beat(), headers=keyed("intruder"))
        assert refused.status_code == 403, refused.text
        assert agent.post(f"{AGENTS}/ghost/watch", json=_beat(), headers=keyed("ghost")).status_code == 404
        held = agent.post(f"{AGENTS}/h1/watch", json=_beat(topology_hash=TOPOLOGY_HASH), headers=keyed())
        assert held.status_code == 200, held.text
    with admin_client(quick) as admin:
        records = admin.get(f"{API}/audit", params={"resource": "agents/h1/watch"}).json()["items"]
    assert [(r["method"], r["code"]) for r in records] == [("POST", 403)]  # held ones: not audited


def test_hostile_viewer_and_operator_tokens_cannot_watch(app: FastAPI, client: TestClient) -> None:
    client.post(f"{AGENTS}/register", json=registration())
    for role in ("viewer", "operator", "support"):
        secret = issue_token(app, role, hosts="role=streamer" if role == "support" else None,
                             expires_in="1h" if role == "support" else None)
        with TestClient(app, headers=bearer(secret)) as other:
            assert other.post(f"{AGENTS}/h1/watch", json=_beat()).status_code == 403, role


# -- digests ---------------------------------------------------------------------------------

def test_a_new_digest_asks_for_a_look_and_the_same_digest_again_does_not(
        client: TestClient, controller: RecordingController) -> None:
    client.post(f"{AGENTS}/register", json=registration() | {"observed_digest": DIGEST_A})
    controller.clear()
    client.post(f"{AGENTS}/h1/heartbeat", json=_beat(observed_digest=DIGEST_A))
    client.post(f"{AGENTS}/h1/heartbeat", json=_beat())  # an older agent's: no digest, no change
    assert list(controller.requests) == []
    client.post(f"{AGENTS}/h1/heartbeat", json=_beat(observed_digest=DIGEST_B))
    assert list(controller.requests) == [("h1", "agent reported new values")]
    client.post(f"{AGENTS}/h1/heartbeat", json=_beat(observed_digest=DIGEST_B))
    assert len(controller.requests) == 1


# -- holding ---------------------------------------------------------------------------------

def _with_topology(name: str = "h1") -> dict[str, Any]:
    topology = loop_topology(name)
    return registration(name, topology=topology, topology_hash=topology.structure_hash())


TOPOLOGY_HASH = loop_topology().structure_hash()


def _recording_waits(app: FastAPI) -> list[float]:
    """The holds the app's watch book waits out (the only place a watch spends time), recorded."""
    book, waits = app.state.watches, []
    real = book.wait

    async def wait(seconds: float, receive: Any) -> None:
        waits.append(seconds)
        await real(seconds, receive)

    book.wait = wait  # type: ignore[method-assign]
    return waits


def test_a_watch_is_held_then_answered_with_the_hold(quick: FastAPI, clock: FakeClock) -> None:
    waits = _recording_waits(quick)
    with admin_client(quick) as client:
        client.post(f"{AGENTS}/register", json=_with_topology())
        started = time.monotonic()
        answer = client.post(f"{AGENTS}/h1/watch", json=_beat(topology_hash=TOPOLOGY_HASH))
        took = time.monotonic() - started
    body = answer.json()
    assert answer.status_code == 200, answer.text
    assert 0.27 <= body["watch_s"] <= 0.33 and waits == [body["watch_s"]]
    # A lower bound only: the hold is a timed wait, which a slow machine can only lengthen.
    assert took >= body["watch_s"] * 0.9
    assert body["reconnect_after_s"] == 0.0 and body["lease_duration_s"] == 15.0


def test_a_watch_is_answered_at_once_when_the_topology_is_wanted(make_app: AppFactory) -> None:
    """The server wants the topology: the watch is not held at all (no wait, watch_s 0), whatever
    agent_watch_s says, so the agent sends it now."""
    app = make_app(agent_watch_s=60)
    waits = _recording_waits(app)
    with admin_client(app) as client:
        client.post(f"{AGENTS}/register", json=registration())  # no topology yet: wanted
        body = client.post(f"{AGENTS}/h1/watch", json=_beat()).json()
        lease = _lease(client)
    assert body["topology_wanted"] is True and body["watch_s"] == 0.0
    assert waits == [] and app.state.watches.held() == []
    assert body["lease_expires"] == lease["expireTime"]  # the beat itself was recorded


def test_leases_of_held_watches_are_renewed_in_one_batch_and_a_lapsed_host_revived(
        app: FastAPI, client: TestClient, clock: FakeClock) -> None:
    for name in ("h1", "h2", "h3"):
        client.post(f"{AGENTS}/register", json=registration(name))
    book = app.state.watches
    first = _lease(client, "h1")["expireTime"]
    with app.state.sessions() as session:  # the leader declared h2 away meanwhile
        clock.advance(60)
        assert set(hosts.expire_leases(session, clock())) == {"h1", "h2", "h3"}
    with book.holding("h1", 30), book.holding("h2", 30):
        renewed = asyncio.run(book.renew_once())
    assert renewed == 2
    assert _lease(client, "h1")["expireTime"] > first
    assert _lease(client, "h3")["expireTime"] == first  # not watching here: left to expire
    reachable = {c["type"]: c for c in client.get(f"{API}/hosts/h2").json()["status"]["conditions"]}
    assert reachable["Reachable"]["status"] == "True"
    assert book.held() == []


def test_a_watch_past_its_hold_is_no_longer_renewed(app: FastAPI) -> None:
    book = app.state.watches
    moments = iter([0.0, 100.0])
    book._monotonic = lambda: next(moments)
    with book.holding("h1", 30):
        assert book.held() == []  # a half-open connection: its hold is over, its lease is not kept


@pytest.fixture
def served(make_app: AppFactory) -> Iterator[tuple[FastAPI, str, socket.socket]]:
    """The app behind the real uvicorn server stortune-server runs, on 127.0.0.1."""
    app = make_app(agent_watch_s=120)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = serving.Server(app, log_level="warning", lifespan="on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the control plane did not start"
        time.sleep(0.02)
    try:
        yield app, f"127.0.0.1:{sock.getsockname()[1]}", sock
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the server did not stop with watches held"
        sock.close()


def _raw_watch(address: str, secret: str) -> socket.socket:
    host, port = address.split(":")
    conn = socket.create_connection((host, int(port)), timeout=10)
    body = json.dumps(_beat(topology_hash=TOPOLOGY_HASH)).encode()
    conn.sendall(b"POST /api/v1/agents/h1/watch HTTP/1.1\r\nHost: cp\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {secret}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    return conn


def _response(conn: socket.socket) -> tuple[str, bytes]:
    """One whole HTTP response off a raw connection: its head, then its body by Content-Length
    (the head and the body may arrive in separate segments)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed before the response's head: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), None)
    assert length is not None, head
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, f"the connection closed inside the body: {body!r}"
        body += chunk
    return head.decode(), body


def _until(check: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def test_an_agent_going_away_ends_its_watch_and_a_shutdown_ends_the_rest(
        served: tuple[FastAPI, str, socket.socket]) -> None:
    app, address, _ = served
    secret = issue_token(app, "admin")
    registered = httpx.post(f"http://{address}{AGENTS}/register", json=_with_topology(),
                            headers=bearer(secret), timeout=10)
    assert registered.status_code == 200, registered.text
    book = app.state.watches
    gone = _raw_watch(address, secret)
    _until(lambda: book.held() == ["h1"], "the watch is held")
    gone.close()  # the agent's process died: its kernel closed the connection
    _until(lambda: book.held() == [], "the watch ends with its connection")
    stays = _raw_watch(address, secret)
    _until(lambda: book.held() == ["h1"], "a new watch is held")
    book.drain()  # what serving.Server does first on SIGTERM
    head, body = _response(stays)
    stays.close()
    assert head.startswith("HTTP/1.1 200"), head
    reconnect = json.loads(body)["reconnect_after_s"]
    assert 0 <= reconnect <= 10


def test_the_listening_socket_gives_connections_keepalive(
        served: tuple[FastAPI, str, socket.socket]) -> None:
    _, _, listener = served  # accepted connections inherit these on Linux
    assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == serving.KEEPALIVE[0]
    assert listener.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == serving.USER_TIMEOUT_MS
