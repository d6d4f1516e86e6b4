"""Fixtures of the control-plane tests: every API test runs on SQLite and on PostgreSQL.

PostgreSQL: one fresh database per test session on STORTUNE_TEST_PG (default
postgresql://postgres@127.0.0.1:5432/test, used only to create and drop it),
emptied after each test. Unreachable: the PostgreSQL cases skip and say why.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from psycopg import sql
from sqlalchemy.engine import make_url

from stortune.server import RecordingController, Settings, create_app
from stortune.server.db.tables import Base
from tests.server.support import AppFactory, FakeClock, TestClient

PG_ADMIN_URL = os.environ.get("STORTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL} (set STORTUNE_TEST_PG): {exc}")
    name = f"stortune_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            url = make_url(PG_ADMIN_URL).set(drivername="postgresql+psycopg", database=name)
            yield url.render_as_string(hide_password=False)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _empty_pg(url: str) -> None:
    conninfo = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    tables = [t.name for t in Base.metadata.sorted_tables if t.name != "counters"]
    with psycopg.connect(conninfo, autocommit=True) as conn:
        present = {row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}
        if set(tables) <= present:
            conn.execute(sql.SQL("TRUNCATE {} RESTART IDENTITY").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in tables)))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'stortune.db'}"
        return
    url: str = request.getfixturevalue("pg_database")
    try:
        yield url
    finally:
        _empty_pg(url)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_app(db_url: str, clock: FakeClock) -> Iterator[AppFactory]:
    """Apps on the test's database; each one's engine is disposed at the end."""
    apps: list[FastAPI] = []

    def build(**overrides: Any) -> FastAPI:
        controller = overrides.pop("controller", RecordingController())
        app = create_app(Settings(db_url=db_url, **overrides), controller=controller, clock=clock)
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
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def controller(app: FastAPI) -> RecordingController:
    recorder: RecordingController = app.state.controller
    return recorder
