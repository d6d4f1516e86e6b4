"""The probes Kubernetes uses (deploy/kubernetes): /healthz asks the database, /livez does not."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from sqlalchemy.exc import OperationalError

from tests.server.support import TestClient


class _DeadDatabase:
    def __enter__(self) -> _DeadDatabase:
        return self

    def __exit__(self, *_: object) -> None:
        pass

    def get_bind(self) -> Any:
        raise OperationalError("connect", {}, Exception("connection refused"))


def test_a_database_outage_fails_readiness_not_liveness(app: FastAPI) -> None:
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/livez").json() == {"status": "ok"}
        sessions, app.state.sessions = app.state.sessions, _DeadDatabase
        try:
            down = client.get("/healthz")
            assert down.status_code == 503 and "OperationalError" in down.text
            assert "connection refused" not in down.text  # the driver's words stay in the log
            assert client.get("/livez").status_code == 200
        finally:
            app.state.sessions = sessions
