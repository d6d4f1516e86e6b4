"""The agent's certificate: where it lives, and getting one from the control plane.

The key is made here and never leaves the host; the control plane signs a CSR
for the name the agent registers under, in exchange for the bootstrap token::

    POST {server}/api/v1/agents/certificate  {name, csr}  -> {certificate, ca}

Files given on the command line (``--tls-cert/--tls-key/--tls-ca``, e.g. from
the site's own PKI) are used as they are and never replaced. Without them the
agent keeps its own under ``STATE_DIR/tls`` and asks for a new certificate at
start when it has none, when it no longer fits its key or name, and a month
before it expires (``tlsfiles.RENEW_BEFORE``).

No grpc here; the serving side is ``mtls``. The key and the CSR are made by a
short-lived child process (``python -m stortune.agent.csr``), the one place the
agent uses cryptography (``tls``): its libraries would otherwise stay resident,
about 12 MiB, for the agent's whole life after one enrollment. The certificate
that comes back is checked with the standard library before it replaces
anything (``usable``), also in a child (``python -m stortune.agent.tlscheck``),
so that the OpenSSL state of the check does not stay either.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import random
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path

from stortune.agent.registration import RequestFailed, backoff_delay, call_json
from stortune.api.agent.tlsfiles import Identity, TLSError, TLSFiles, write_private

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
    #: This host's key (``hostkey``): the control plane asks for it once the name is enrolled.
    host_key: str | None = field(default=None, repr=False)
    version: str = "0+unknown"
    timeout: float = 10.0
    backoff_base: float = 1.0
    backoff_cap: float = 30.0


def _checked(files: TLSFiles, name: str) -> Identity:
    """The identity ``files`` make for ``name``; TLSError when a peer would refuse it, or when
    it is due for renewal."""
    found = identity_of(files, name)
    if found.needs_renewal():
        raise TLSError(f"the certificate expires {found.not_after:%Y-%m-%d}")
    return found


def usable(files: TLSFiles, name: str) -> str | None:
    """Why the files cannot serve as this agent's identity now, or None when they can."""
    try:
        _checked(files, name)
    except TLSError as exc:
        return str(exc)
    return None


class _ChildFailed(Exception):
    pass


def _child(module: str, *args: str, timeout: float) -> bytes:
    """What ``python -m module args`` printed; _ChildFailed with the last line of its stderr."""
    try:
        done = subprocess.run([sys.executable, "-m", module, *args],
                              capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _ChildFailed(str(exc)) from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise _ChildFailed(why[-1] if why else f"exit code {done.returncode}")
    return done.stdout


def make_csr(key: Path, name: str, timeout: float = 60.0) -> bytes:
    """A CSR for ``name`` signed by the key in ``key`` (made there first if it is missing or
    unusable), from a child process: see the module's docstring."""
    try:
        return _child("stortune.agent.csr", str(key), name, timeout=timeout)
    except _ChildFailed as exc:
        raise EnrollmentError(f"cannot make a key and a CSR in {key.parent}: {exc}") from None


def _tlscheck(files: TLSFiles, *name: str, timeout: float) -> bytes:
    try:
        return _child("stortune.agent.tlscheck", str(files.key), str(files.cert), str(files.ca), *name,
                      timeout=timeout)
    except _ChildFailed as exc:
        raise TLSError(str(exc)) from None


def check_pair(files: TLSFiles, timeout: float = 60.0) -> None:
    """TLSError (naming the file and why) unless the files can be read and the key is the
    certificate's: ``TLSFiles.read`` in a child process (``stortune.agent.tlscheck``)."""
    _tlscheck(files, timeout=timeout)


def identity_of(files: TLSFiles, name: str, timeout: float = 60.0) -> Identity:
    """What the certificate vouches for to a peer dialling ``name``: ``TLSFiles.server_identity``
    in a child process (``stortune.agent.tlscheck``); TLSError when a peer would refuse it."""
    found = json.loads(_tlscheck(files, name, timeout=timeout))
    return Identity(frozenset(found["names"]), dt.datetime.fromisoformat(found["notAfter"]))


def request_certificate(enrollment: Enrollment, csr_pem: bytes) -> tuple[bytes, bytes]:
    """One CSR round trip: (certificate, CA) PEM. RequestFailed when the server says no."""
    if not enrollment.server.startswith(("http://", "https://")):
        raise EnrollmentError(f"server URL {enrollment.server!r} must start with http:// or https://")
    _, data = call_json(urllib.request.build_opener(), enrollment.server.rstrip("/"), "POST",
                        "/api/v1/agents/certificate", {"name": enrollment.name, "csr": csr_pem.decode()},
                        what="certificate request", token=enrollment.token,
                        timeout=enrollment.timeout, version=enrollment.version,
                        host_key=enrollment.host_key)
    cert, ca = data.get("certificate"), data.get("ca")
    if not isinstance(cert, str) or not isinstance(ca, str):
        raise RequestFailed("certificate request: the answer has no certificate and CA")
    return cert.encode(), ca.encode()


def install(files: TLSFiles, name: str, cert_pem: bytes, ca_pem: bytes) -> Identity:
    """Put a certificate and its CA in place once they make a usable identity with the key;
    returns that identity.

    Checked on copies beside the real files, which are replaced only then (each
    atomically): a wrong answer leaves the previous files as they were.
    """
    staged = replace(files, cert=files.cert.with_name(f".{files.cert.name}.new"),
                     ca=files.ca.with_name(f".{files.ca.name}.new"))
    try:
        write_private(staged.cert, cert_pem, 0o644)
        write_private(staged.ca, ca_pem, 0o644)
        try:
            found = _checked(staged, name)
        except TLSError as exc:
            raise RequestFailed(f"certificate request: the answer is not usable: {exc}") from None
        os.replace(staged.ca, files.ca)
        os.replace(staged.cert, files.cert)
    finally:
        for path in (staged.cert, staged.ca):
            path.unlink(missing_ok=True)
    return found


def enroll(files: TLSFiles, enrollment: Enrollment, stop: threading.Event) -> None:
    """Make sure ``files`` hold a usable certificate for ``enrollment.name``, asking the
    control plane (with backoff) until it signs one. EnrollmentError if ``stop`` is set first
    or the server refuses for good (401/403: a wrong token; 409: the name belongs to another key)."""
    why = usable(files, enrollment.name)
    if why is None:
        return
    csr = make_csr(files.key, enrollment.name)
    log.info("asking %s for a certificate as %r: %s", enrollment.server, enrollment.name, why)
    attempt = 0
    while True:
        try:
            cert, ca = request_certificate(enrollment, csr)
            obtained = install(files, enrollment.name, cert, ca)
        except RequestFailed as exc:
            if exc.status in (401, 403, 409, 422):
                raise EnrollmentError(f"the control plane refused a certificate: {exc}") from None
            attempt += 1
            delay = backoff_delay(attempt, enrollment.backoff_base, enrollment.backoff_cap, random.uniform)
            log.warning("%s; trying again in %.1fs", exc, delay)
            if stop.wait(delay):
                raise EnrollmentError("stopped before a certificate was obtained") from None
            continue
        log.info("certificate for %r obtained, valid until %s", enrollment.name,
                 f"{obtained.not_after:%Y-%m-%d}")
        return
