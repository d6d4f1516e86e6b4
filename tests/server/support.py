"""Test helpers that are not fixtures: the test client, a settable clock."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fastapi import FastAPI

with warnings.catch_warnings():
    # starlette asks for httpx2, which is not a dependency here; httpx works.
    warnings.filterwarnings("ignore", message=".*install `httpx2`")
    from fastapi.testclient import TestClient

__all__ = ["AppFactory", "FakeClock", "TestClient"]

AppFactory = Callable[..., FastAPI]


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now
