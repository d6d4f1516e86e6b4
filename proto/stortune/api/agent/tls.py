"""X.509 identities of the agent API's mutual TLS.

The control plane keeps a small CA of its own. Each agent generates its key
locally and sends a CSR when it registers (gated by the bootstrap token); the
control plane signs a certificate naming the host as it registered (DNS SAN =
host name), whatever the CSR asked for. The control plane dials agents with a
client certificate naming ``CONTROL_PLANE_NAME``.

Both checks need more than "signed by our CA", because every agent's
certificate is signed by it too:

* an agent accepts a call only from a peer whose certificate chains to the CA,
  is a client certificate *and* names the control plane (``agent.mtls``), so
  one agent cannot drive another;
* the control plane verifies the chain and that the certificate names the
  host it dialled (gRPC's target-name check against the SAN).

No grpc here: registration, which runs without grpc, makes CSRs too. The files
and the checks an agent makes while serving are in ``tlsfiles`` (no cryptography).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from stortune.api.agent import CONTROL_PLANE_NAME
from stortune.api.agent.tlsfiles import RENEW_BEFORE, TLSError, TLSFiles, write_private

__all__ = ["CONTROL_PLANE_NAME", "RENEW_BEFORE", "CertificateAuthority", "KeyPair", "TLSError", "TLSFiles",
           "write_private"]

AGENT_DAYS = 365
CONTROL_PLANE_DAYS = 825
CA_DAYS = 3650
# Certificates start a little in the past: a peer whose clock is behind must not
# see a certificate that is not valid yet.
_BACKDATE = dt.timedelta(minutes=5)


def _now(now: dt.datetime | None) -> dt.datetime:
    return now or dt.datetime.now(dt.UTC)


# -- keys and CSRs (the agent's side) ---------------------------------------------------
def new_key() -> bytes:
    """A fresh P-256 key as PKCS#8 PEM: small, fast, and what every TLS stack accepts."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load_key(key_pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TLSError(f"not a usable PEM private key: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TLSError("the private key must be an EC key")
    return key


def make_csr(key_pem: bytes, name: str) -> bytes:
    """A CSR for ``name``; the CA decides what the certificate really says."""
    key = _load_key(key_pem)
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
           .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM)


def load_cert(cert_pem: bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TLSError(f"not a PEM certificate: {exc}") from None


def cert_names(cert_pem: bytes) -> set[str]:
    """The names a certificate vouches for: its CN and DNS SANs."""
    cert = load_cert(cert_pem)
    names = {str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return names
    return names | set(san.get_values_for_type(x509.DNSName))


def issued_by(cert_pem: bytes, ca_pem: bytes) -> bool:
    cert, ca = load_cert(cert_pem), load_cert(ca_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def expires(cert_pem: bytes) -> dt.datetime:
    return load_cert(cert_pem).not_valid_after_utc


def needs_renewal(cert_pem: bytes, now: dt.datetime | None = None) -> bool:
    return expires(cert_pem) - _now(now) < RENEW_BEFORE


def key_fingerprint(cert_pem: bytes) -> str:
    """SHA-256 (hex) of the certificate's public key: what stays the same across renewals."""
    spki = load_cert(cert_pem).public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(spki).hexdigest()


def matches_key(cert_pem: bytes, key_pem: bytes) -> bool:
    # Compared as encoded SubjectPublicKeyInfo: works for any key type the certificate holds.
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return load_cert(cert_pem).public_key().public_bytes(*spki) == \
        _load_key(key_pem).public_key().public_bytes(*spki)


# -- the CA (the control plane's side) ------------------------------------------------------
@dataclass(frozen=True)
class KeyPair:
    key_pem: bytes
    cert_pem: bytes


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey,
             days: int, now: dt.datetime | None) -> x509.CertificateBuilder:
    start = _now(now) - _BACKDATE
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + dt.timedelta(days=days))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _leaf(builder: x509.CertificateBuilder, name: str, usage: x509.ObjectIdentifier,
          ca: CertificateAuthority) -> bytes:
    ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (builder
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                         content_commitment=False, data_encipherment=False,
                                         key_agreement=True, key_cert_sign=False, crl_sign=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                           critical=False)
            .sign(ca.key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class CertificateAuthority:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate

    @classmethod
    def create(cls, name: str = "stortune agent CA", days: int = CA_DAYS,
               now: dt.datetime | None = None) -> CertificateAuthority:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (_builder(name, subject, key.public_key(), days, now)
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=False, key_encipherment=False,
                                             content_commitment=False, data_encipherment=False,
                                             key_agreement=False, key_cert_sign=True, crl_sign=True,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return cls(key, cert)

    @classmethod
    def from_pem(cls, key_pem: bytes, cert_pem: bytes) -> CertificateAuthority:
        ca = cls(_load_key(key_pem), load_cert(cert_pem))
        if not matches_key(ca.cert_pem, key_pem):
            raise TLSError("the CA certificate does not belong to the CA key")
        return ca

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption())

    def sign_agent(self, csr_pem: bytes, host: str, days: int = AGENT_DAYS,
                   now: dt.datetime | None = None) -> bytes:
        """A server certificate for ``host`` on the CSR's key (the CSR's own names are ignored)."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as exc:
            raise TLSError(f"not a PEM certificate signing request: {exc}") from None
        if not csr.is_signature_valid:
            raise TLSError("the CSR's signature does not match its key")
        public_key = csr.public_key()
        if not isinstance(public_key, ec.EllipticCurvePublicKey):
            raise TLSError("the CSR must carry an EC key (P-256)")
        builder = _builder(host, self.cert.subject, public_key, days, now)
        return _leaf(builder, host, ExtendedKeyUsageOID.SERVER_AUTH, self)

    def issue_control_plane(self, name: str = CONTROL_PLANE_NAME, days: int = CONTROL_PLANE_DAYS,
                            now: dt.datetime | None = None) -> KeyPair:
        key_pem = new_key()
        public_key = _load_key(key_pem).public_key()
        builder = _builder(name, self.cert.subject, public_key, days, now)
        return KeyPair(key_pem, _leaf(builder, name, ExtendedKeyUsageOID.CLIENT_AUTH, self))


# -- the control plane's PKI directory ------------------------------------------------------------
CA_KEY, CA_CERT = "ca.key", "ca.crt"
CONTROL_PLANE_STEM = "control-plane"


def init_pki(directory: Path, *, force: bool = False) -> list[Path]:
    """Create the CA and the control plane's client certificate in ``directory``.

    Refuses to replace an existing CA unless ``force``: every agent's certificate
    hangs on it. Returns the files written.
    """
    ca_key = directory / CA_KEY
    if ca_key.exists() and not force:
        raise TLSError(f"{ca_key} exists; a new CA would orphan every agent certificate"
                       " (use --force to replace it anyway)")
    ca = CertificateAuthority.create()
    pair = ca.issue_control_plane()
    write_private(ca_key, ca.key_pem)
    client = TLSFiles.in_dir(directory, CONTROL_PLANE_STEM)
    client.write(pair.key_pem, pair.cert_pem, ca.cert_pem)
    return [ca_key, client.ca, client.key, client.cert]


def load_pki(directory: Path) -> tuple[CertificateAuthority, TLSFiles]:
    """The CA (to sign agent CSRs) and the control plane's own client files."""
    try:
        ca = CertificateAuthority.from_pem((directory / CA_KEY).read_bytes(),
                                           (directory / CA_CERT).read_bytes())
    except OSError as exc:
        raise TLSError(f"no usable CA in {directory}: {exc.strerror}"
                       " (run `stortune-server certs init`)") from None
    client = TLSFiles.in_dir(directory, CONTROL_PLANE_STEM)
    client.read()
    return ca, client

