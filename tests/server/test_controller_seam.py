"""Reconcile requests reach the controller after commit, and never from a rolled-back write."""

from __future__ import annotations

from typing import Any

import pytest

from stortune.server import Controller, RecordingController
from stortune.server.controller import request_reconcile
from stortune.server.db.engine import make_engine, make_sessions
from stortune.server.db.migrate import upgrade
from tests.server.builders import API, registration
from tests.server.support import AppFactory, admin_client


class Probe:
    """Records what the database shows at the moment of each enqueue."""

    def __init__(self) -> None:
        self.sessions: Any = None
        self.seen: list[tuple[str, bool]] = []

    def enqueue(self, host: str, reason: str) -> None:
        from stortune.server.db.tables import Host

        with self.sessions() as session:
            self.seen.append((host, session.get(Host, host) is not None))


def test_enqueue_happens_after_commit(make_app: AppFactory) -> None:
    probe = Probe()
    assert isinstance(probe, Controller)
    app = make_app(controller=probe)
    probe.sessions = app.state.sessions
    with admin_client(app) as client:
        client.post(f"{API}/agents/register", json=registration("h1"))
    assert probe.seen == [("h1", True)]  # the reconciler can already read the new host


def test_rollback_discards_requests(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        sessions = make_sessions(engine)
        recorder = RecordingController()
        from stortune.server.controller import bind

        bind(sessions, recorder)
        with sessions() as session:
            request_reconcile(session, ["a", "b", "a"], "first")
            request_reconcile(session, ["a"], "second")
            session.commit()
        assert list(recorder.requests) == [("a", "first"), ("b", "first")]  # one entry per host
        recorder.clear()
        with sessions() as session:
            request_reconcile(session, ["c"], "lost")
            session.rollback()
            session.commit()
        assert not recorder.requests
    finally:
        engine.dispose()


def test_recording_controller_is_bounded() -> None:
    recorder = RecordingController(limit=2)
    for host in "abc":
        recorder.enqueue(host, "x")
    assert recorder.hosts() == {"b", "c"}


@pytest.mark.parametrize("value", ["127.0.0.1:8080", "[::1]:9", "host.example:65535"])
def test_settings_listen(value: str) -> None:
    from stortune.server import Settings

    assert Settings(db_url="sqlite://", listen=value).host_port[1] > 0


@pytest.mark.parametrize("value", ["8080", "host:", "host:0", "host:99999", ":80"])
def test_settings_reject_bad_listen(value: str) -> None:
    from pydantic import ValidationError

    from stortune.server import Settings

    with pytest.raises(ValidationError, match="HOST:PORT"):
        Settings(db_url="sqlite://", listen=value)
