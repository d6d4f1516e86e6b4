"""The first tokens: a fresh control plane must be usable without a token to make tokens.

When ``stortune-server`` starts and the database holds no active admin token,
it makes one and writes it to ``<state-dir>/admin.token``; likewise an agent
token (for ``stortune-agent serve --token-file``) in
``<state-dir>/agent-bootstrap.token``. Both files are mode 0600 and the log
names only their paths. Once such a token exists nothing is written again:
delete the file after copying the secret somewhere safe. Revoking every admin
token and restarting makes a new admin.token, which is how a locked-out
operator with access to the state directory gets back in.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from stortune.server.auth import Role
from stortune.server.models.tokens import TokenCreate
from stortune.server.services import tokens
from stortune.server.statedir import make_private_dir

log = logging.getLogger(__name__)

FILES = {Role.ADMIN: "admin.token", Role.AGENT: "agent-bootstrap.token"}
_DESCRIPTIONS = {
    Role.ADMIN: "made at first start because no admin token existed",
    Role.AGENT: "made at first start: the token agents register with (--token-file)",
}


def write_secret(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path`` readable by its owner only, replacing any older file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode on O_CREAT
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)


def ensure_first_tokens(sessions: sessionmaker[Session], state_dir: Path, now: datetime) -> list[Path]:
    """Make the admin and agent tokens that do not exist yet; returns the files written."""
    written = []
    for role, filename in FILES.items():
        with sessions() as session:
            if tokens.has_active(session, role, now):
                continue
            request = TokenCreate(role=role, name=f"{role.value}-bootstrap", description=_DESCRIPTIONS[role])
            row, secret = tokens.issue(session, request, created_by="stortune-server (first start)",
                                       now=now, commit=False)
            path = state_dir / filename
            # The file first: a token committed without it would be one nobody can use.
            make_private_dir(state_dir)
            write_secret(path, secret)
            session.commit()
        log.warning("no active %s token existed: made token %s and wrote its secret to %s (mode 0600)",
                    role.value, row.id, path)
        written.append(path)
    return written
