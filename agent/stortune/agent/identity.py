"""The agent's certificate: where it lives, and getting one from the control plane.

The key is made here and never leaves the host; the control plane signs a CSR
for the name the agent registers under, in exchange for the bootstrap token::

    POST {server}/api/v1/agents/certificate  {name, csr}  -> {certificate, ca}

Files given on the command line (``--tls-cert/--tls-key/--tls-ca``, e.g. from
the site's own PKI) are used as they are and never replaced. Without them the
agent keeps its own under ``STATE_DIR/tls`` and asks for a new certificate at
start when it has none, when it no longer fits its key or name, and a month
before it expires (``tlsfiles.RENEW_BEFORE``).

No grpc here; the serving side is ``mtls``. cryptography (``tls``) is imported
only to make a key and a CSR: an agent whose certificate is good does without.
"""

from __future__ import annotations

import logging
import random
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from stortune.agent.registration import RequestFailed, backoff_delay, call_json
from stortune.api.agent.tlsfiles import TLSError, TLSFiles

log = logging.getLogger("stortune.agent.identity")


class EnrollmentError(RuntimeError):
    """No certificate could be obtained; the message says why and what to do."""


def own_files(state_dir: Path) -> TLSFiles:
    return TLSFiles.in_dir(state_dir / "tls", "agent")


@dataclass(frozen=True)
class Enrollment:
    server: str
    name: str
    token: str | None = field(default=None, repr=False)
    version: str = "0+unknown"
    timeout: float = 10.0
    backoff_base: float = 1.0
    backoff_cap: float = 30.0


def usable(files: TLSFiles, name: str) -> str | None:
    """Why the files cannot serve as this agent's identity now, or None when they can."""
    try:
        identity = files.server_identity(name)
    except TLSError as exc:
        return str(exc)
    if identity.needs_renewal():
        return f"the certificate expires {identity.not_after:%Y-%m-%d}"
    return None


def request_certificate(enrollment: Enrollment, key_pem: bytes) -> tuple[bytes, bytes]:
    """One CSR round trip: (certificate, CA) PEM. RequestFailed when the server says no."""
    from stortune.api.agent import tls
    if not enrollment.server.startswith(("http://", "https://")):
        raise EnrollmentError(f"server URL {enrollment.server!r} must start with http:// or https://")
    _, data = call_json(urllib.request.build_opener(), enrollment.server.rstrip("/"), "POST",
                        "/api/v1/agents/certificate",
                        {"name": enrollment.name, "csr": tls.make_csr(key_pem, enrollment.name).decode()},
                        what="certificate request", token=enrollment.token,
                        timeout=enrollment.timeout, version=enrollment.version)
    cert, ca = data.get("certificate"), data.get("ca")
    if not isinstance(cert, str) or not isinstance(ca, str):
        raise RequestFailed("certificate request: the answer has no certificate and CA")
    cert_pem, ca_pem = cert.encode(), ca.encode()
    if not tls.matches_key(cert_pem, key_pem) or not tls.issued_by(cert_pem, ca_pem):
        raise RequestFailed("certificate request: the certificate does not fit the key or the CA")
    return cert_pem, ca_pem


def enroll(files: TLSFiles, enrollment: Enrollment, stop: threading.Event) -> None:
    """Make sure ``files`` hold a usable certificate for ``enrollment.name``, asking the
    control plane (with backoff) until it signs one. EnrollmentError if ``stop`` is set first
    or the server refuses for good (401/403: a wrong token; 409: the name belongs to another key)."""
    why = usable(files, enrollment.name)
    if why is None:
        return
    from stortune.api.agent import tls  # cryptography: only now that a key and a CSR are needed

    try:
        key = files.key.read_bytes()
        tls.make_csr(key, enrollment.name)
    except (OSError, TLSError):
        key = tls.new_key()
        tls.write_private(files.key, key)
    log.info("asking %s for a certificate as %r: %s", enrollment.server, enrollment.name, why)
    attempt = 0
    while True:
        try:
            cert, ca = request_certificate(enrollment, key)
        except RequestFailed as exc:
            if exc.status in (401, 403, 409, 422):
                raise EnrollmentError(f"the control plane refused a certificate: {exc}") from None
            attempt += 1
            delay = backoff_delay(attempt, enrollment.backoff_base, enrollment.backoff_cap, random.uniform)
            log.warning("%s; trying again in %.1fs", exc, delay)
            if stop.wait(delay):
                raise EnrollmentError("stopped before a certificate was obtained") from None
            continue
        files.write(key, cert, ca)
        log.info("certificate for %r obtained, valid until %s", enrollment.name,
                 f"{tls.expires(cert):%Y-%m-%d}")
        return
