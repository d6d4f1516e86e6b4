"""A state directory that takes no write (full, over quota, read-only): a clear error naming it.

The journal's writes are the seam: an OSError(ENOSPC) injected at the Nth record, and
a real tmpfs filled to the last byte (root only). The device keeps its value either way.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from stortune.agent import cli, journal
from tests.fixtures.agent_host import Host

PROFILE = """apiVersion: stortune/v1
kind: StorageProfile
metadata: {name: full}
spec: {rules: [{name: r, match: {name: [loop7]}, settings: {read_ahead_kb: 256, nr_requests: 32}}]}
"""


def apply(host: Host, tmp_path: Path, state: Path) -> int:
    (tmp_path / "p.yaml").write_text(PROFILE)
    return cli.main(["apply", "-f", str(tmp_path / "p.yaml"), "--sysfs", str(host.fs.sysfs),
                     "--procfs", str(host.fs.procfs), "--state-dir", str(state)])


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_hostile_the_disk_fills_in_the_middle_of_an_apply(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        code: int) -> None:
    before = host.queue("read_ahead_kb"), host.queue("nr_requests")
    real_write = os.write
    failed: list[bytes] = []

    def filling(fd: int, data: bytes) -> int:  # the journal's first "done" record: the value is written
        journal_file = "/journal/" in os.readlink(f"/proc/self/fd/{fd}")
        if data.startswith(b'{"type":"done"') and not failed and journal_file:
            failed.append(data)
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", filling)
    state = tmp_path / "state"
    assert apply(host, tmp_path, state) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"the agent's state directory {state}/journal" in err
    assert os.strerror(code) in err and "--state-dir" in err
    assert failed and (host.queue("read_ahead_kb"), host.queue("nr_requests")) == before  # put back


def test_a_state_directory_that_takes_no_lock_file_is_named(
        host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def full_open(path: str | os.PathLike[str], flags: int, *args: int, **kw: object) -> int:
        if str(path).endswith("/lock") and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", full_open)
    assert apply(host, tmp_path, tmp_path / "state") == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot write {tmp_path}/state/lock: No space left on device")
    assert host.queue("read_ahead_kb") == "128"


def test_an_oserror_of_the_callers_own_inside_the_lock_is_not_taken_for_a_full_disk(tmp_path: Path) -> None:
    with pytest.raises(OSError) as raised, journal.lock(tmp_path / "state"):
        raise OSError(errno.ENOSPC, "the caller's own")
    assert not isinstance(raised.value, journal.StateError)


@contextlib.contextmanager
def full_tmpfs(where: Path) -> Iterator[Path]:
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        (where / "state").mkdir()
        with open(where / "filler", "wb") as fh, contextlib.suppress(OSError):
            fh.write(b"x" * (1 << 20))
        yield where / "state"
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.mark.root
def test_hostile_a_real_full_filesystem(host: Host, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with full_tmpfs(tmp_path / "full") as state:
        assert apply(host, tmp_path, state) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"the agent's state directory {state}" in err
    assert "No space left on device" in err
    assert host.queue("read_ahead_kb") == "128"
