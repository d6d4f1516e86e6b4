"""The server's files are its user's alone: the SQLite database holds the redaction map, the
audit log and token digests, the state directory the first tokens.

Made private by the server itself, whatever the umask and whoever started it (``./dev up``,
a unit file, a container), not by the script that happens to start it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger(__name__)

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def make_private_dir(path: Path) -> None:
    """Create ``path`` and any missing parents 0700; an existing directory is left as it is (an
    administrator may have shared it with a group on purpose)."""
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR)
        except FileExistsError:  # another process made it meanwhile
            continue
        directory.chmod(PRIVATE_DIR)  # mkdir's mode passes through the umask, which only removes bits


def make_private_file(path: Path) -> None:
    """Create ``path`` empty and 0600 if it is missing; take group and other access away from an
    existing one, saying so (a database made before this, by ``./dev up``, was 0644)."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE))
    restrict(path)


def restrict(path: Path) -> None:
    """Take group and other access away from ``path`` if it exists (and is not a link)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) & 0o077:
        log.warning("%s was readable by other users (mode %o): now %o", path, stat.S_IMODE(info.st_mode),
                    stat.S_IMODE(info.st_mode) & PRIVATE_DIR)
        path.chmod(stat.S_IMODE(info.st_mode) & PRIVATE_DIR)
