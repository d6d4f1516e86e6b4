"""/api/v1/profiles/{name}/rollout: reading, watching and steering a rollout (issue 27).

The rollout is started by a profile write over registered hosts; what the driver would write
later (a new phase, a host updated) is written to the row here, so each test decides when the
status moves: the driver is stopped, but in the test that watches it take a command.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy.exc import OperationalError

from stortune.schemas.rollout import machine
from stortune.server.api.routes import rollouts as routes
from stortune.server.db.tables import Rollout
from stortune.server.services import rollouts
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.conftest import TokenFor
from tests.server.support import AppFactory, TestClient, admin_client, bearer, issue_token

HOSTS = ("h1", "h2", "h3", "h4")


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """An admin's client; the rollout driver is stopped: the test is the driver."""
    with admin_client(app) as test_client:
        assert test_client.portal is not None
        test_client.portal.call(app.state.rollouts.stop)
        yield test_client


def start_rollout(app: FastAPI, client: TestClient, name: str = "vod",
                  hosts: tuple[str, ...] = HOSTS) -> dict[str, Any]:
    """Hosts with a loop device, and a profile that changes their read-ahead: its rollout."""
    for host in hosts:
        response = client.post(f"{API}/agents/register",
                               json=registration(host, topology=loop_topology(host)))
        assert response.status_code == 200, response.text
    assert client.post(f"{API}/profiles", json=profile_doc(name)).status_code == 201
    status = rollout(client, name)
    assert sorted(h["name"] for h in status["hosts"]) == sorted(hosts)
    return status


def rewrite(app: FastAPI, name: str, **changes: Any) -> int:
    """What a driver step would store: the state with ``changes``; the row's new version."""
    with app.state.sessions() as session:
        row = session.get(Rollout, name)
        assert row is not None
        state = machine.RolloutState.model_validate(row.state).model_copy(update=changes)
        row.state = state.model_dump(mode="json")
        row.phase = state.phase
        session.commit()
        version: int = row.version
        return version


def rollout(client: TestClient, name: str = "vod", **params: Any) -> dict[str, Any]:
    response = client.get(f"{API}/profiles/{name}/rollout", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def watch(client: TestClient, name: str, **params: Any) -> Iterator[dict[str, Any]]:
    with client.stream("GET", f"{API}/profiles/{name}/rollout",
                       params={"watch": "true", **params}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith(routes.MEDIA_TYPE)
        for line in response.iter_lines():
            if line:
                yield json.loads(line)


def audit(client: TestClient) -> list[tuple[str, str, str, int]]:
    rows = client.get(f"{API}/audit", params={"limit": 20}).json()["items"]
    return [(r["role"], r["method"], r["resource"], r["code"]) for r in rows]


# -- hostile ------------------------------------------------------------------------------------


def test_hostile_unknown_profile_is_404_naming_it_for_every_route(client: TestClient) -> None:
    for method, path in (("GET", "rollout"), ("GET", "rollout?watch=true"), ("POST", "rollout/pause"),
                         ("POST", "rollout/resume"), ("POST", "rollout/undo")):
        response = client.request(method, f"{API}/profiles/ghost/{path}")
        assert response.status_code == 404, (method, path, response.text)
        body = response.json()
        assert body["message"] == 'StorageProfile "ghost" not found', (method, path)
        assert (body["details"]["kind"], body["details"]["name"]) == ("StorageProfile", "ghost")


def test_hostile_profile_without_rollout_is_404_saying_so_watch_included(client: TestClient) -> None:
    assert client.post(f"{API}/profiles", json=profile_doc("plain")).status_code == 201
    for params in ({}, {"watch": "true"}, {"watch": "true", "timeoutSeconds": 1}):
        response = client.get(f"{API}/profiles/plain/rollout", params=params)
        assert response.status_code == 404, response.text
        details = response.json()["details"]
        assert (details["kind"], details["name"]) == ("Rollout", "plain")
        assert 'StorageProfile "plain" has no rollout' in response.json()["message"]
    response = client.post(f"{API}/profiles/plain/rollout/pause")
    assert response.status_code == 404
    assert 'StorageProfile "plain" has no rollout' in response.json()["message"]


def test_hostile_unknown_command_is_404_naming_it_and_the_commands(
    app: FastAPI, client: TestClient,
) -> None:
    start_rollout(app, client)
    before = rollout(client)["version"]
    for command in ("explode", "PAUSE", "pause%00", "x" * 300):
        response = client.post(f"{API}/profiles/vod/rollout/{command}")
        assert response.status_code == 404, (command, response.text)
        assert "pause, resume or undo" in response.json()["message"]
    assert client.post(f"{API}/profiles/vod/rollout/pause/now").status_code == 404
    assert client.get(f"{API}/profiles/vod/rollout/pause").status_code in (404, 405)  # a POST only
    assert rollout(client)["version"] == before and rollout(client)["pendingCommands"] == []


@pytest.mark.parametrize("command", ["pause", "resume", "undo"])
def test_hostile_viewer_reads_but_may_not_steer_and_the_refusal_is_audited(
    app: FastAPI, client: TestClient, token_for: TokenFor, command: str,
) -> None:
    start_rollout(app, client)
    viewer = bearer(token_for("viewer", name="bob"))
    assert client.get(f"{API}/profiles/vod/rollout", headers=viewer).status_code == 200
    response = client.post(f"{API}/profiles/vod/rollout/{command}", headers=viewer)
    assert response.status_code == 403, response.text
    assert "write profiles" in response.json()["message"]
    assert audit(client)[0] == ("viewer", "POST", f"profiles/vod/rollout/{command}", 403)
    assert rollout(client)["pendingCommands"] == []


def test_hostile_support_and_agent_tokens_may_not_read_a_rollout(
    app: FastAPI, client: TestClient, token_for: TokenFor,
) -> None:
    # A support token is scoped to some hosts; a rollout's status names hosts fleet-wide.
    start_rollout(app, client)
    for role, hosts in (("support", "role=streamer"), ("agent", None), ("metrics", None)):
        kwargs: dict[str, Any] = {"hosts": hosts, "expires_in": "1h"} if hosts else {}
        headers = bearer(token_for(role, **kwargs))
        for params in ({}, {"watch": "true"}):
            response = client.get(f"{API}/profiles/vod/rollout", params=params, headers=headers)
            assert response.status_code == 403, (role, params, response.text)


@pytest.mark.parametrize(("params", "field"), [
    ({"watch": "true", "timeoutSeconds": routes.WATCH_MAX_S + 1}, "timeoutSeconds"),
    ({"watch": "true", "timeoutSeconds": 0}, "timeoutSeconds"),
    ({"watch": "true", "timeoutSeconds": "soon"}, "timeoutSeconds"),
    ({"watch": "maybe"}, "watch"),
    ({"limit": 0}, "limit"),
    ({"limit": routes.HOSTS_MAX + 1}, "limit"),
])
def test_hostile_watch_bounds_are_refused_422_naming_the_parameter(
    app: FastAPI, client: TestClient, params: dict[str, Any], field: str,
) -> None:
    start_rollout(app, client)
    response = client.get(f"{API}/profiles/vod/rollout", params=params)
    assert response.status_code == 422, response.text
    assert [c["field"] for c in response.json()["details"]["causes"]] == [f"query.{field}"]


def test_hostile_bounds_at_their_limit_are_taken(app: FastAPI, client: TestClient) -> None:
    start_rollout(app, client)
    rewrite(app, "vod", phase="Complete")  # a watch of a complete rollout ends at once
    lines = list(watch(client, "vod", timeoutSeconds=routes.WATCH_MAX_S, limit=routes.HOSTS_MAX))
    assert [line["type"] for line in lines] == ["status", "end"]
    assert rollout(client, limit=1)["hostsListed"] == 1


def test_hostile_a_name_that_cannot_exist_is_404(client: TestClient) -> None:
    for name in ("UPPER", "a_b", "-x", "x" * 254):
        assert client.get(f"{API}/profiles/{name}/rollout").status_code == 404, name


def test_hostile_the_same_command_twice_is_queued_twice_and_bounded(
    app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_rollout(app, client)
    monkeypatch.setattr(rollouts, "request_wake", lambda _session: None)  # the driver must not take them
    for _ in range(rollouts.MAX_PENDING_COMMANDS):
        assert client.post(f"{API}/profiles/vod/rollout/pause").status_code == 200
    response = client.post(f"{API}/profiles/vod/rollout/pause")
    assert response.status_code == 409, response.text
    assert len(rollout(client)["pendingCommands"]) == rollouts.MAX_PENDING_COMMANDS


# -- reading --------------------------------------------------------------------------------------


def test_status_names_waves_hosts_and_counts(app: FastAPI, client: TestClient) -> None:
    start_rollout(app, client)
    status = rollout(client)
    assert status["profile"] == "vod" and status["generation"] == 1 and status["previous"] == 0
    assert status["phase"] == "Progressing" and status["wave"] == 1
    assert sorted(h["name"] for h in status["hosts"]) == list(HOSTS)
    assert sum(w["hosts"] for w in status["waves"]) == len(HOSTS) == sum(status["counts"].values())
    assert [w["number"] for w in status["waves"]] == list(range(1, len(status["waves"]) + 1))
    assert isinstance(status["version"], int)
    limited = rollout(client, limit=2)
    assert len(limited["hosts"]) == 2 and limited["hostsTotal"] == len(HOSTS)


def test_hostile_a_profile_deleted_before_any_host_applied_it_takes_its_rollout_along(
    app: FastAPI, client: TestClient,
) -> None:
    start_rollout(app, client)
    assert client.delete(f"{API}/profiles/vod").status_code == 200  # nothing to put back: gone at once
    for method, path in (("GET", "rollout"), ("GET", "rollout?watch=true"), ("POST", "rollout/undo")):
        response = client.request(method, f"{API}/profiles/vod/{path}")
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["message"] == 'StorageProfile "vod" not found'


def test_openapi_names_the_operations(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    ids = {op["operationId"] for path, ops in paths.items() if "/rollout" in path for op in ops.values()}
    assert ids == {"getProfileRollout", "pauseProfileRollout", "resumeProfileRollout", "undoProfileRollout"}


# -- the watch ----------------------------------------------------------------------------------


def test_watch_sends_each_version_and_ends_with_the_phase(
    app: FastAPI, client: TestClient,
) -> None:
    start_rollout(app, client)
    lines = watch(client, "vod", timeoutSeconds=60)
    first = next(lines)
    assert first["type"] == "status" and first["status"]["phase"] == "Progressing"
    moved = rewrite(app, "vod", wave=1)
    second = next(lines)
    assert second["type"] == "status"
    assert second["status"]["version"] == moved and second["status"]["wave"] == 2
    done = rewrite(app, "vod", phase="Complete")
    third = next(lines)
    assert third["status"]["version"] == done and third["status"]["phase"] == "Complete"
    assert next(lines) == {"type": "end", "reason": "Complete", "phase": "Complete"}
    assert next(lines, None) is None


def test_watch_of_a_halt_that_reverts_ends_once_rolled_back(
    app: FastAPI, client: TestClient,
) -> None:
    start_rollout(app, client)
    rewrite(app, "vod", phase="Halted", reason="FailureLimit", rollback=True)
    lines = watch(client, "vod", timeoutSeconds=60)
    assert next(lines)["status"]["rolledBack"] is False  # still reverting: the watch goes on
    rewrite(app, "vod", rolledBack=True)
    assert next(lines)["status"]["rolledBack"] is True
    assert next(lines) == {"type": "end", "reason": "Halted", "phase": "Halted"}


def test_watch_of_a_halt_without_rollback_ends_at_once(
    app: FastAPI, client: TestClient,
) -> None:
    start_rollout(app, client)
    rewrite(app, "vod", phase="Halted", reason="FailureLimit")
    assert [line["type"] for line in watch(client, "vod")] == ["status", "end"]


def test_watch_ends_at_its_timeout_with_the_phase(app: FastAPI, client: TestClient) -> None:
    start_rollout(app, client)
    lines = list(watch(client, "vod", timeoutSeconds=1))
    assert [line["type"] for line in lines] == ["status", "end"]
    assert lines[-1] == {"type": "end", "reason": "Timeout", "phase": "Progressing"}


def test_watch_ends_when_the_rollout_goes_away(app: FastAPI, client: TestClient) -> None:
    start_rollout(app, client)
    lines = watch(client, "vod", timeoutSeconds=60)
    assert next(lines)["type"] == "status"
    with app.state.sessions() as session:
        session.delete(session.get(Rollout, "vod"))
        session.commit()
    assert next(lines) == {"type": "end", "reason": "Gone", "phase": "Progressing"}


def test_watch_ends_when_the_server_drains(app: FastAPI, client: TestClient) -> None:
    start_rollout(app, client)
    lines = watch(client, "vod", timeoutSeconds=60)
    assert next(lines)["type"] == "status"
    app.state.watches.drain()
    assert next(lines) == {"type": "end", "reason": "ServerShutdown", "phase": "Progressing"}


def test_hostile_a_database_failure_mid_watch_ends_it_saying_so(
    app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_rollout(app, client)
    lines = watch(client, "vod", timeoutSeconds=60)
    assert next(lines)["type"] == "status"  # sent: a failure now cannot be a status code any more

    def lost(_session: Any, _name: str) -> int:
        raise OperationalError("SELECT version", {}, Exception("server closed the connection"))

    monkeypatch.setattr(rollouts, "version", lost)
    end = next(lines)
    assert (end["type"], end["reason"], end["phase"]) == ("end", "Error", "Progressing")
    assert "watch again" in end["message"] and "server closed" not in end["message"]
    assert next(lines, None) is None
    monkeypatch.undo()
    assert rollout(client)["phase"] == "Progressing"  # the next watch or read works


# -- steering -----------------------------------------------------------------------------------


def test_operator_pauses_the_driver_takes_it_and_both_are_recorded(
    make_app: AppFactory,
) -> None:
    # The driver runs here, at a quick pace: a step that fails (a busy database) is tried again soon.
    app = make_app(rollout_interval_s=0.2)
    with admin_client(app) as client:
        start_rollout(app, client)
        operator = bearer(issue_token(app, "operator", name="alice"))
        response = client.post(f"{API}/profiles/vod/rollout/pause", headers=operator)
        assert response.status_code == 200, response.text
        assert [c["command"] for c in response.json()["pendingCommands"]] == ["pause"]
        assert "alice" in response.json()["pendingCommands"][0]["by"]
        assert audit(client)[0] == ("operator", "POST", "profiles/vod/rollout/pause", 200)
        events = client.get(f"{API}/events", params={"profile": "vod"}).json()["items"]
        assert "PauseRequested" in [e["reason"] for e in events]
        # The command woke the driver: the watch sees it taken (a state awaited, not a time).
        for line in watch(client, "vod", timeoutSeconds=30):
            if line["type"] == "status" and line["status"]["phase"] == "Paused":
                assert line["status"]["pendingCommands"] == []
                break
        else:
            pytest.fail("the driver did not pause the rollout within the watch")


def test_admin_undoes_a_complete_rollout(
    app: FastAPI, client: TestClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    start_rollout(app, client)
    rewrite(app, "vod", phase="Complete")
    monkeypatch.setattr(rollouts, "request_wake", lambda _session: None)
    body = client.post(f"{API}/profiles/vod/rollout/undo").json()
    assert [c["command"] for c in body["pendingCommands"]] == ["undo"]
    assert "test-admin" in body["pendingCommands"][0]["by"]
