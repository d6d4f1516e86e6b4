"""The probes Kubernetes uses (deploy/kubernetes): /healthz asks the database, /livez does not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from sqlalchemy.exc import OperationalError

from stortune.server.api.deps import get_session
from tests.server.support import TestClient


class _DeadDatabase:
    def execute(self, *_: Any, **__: Any) -> None:
        raise OperationalError("SELECT 1", {}, Exception("connection refused"))


def _dead_session() -> Iterator[_DeadDatabase]:
    yield _DeadDatabase()


def test_a_database_outage_fails_readiness_not_liveness(app: FastAPI) -> None:
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/livez").json() == {"status": "ok"}
        app.dependency_overrides[get_session] = _dead_session
        try:
            down = client.get("/healthz")
            assert down.status_code == 503 and "OperationalError" in down.text
            assert "connection refused" not in down.text  # the driver's words stay in the log
            assert client.get("/livez").status_code == 200
        finally:
            app.dependency_overrides.clear()
