"""The TLS files one side of the agent API serves with, checked with the standard library alone.

An agent that already holds its certificate needs no X.509 toolkit to serve:
the files go to grpc as they are, and whether they still make a usable
identity (key and certificate belong together, the certificate chains to the
CA, names the host and is not about to expire) is checked here by a TLS
handshake in memory, the very check a peer will make. ``tls`` (cryptography)
is only loaded to make keys and CSRs, i.e. to enroll or renew: about 9 MiB
the idle agent does not carry.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: An agent asks for a new certificate when its own runs out within this time.
RENEW_BEFORE = dt.timedelta(days=30)
# Enough round trips for TLS 1.2 and 1.3 handshakes; a loop beyond it means a bug.
_HANDSHAKE_ROUNDS = 8


class TLSError(ValueError):
    """A key, CSR or certificate that cannot be used; the message says which and why."""


def write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write atomically (temp file, fsync, rename) with ``mode`` from the first byte on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


def _serving_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context on the pair; OpenSSL refuses a key that is not the certificate's."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise TLSError(f"{cert} does not belong to the key {key}, or one is not PEM ({exc.reason})") from None
    return context


@dataclass(frozen=True)
class Identity:
    """What a verified server certificate vouches for."""

    names: frozenset[str]
    not_after: dt.datetime

    def needs_renewal(self, now: dt.datetime | None = None) -> bool:
        return self.not_after - (now or dt.datetime.now(dt.UTC)) < RENEW_BEFORE


def _pump(client: ssl.SSLObject, server: ssl.SSLObject, bios: tuple[ssl.MemoryBIO, ...]) -> None:
    c_in, c_out, s_in, s_out = bios
    done: set[int] = set()
    for _ in range(_HANDSHAKE_ROUNDS):
        for side, obj in enumerate((client, server)):
            if side not in done:
                try:
                    obj.do_handshake()
                    done.add(side)
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) == 2:
            return
    raise TLSError("the TLS handshake with our own certificate did not finish")


@dataclass(frozen=True)
class TLSFiles:
    """Where one side's key, certificate and trusted CA live."""

    key: Path
    cert: Path
    ca: Path

    @classmethod
    def in_dir(cls, directory: Path, stem: str) -> TLSFiles:
        return cls(directory / f"{stem}.key", directory / f"{stem}.crt", directory / "ca.crt")

    def exist(self) -> bool:
        return all(p.is_file() for p in (self.key, self.cert, self.ca))

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(key, cert, ca) PEM; TLSError naming the file that is missing or unusable."""
        return self._load()[0]

    def pem(self) -> tuple[bytes, bytes, bytes]:
        """(key, cert, ca) PEM as they are, unchecked; TLSError naming a file that cannot be read."""
        out = []
        for label, path in (("key", self.key), ("certificate", self.cert), ("CA certificate", self.ca)):
            try:
                out.append(path.read_bytes())
            except OSError as exc:
                raise TLSError(f"cannot read the TLS {label} {path}: {exc.strerror}") from None
        key, cert, ca = out
        return key, cert, ca

    def _load(self) -> tuple[tuple[bytes, bytes, bytes], ssl.SSLContext]:
        """The three files, and a server context on the pair (which checks they belong together)."""
        return self.pem(), _serving_context(self.cert, self.key)

    def write(self, key_pem: bytes, cert_pem: bytes, ca_pem: bytes) -> None:
        write_private(self.key, key_pem)
        write_private(self.cert, cert_pem, 0o644)
        write_private(self.ca, ca_pem, 0o644)

    def server_identity(self, name: str) -> Identity:
        """Serve our certificate to a client that trusts only our CA and dials ``name``, in memory.

        TLSError with the verifier's reason when a peer would refuse it: not issued
        by the CA, another name, expired, not a server certificate.
        """
        (_key, _cert, ca), server_context = self._load()
        try:
            client_context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=ca.decode("ascii"))
        except (ssl.SSLError, UnicodeDecodeError, ValueError) as exc:
            raise TLSError(f"{self.ca} is not a usable CA certificate ({exc})") from None
        bios = tuple(ssl.MemoryBIO() for _ in range(4))
        client = client_context.wrap_bio(bios[0], bios[1], server_hostname=name)
        server = server_context.wrap_bio(bios[2], bios[3], server_side=True)
        try:
            _pump(client, server, bios)
        except ssl.SSLCertVerificationError as exc:
            raise TLSError(f"{self.cert} does not verify for {name!r} against {self.ca}: "
                           f"{exc.verify_message}") from None
        except ssl.SSLError as exc:
            raise TLSError(f"{self.cert} cannot serve TLS: {exc.reason}") from None
        peer = client.getpeercert()
        assert peer is not None  # verified above: a verified handshake always has the peer's certificate
        names = {str(entry[1]) for entry in peer.get("subjectAltName", ())
                 if isinstance(entry, tuple) and len(entry) == 2 and entry[0] == "DNS"}
        not_after = dt.datetime.fromtimestamp(ssl.cert_time_to_seconds(str(peer["notAfter"])), dt.UTC)
        return Identity(frozenset(names), not_after)
