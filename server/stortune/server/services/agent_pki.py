"""The control plane's CA for agent certificates: signing CSRs, and the client side of the channel.

The CA and the control plane's client certificate live in ``Settings.agent_pki``
(``stortune-server certs init``; created on the first start when absent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from stortune.api.agent import tls
from stortune.api.agent.tls import CertificateAuthority, TLSError, TLSFiles
from stortune.server.db.tables import AgentIdentity
from stortune.server.services.versions import next_resource_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PkiRefusal(Exception):
    """A certificate that will not be issued; ``field`` names the request field at fault, if one."""

    message: str
    field: str | None = None


@dataclass(frozen=True)
class AgentPki:
    ca: CertificateAuthority
    #: The control plane's own key, certificate and the CA, to dial agents with.
    client: TLSFiles

    @classmethod
    def load(cls, directory: Path) -> AgentPki:
        ca, client = tls.load_pki(directory)
        return cls(ca, client)

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem

    def issue(self, session: Session, name: str, csr: bytes, now: datetime) -> tuple[bytes, datetime]:
        """(certificate PEM, its expiry) for ``name`` on the CSR's key.

        The first key to obtain a certificate for a name keeps it (renewals with the
        same key are fine): the bootstrap token is shared by the fleet, and without
        this any holder could take over another host's name. Commits.
        """
        try:
            cert = self.ca.sign_agent(csr, name, now=now)
        except TLSError as exc:
            raise PkiRefusal(str(exc), "csr") from None
        fingerprint = tls.key_fingerprint(cert)
        # The write lock first (db/engine.py): on SQLite a transaction that reads and only
        # then writes fails at once when another enrollment committed in between.
        next_resource_version(session)
        pinned = session.get(AgentIdentity, name, with_for_update=True)
        if pinned is not None and pinned.key_sha256 != fingerprint:
            raise PkiRefusal(f"{name!r} already belongs to another agent's key (first certified "
                             f"{pinned.first_issued_at:%Y-%m-%d %H:%M} UTC); if that machine is gone, "
                             f"an admin deletes the host (DELETE /api/v1/hosts/{name}) to let a new "
                             "one enroll")
        expires = tls.expires(cert)
        if pinned is None:
            session.add(AgentIdentity(name=name, key_sha256=fingerprint, first_issued_at=now,
                                      last_issued_at=now, expires_at=expires))
        else:
            pinned.last_issued_at, pinned.expires_at = now, expires
        try:
            session.commit()
        except IntegrityError:  # another server certified the name at the same moment
            session.rollback()
            raise PkiRefusal(f"{name!r} was just certified for another request; try again") from None
        log.info("issued a certificate for agent %r (key %s...)", name, fingerprint[:12])
        return cert, expires


def ensure_pki(directory: Path) -> bool:
    """Create the CA and the client certificate in ``directory`` unless a CA is there; True if made."""
    if (directory / tls.CA_KEY).exists():
        return False
    tls.init_pki(directory)
    return True
