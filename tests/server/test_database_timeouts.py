"""A database that hangs makes the control plane answer 503, within its timeouts, not hang.

A replica whose database stopped answering kept /healthz and every API call waiting for over
40 s: Kubernetes could not take it out of the Service, and clients piled up. Here another
session holds an ACCESS EXCLUSIVE lock on the tables every call needs, so every statement on
them waits: readiness says 503 within its own timeout, API calls 503 with Retry-After once
the statement timeout cancels them, liveness stays 200 (a restart would not help), and all
is well again when the lock goes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from stortune.server.cli import main
from stortune.server.db.engine import connect_args
from tests.server.builders import API, profile_doc
from tests.server.support import AppFactory, admin_client

#: Long enough that a call that waits on the lock rather than timing out is plainly wrong:
#: the lock is let go then, so code without timeouts fails its assertions instead of hanging.
RELEASE_S = 45


class TableLock:
    """Another session's ACCESS EXCLUSIVE locks, held until ``release()`` (or RELEASE_S)."""

    def __init__(self, db_url: str) -> None:
        conninfo = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.conn = psycopg.connect(conninfo)
        self._guard = threading.Lock()
        self._timer = threading.Timer(RELEASE_S, self.release)
        self._timer.daemon = True

    def lock(self, *tables: str) -> None:
        with self._guard:
            self.conn.execute(f"LOCK TABLE {', '.join(tables)} IN ACCESS EXCLUSIVE MODE")
        self._timer.start()

    def release(self) -> None:
        with self._guard:
            if not self.conn.closed:
                self.conn.rollback()

    def close(self) -> None:
        self._timer.cancel()
        self.release()
        with self._guard:
            self.conn.close()


@pytest.fixture
def table_lock(db_url: str) -> Iterator[TableLock]:
    lock = TableLock(db_url)
    try:
        yield lock
    finally:
        lock.close()


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_hostile_a_hung_database_gives_503_from_readiness_and_the_api(
        make_app: AppFactory, table_lock: TableLock) -> None:
    app = make_app(db_statement_timeout_s=1, readiness_timeout_s=0.5)
    with admin_client(app) as client:
        assert client.get("/healthz").status_code == 200
        assert client.post(f"{API}/profiles", json=profile_doc()).status_code == 201  # token cached now
        table_lock.lock("counters", "profiles", "audit_log")

        ready = client.get("/healthz")
        assert ready.status_code == 503, ready.text
        assert "readiness_timeout_s" in ready.json()["message"]
        assert client.get("/livez").status_code == 200
        for answer in (client.post(f"{API}/profiles", json=profile_doc("other")),
                       client.get(f"{API}/profiles/streaming"), client.get(f"{API}/profiles")):
            assert answer.status_code == 503, answer.text
            assert answer.json()["reason"] == "ServiceUnavailable" and "database" in answer.json()["message"]
            assert int(answer.headers["retry-after"]) > 0

        table_lock.release()
        assert client.get("/healthz").status_code == 200
        assert client.post(f"{API}/profiles", json=profile_doc("other")).status_code == 201


def test_postgresql_connections_carry_their_timeouts_and_keep_the_urls_options() -> None:
    args = connect_args("postgresql+psycopg://u@db/x?options=-c%20search_path%3Dst",
                        statement_timeout_s=2.5, connect_timeout_s=4)
    assert args["connect_timeout"] == 4
    # The URL's own options come last, so a statement_timeout there wins over the setting.
    assert args["options"] == "-c statement_timeout=2500 -c search_path=st"
    assert connect_args("sqlite:///x.db", statement_timeout_s=3, connect_timeout_s=4) == {"timeout": 3}


@pytest.mark.parametrize(("flag", "field"), [("--db-statement-timeout", "db_statement_timeout_s"),
                                             ("--db-connect-timeout", "db_connect_timeout_s"),
                                             ("--readiness-timeout", "readiness_timeout_s")])
def test_hostile_a_timeout_of_0_is_refused_at_start_naming_it(
        flag: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """0 would cancel every statement (PostgreSQL reads 0 as 'no timeout' instead: the hang again)."""
    assert main([flag, "0", "--insecure", "--state-dir", str(tmp_path)]) == 1
    assert field in capsys.readouterr().err
