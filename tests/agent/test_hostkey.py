"""The agent's host key file: made once, atomically, mode 0600; never replaced behind the
operator's back; read only from a regular file that only the agent may read."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from stortune.agent import hostkey
from stortune.agent.hostkey import HostKeyError


# -- hostile first ----------------------------------------------------------------------------------
def test_a_symlink_in_place_of_the_key_is_refused_not_followed(tmp_path: Path) -> None:
    """Hostile: host.key -> a file elsewhere (another host's key, or /etc/shadow)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("A" * 43 + "\n")
    elsewhere.chmod(0o600)
    state = tmp_path / "state"
    state.mkdir()
    hostkey.path_in(state).symlink_to(elsewhere)
    with pytest.raises(HostKeyError, match="symbolic link"):
        hostkey.load_or_create(state)
    assert elsewhere.read_text() == "A" * 43 + "\n"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_key_others_may_read_is_refused(tmp_path: Path, mode: int) -> None:
    """Hostile: a key file restored from a backup with loose permissions: it may have leaked."""
    key = hostkey.load_or_create(tmp_path)
    hostkey.path_in(tmp_path).chmod(mode)
    with pytest.raises(HostKeyError, match=f"mode 0600, now {mode:04o}"):
        hostkey.load_or_create(tmp_path)
    assert hostkey.path_in(tmp_path).read_text().strip() == key  # left alone


@pytest.mark.parametrize("content", ["", "short", "A" * 44, "A" * 42 + "!", "\x00" * 43])
def test_a_file_without_a_key_is_refused_and_kept(tmp_path: Path, content: str) -> None:
    """Hostile: a damaged key file is not silently replaced (a new key would lock the host out)."""
    path = hostkey.path_in(tmp_path)
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(HostKeyError, match="does not hold a host key"):
        hostkey.load_or_create(tmp_path)
    assert path.read_text() == content


def test_a_directory_or_fifo_in_place_of_the_key_is_refused(tmp_path: Path) -> None:
    hostkey.path_in(tmp_path).mkdir(mode=0o700)
    with pytest.raises(HostKeyError, match="not a regular file"):
        hostkey.load_or_create(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    os.mkfifo(hostkey.path_in(other), 0o600)
    with pytest.raises(HostKeyError, match="not a regular file"):  # and does not block on open
        hostkey.load_or_create(other)


# -- what it is for --------------------------------------------------------------------------------
def test_the_first_use_makes_a_private_key_and_later_uses_read_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    key = hostkey.load_or_create(state)
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", key)
    path = hostkey.path_in(state)
    assert path.stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700
    assert hostkey.load_or_create(state) == key
    assert sorted(p.name for p in state.iterdir()) == ["host.key"]  # no temporary file left
    assert hostkey.load_or_create(tmp_path / "another") != key


def test_agents_starting_at_once_end_up_with_one_key(tmp_path: Path) -> None:
    start = threading.Barrier(8)
    keys: list[str] = []

    def load() -> None:
        start.wait()
        keys.append(hostkey.load_or_create(tmp_path))

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(keys) == 8 and len(set(keys)) == 1
    assert hostkey.path_in(tmp_path).read_text().strip() == keys[0]
    assert [p.name for p in tmp_path.iterdir()] == ["host.key"]
