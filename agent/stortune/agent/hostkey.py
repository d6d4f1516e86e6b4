"""This host's own key: what proves to the control plane that a call comes from the agent that
enrolled the host's name.

The fleet shares one bootstrap token, so the token alone cannot tell one host's
agent from another's. At its first start the agent makes a secret of its own
(256 random bits) in ``STATE_DIR/host.key`` and sends it with every call to the
control plane (header ``X-Stortune-Host-Key``); the control plane pins its
SHA-256 when the name enrolls and refuses calls for that name without it
(server: services/host_keys.py). A restarted agent reads the same file, so it
keeps its name; a machine reinstalled without its state directory has a new
key and needs an admin to delete the old host first.

Standard library only (the serving agent's memory budget): ``secrets`` makes the
key, and the file is created atomically with mode 0600 from its first byte.
It is read without following a symbolic link, and refused when others may read
it. The key is never logged.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

FILE_NAME = "host.key"
_KEY = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)


class HostKeyError(RuntimeError):
    """The key file exists but cannot serve; the message says why and what to do."""


def path_in(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def load_or_create(state_dir: Path) -> str:
    """The host key kept in ``state_dir``, made there first if there is none."""
    path = path_in(state_dir)
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    _create(path, secrets.token_urlsafe(32))
    return _read(path)  # ours, or the one another process made first


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise HostKeyError(f"{path} is a symbolic link; the host key is read from a regular file "
                               "only") from None
        raise  # FileNotFoundError: none yet
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HostKeyError(f"{path} is not a regular file")
        if info.st_mode & 0o077 or info.st_uid != os.geteuid():
            raise HostKeyError(f"{path} must belong to this agent's user and be readable by it only "
                               f"(mode 0600, now {stat.S_IMODE(info.st_mode):04o}): fix its owner and mode, "
                               "or, if others may have read it, delete it and have an admin delete "
                               "the host so that this agent enrolls again with a new key")
        text = os.read(fd, 256).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not _KEY.fullmatch(text):
        raise HostKeyError(f"{path} does not hold a host key: restore it from a backup of the state "
                           "directory; or delete it, and an admin deletes the host so that this agent "
                           "enrolls again with a new key")
    return text


def _create(path: Path, key: str) -> None:
    """Write ``key`` to ``path`` unless a file is there already (then keep that one)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
    try:
        try:
            os.write(fd, f"{key}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):  # made by another process meanwhile: theirs wins
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
