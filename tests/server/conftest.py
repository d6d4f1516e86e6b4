"""Fixtures of the control-plane tests: every API test runs on SQLite and on PostgreSQL.

PostgreSQL: one fresh database per test session on STORTUNE_TEST_PG (default
postgresql://postgres@127.0.0.1:5432/test, used only to create and drop it),
emptied after each test. Unreachable: the PostgreSQL cases skip and say why.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from psycopg import sql
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from stortune.api.agent import tls
from stortune.server import RecordingController, Settings, create_app
from stortune.server.agentclient import FakeAgentClients
from stortune.server.auth import Role
from stortune.server.db.engine import make_engine, make_sessions
from stortune.server.db.migrate import upgrade
from stortune.server.db.tables import Base
from tests.pgdb import fresh_database
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client, issue_token

PG_ADMIN_URL = os.environ.get("STORTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    yield from new_pg_database("stortune_test")


def new_pg_database(prefix: str) -> Generator[str, None, None]:
    """A database of its own on the test server, dropped afterwards (skips without PostgreSQL)."""
    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL} (set STORTUNE_TEST_PG): {exc}")
    with fresh_database(PG_ADMIN_URL, f"{prefix}_{uuid.uuid4().hex[:12]}") as url:
        yield url


def _empty_pg(url: str) -> None:
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    tables = [t.name for t in Base.metadata.sorted_tables if t.name != "counters"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        present = {row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
        if set(tables) <= present:
            conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in tables)))


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once: each test starts from a copy (as PostgreSQL's tests
    start from the one migrated database, emptied), not by running every migration again."""
    path = tmp_path_factory.mktemp("sqlite-template") / "stortune.db"
    engine = make_engine(f"sqlite:///{path}")
    try:
        upgrade(engine)
    finally:
        engine.dispose()  # the last connection's close folds the WAL into the file
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        path = tmp_path / "stortune.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), path)
        yield f"sqlite:///{path}"
        return
    url: str = request.getfixturevalue("pg_database")
    try:
        yield url
    finally:
        _empty_pg(url)


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    """The migrated database's sessions, without an app (services and the rollout driver by hand)."""
    engine = make_engine(db_url)
    upgrade(engine)
    try:
        yield make_sessions(engine)
    finally:
        engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def agent_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agents' CA and the control plane's client certificate, as `certs init` makes them."""
    directory = tmp_path_factory.mktemp("pki")
    tls.init_pki(directory)
    return directory


@pytest.fixture
def make_app(db_url: str, clock: FakeClock, agent_pki: Path) -> Iterator[AppFactory]:
    """Apps on the test's database; each one's engine is disposed at the end.

    ``agents=`` (an AgentClientFactory, e.g. FakeAgentClients) runs the real
    reconciler against it; otherwise reconcile requests go to a RecordingController.
    """
    apps: list[FastAPI] = []

    def build(**overrides: Any) -> FastAPI:
        agents = overrides.pop("agents", None)
        controller = overrides.pop("controller", None if agents is not None else RecordingController())
        # Routes that dial agents (diagnostics, benchmarks) get fakes unless a test brings its own.
        agents = agents if agents is not None else FakeAgentClients()
        # The lease times the tests count with (the fake clock advances past them).
        timing = {"lease_duration_s": 15, "heartbeat_interval_s": 5, "agent_pki": agent_pki}
        app = create_app(Settings(db_url=db_url, **{**timing, **overrides}), controller=controller,
                         agents=agents, clock=clock)
        apps.append(app)
        return app

    yield build
    for app in apps:
        app.state.engine.dispose()


@pytest.fixture
def app(make_app: AppFactory) -> FastAPI:
    return make_app()


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    """The app as an admin sees it (admin may do everything, the agent calls included)."""
    with admin_client(app) as test_client:
        yield test_client


TokenFor = Callable[..., str]


@pytest.fixture
def token_for(app: FastAPI) -> TokenFor:
    """``token_for("support", hosts="role=streamer", expires_in="72h")``: a new token's secret."""

    def issue(role: Role | str, *, hosts: str | None = None, expires_in: str | None = None,
              name: str | None = None) -> str:
        return issue_token(app, role, hosts=hosts, expires_in=expires_in, name=name)

    return issue


@pytest.fixture
def controller(app: FastAPI) -> RecordingController:
    recorder: RecordingController = app.state.controller
    return recorder


Eventually = Callable[..., Any]


@pytest.fixture
def eventually() -> Eventually:
    """``eventually(check, timeout=15)``: poll ``check`` until it returns something truthy
    and return that, or fail naming what was awaited. For background work (the reconciler)."""

    def wait(check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s: {what or check}; last: {value!r}")
            time.sleep(0.02)

    return wait
