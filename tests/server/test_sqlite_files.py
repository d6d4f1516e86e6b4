"""The SQLite database holds the redaction map, the audit log and token digests: readable by
the server's user alone, whatever the umask, and however it was started (not only ./dev up).

It used to be 0644 in a 0755 directory: any local user could read it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from stortune.server import RecordingController, Settings, create_app
from stortune.server.cli import main
from tests.server.support import admin_client


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The umask of a careless shell: what the server creates is readable by all unless it says not."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_hostile_a_new_database_and_its_directory_are_the_servers_alone(tmp_path: Path,
                                                                        open_umask: None) -> None:
    state = tmp_path / "state" / "server"
    app = create_app(Settings(db_url=f"sqlite:///{state / 'stortune.db'}"), controller=RecordingController())
    try:
        with admin_client(app) as client:  # writes: the WAL and its index are made now
            assert client.post("/api/v1/tokens", json={"role": "viewer", "name": "v"}).status_code == 201
            files = sorted(p.name for p in state.iterdir())
            assert {"stortune.db", "stortune.db-wal", "stortune.db-shm"} <= set(files)
            assert {name: mode(state / name) for name in files} == dict.fromkeys(files, 0o600)
    finally:
        app.state.engine.dispose()
    assert mode(state) == 0o700 and mode(state.parent) == 0o700


def test_hostile_a_database_left_readable_by_all_is_closed_at_start(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "stortune.db"
    path.touch(mode=0o644)
    path.chmod(0o644)  # as ./dev up made it
    tmp_path.chmod(0o750)  # a directory it did not make is left as it is: shared with a group on purpose
    app = create_app(Settings(db_url=f"sqlite:///{path}"), controller=RecordingController())
    app.state.engine.dispose()
    assert mode(path) == 0o600 and mode(tmp_path) == 0o750


def test_hostile_the_state_directory_the_cli_makes_is_closed(tmp_path: Path, open_umask: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "var" / "lib" / "stortune-server"
    assert main(["token", "list", "--state-dir", str(state)]) == 0
    assert mode(state) == 0o700 and mode(state / "stortune.db") == 0o600


def test_an_in_memory_database_touches_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = create_app(Settings(db_url="sqlite://"), controller=RecordingController())
    app.state.engine.dispose()
    assert list(tmp_path.iterdir()) == []
