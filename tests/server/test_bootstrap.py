"""The first tokens: written at first start, made on the database by `stortune-server token`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI

from stortune.server.bootstrap import ensure_first_tokens
from stortune.server.cli import main
from tests.server.builders import API, keyed, registration
from tests.server.support import FakeClock, TestClient, admin_client, bearer


def test_the_first_start_writes_an_admin_and_an_agent_token(
    app: FastAPI, tmp_path: Path, clock: FakeClock,
) -> None:
    written = ensure_first_tokens(app.state.sessions, tmp_path, clock())
    assert [p.name for p in written] == ["admin.token", "agent-bootstrap.token"]
    admin, agent = (p.read_text().strip() for p in written)
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in written)
    with TestClient(app) as client:
        assert client.get(f"{API}/tokens", headers=bearer(admin)).status_code == 200
        registered = client.post(f"{API}/agents/register", json=registration(),
                                 headers={**bearer(agent), **keyed()})
        assert registered.status_code == 200
        assert client.get(f"{API}/hosts", headers=bearer(agent)).status_code == 403

    assert ensure_first_tokens(app.state.sessions, tmp_path, clock()) == []  # once they exist: nothing
    assert written[0].read_text().strip() == admin

    # Every admin token revoked: the next start lets whoever holds the state directory back in.
    with admin_client(app) as client:
        admins = [t for t in client.get(f"{API}/tokens").json()["items"] if t["role"] == "admin"]
        for token in sorted(admins, key=lambda t: t["name"] == "test-admin"):  # its own token last
            assert client.delete(f"{API}/tokens/{token['id']}").status_code == 200
    assert [p.name for p in ensure_first_tokens(app.state.sessions, tmp_path, clock())] == ["admin.token"]
    assert written[0].read_text().strip() != admin


def test_a_state_dir_that_cannot_hold_the_file_leaves_no_unusable_token(
    app: FastAPI, tmp_path: Path, clock: FakeClock,
) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OSError):
        ensure_first_tokens(app.state.sessions, tmp_path / "a-file" / "state", clock())
    assert [p.name for p in ensure_first_tokens(app.state.sessions, tmp_path, clock())] == [
        "admin.token", "agent-bootstrap.token"]


def test_token_commands_work_on_the_database(
    db_url: str, app: FastAPI, capsys: pytest.CaptureFixture[str], clock: FakeClock,
) -> None:
    assert main(["token", "create", "--role", "operator", "--name", "ci", "--db", db_url]) == 0
    out, err = capsys.readouterr()
    secret = out.strip()
    assert secret.startswith("stt_") and "\n" not in secret  # stdout holds the secret alone
    token_id = err.split()[1]
    assert "role operator" in err and secret not in err
    with TestClient(app) as client:
        assert client.post(f"{API}/profiles", json={}, headers=bearer(secret)).status_code == 422

    assert main(["--db", db_url, "token", "create", "--role", "support", "--hosts", "role=streamer",
                 "--expires", "72h"]) == 0
    capsys.readouterr()
    assert main(["token", "list", "--db", db_url]) == 0
    listing = capsys.readouterr().out
    assert token_id in listing and "role=streamer" in listing and secret not in listing

    assert main(["token", "revoke", token_id, "--db", db_url]) == 0
    assert "revoked" in capsys.readouterr().err
    with TestClient(app) as client:
        # Revoked behind the server's back: it trusts what it read for token_cache_s, no longer.
        assert client.get(f"{API}/profiles", headers=bearer(secret)).status_code == 200
        clock.advance(app.state.settings.token_cache_s)
        assert client.get(f"{API}/profiles", headers=bearer(secret)).status_code == 401
    assert main(["token", "revoke", "000000000000", "--db", db_url]) == 1
    assert 'ApiToken "000000000000" not found' in capsys.readouterr().err


def test_token_create_refuses_what_the_api_refuses(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "create", "--role", "support", "--db", db_url]) == 1
    err = capsys.readouterr().err
    assert "hostSelector: a support token must name the hosts" in err
    assert "expiresIn: a support token must expire" in err


def test_the_server_says_when_it_cannot_write_the_first_tokens(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "a-file").write_text("")
    state = str(tmp_path / "a-file" / "state")
    # Without --insecure the agents' CA comes first, and says so.
    assert main(["--db", db_url, "--state-dir", state, "--listen", "127.0.0.1:1"]) == 1
    assert "cannot create the agents' CA in" in capsys.readouterr().err
    assert main(["--db", db_url, "--state-dir", state, "--listen", "127.0.0.1:1", "--insecure"]) == 1
    assert "cannot write the first tokens into" in capsys.readouterr().err


def test_the_database_url_may_come_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """$STORTUNE_DB stands for --db (a Kubernetes Secret fills it; deploy/kubernetes); --db wins."""
    from_env, given = tmp_path / "from-env.db", tmp_path / "given.db"
    monkeypatch.setenv("STORTUNE_DB", f"sqlite:///{from_env}")
    state = tmp_path / "state"
    assert main(["token", "create", "--role", "operator", "--state-dir", str(state)]) == 0
    assert from_env.exists() and not (state / "stortune.db").exists()
    assert main(["token", "list", "--db", f"sqlite:///{given}"]) == 0
    assert given.exists()

    monkeypatch.setenv("STORTUNE_DB", "  ")  # blank: the default, as if unset
    assert main(["token", "list", "--state-dir", str(state)]) == 0
    assert (state / "stortune.db").exists()
