"""Test helpers that are not fixtures: the test client, a settable clock."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fastapi import FastAPI

from stortune.server.auth import Role
from stortune.server.models.tokens import TokenCreate
from stortune.server.services import tokens

with warnings.catch_warnings():
    # starlette asks for httpx2, which is not a dependency here; httpx works.
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

__all__ = ["AppFactory", "FakeClock", "TestClient", "admin_client", "bearer", "issue_token"]

AppFactory = Callable[..., FastAPI]


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def issue_token(app: FastAPI, role: Role | str = Role.ADMIN, *, hosts: str | None = None,
                expires_in: str | None = None, name: str | None = None) -> str:
    """A new token of ``role`` on the app's database (as `stortune-server token create` makes one);
    returns its secret."""
    request = TokenCreate(role=Role(role), name=name, hostSelector=hosts, expiresIn=expires_in)
    with app.state.sessions() as session:
        _, secret = tokens.issue(session, request, created_by="tests", now=app.state.clock())
    return secret


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def admin_client(app: FastAPI) -> TestClient:
    """A TestClient sending a fresh admin token with every request; use it as a context manager."""
    return TestClient(app, headers=bearer(issue_token(app, Role.ADMIN, name="test-admin")))
