"""The agent API's X.509 identities: the CA signs what registration asks, and no more."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from stortune.api.agent import tls


@pytest.fixture(scope="module")
def ca() -> tls.CertificateAuthority:
    return tls.CertificateAuthority.create()


def test_agent_certificate_names_the_registered_host_not_what_the_csr_asked(
        ca: tls.CertificateAuthority) -> None:
    key = tls.new_key()
    cert = ca.sign_agent(tls.make_csr(key, "stortune-control-plane"), "fileserver")
    assert tls.cert_names(cert) == {"fileserver"}
    assert tls.matches_key(cert, key)
    assert tls.issued_by(cert, ca.cert_pem)
    # An agent's certificate is never taken for the control plane's, whatever it asked for.
    assert tls.CONTROL_PLANE_NAME not in tls.cert_names(cert)


def test_control_plane_certificate_names_it_and_comes_from_our_ca(ca: tls.CertificateAuthority) -> None:
    pair = ca.issue_control_plane()
    assert tls.issued_by(pair.cert_pem, ca.cert_pem)
    assert tls.cert_names(pair.cert_pem) == {tls.CONTROL_PLANE_NAME}
    other = tls.CertificateAuthority.create()
    forged = other.issue_control_plane()
    assert not tls.issued_by(forged.cert_pem, ca.cert_pem)
    with pytest.raises(tls.TLSError):
        tls.cert_names(b"not a certificate")


def test_bad_csrs_are_refused_with_the_reason(ca: tls.CertificateAuthority) -> None:
    with pytest.raises(tls.TLSError, match="certificate signing request"):
        ca.sign_agent(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
                      "h")
    csr = tls.make_csr(tls.new_key(), "h")
    tampered = csr.replace(csr.splitlines()[3], csr.splitlines()[3][:-4] + b"AAAA")
    with pytest.raises(tls.TLSError):
        ca.sign_agent(tampered, "h")


def test_renewal_is_due_a_month_before_expiry(ca: tls.CertificateAuthority) -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    cert = ca.sign_agent(tls.make_csr(tls.new_key(), "h"), "h", days=365, now=now)
    assert not tls.needs_renewal(cert, now + dt.timedelta(days=300))
    assert tls.needs_renewal(cert, now + dt.timedelta(days=340))


def test_pki_directory_round_trips_and_refuses_to_orphan_agents(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    written = tls.init_pki(pki)
    assert {p.name for p in written} == {"ca.key", "ca.crt", "control-plane.key", "control-plane.crt"}
    for key in ("ca.key", "control-plane.key"):
        assert stat.S_IMODE((pki / key).stat().st_mode) == 0o600
    ca, client = tls.load_pki(pki)
    key, cert, ca_pem = client.read()
    assert ca_pem == ca.cert_pem and tls.issued_by(cert, ca_pem)
    with pytest.raises(tls.TLSError, match="--force"):
        tls.init_pki(pki)
    tls.init_pki(pki, force=True)
    assert tls.load_pki(pki)[0].cert_pem != ca.cert_pem


def test_files_that_do_not_belong_together_are_named(tmp_path: Path, ca: tls.CertificateAuthority) -> None:
    files = tls.TLSFiles.in_dir(tmp_path, "agent")
    with pytest.raises(tls.TLSError, match=r"agent\.key"):
        files.read()
    cert = ca.sign_agent(tls.make_csr(tls.new_key(), "h"), "h")
    files.write(tls.new_key(), cert, ca.cert_pem)
    with pytest.raises(tls.TLSError, match="does not belong"):
        files.read()
    with pytest.raises(tls.TLSError, match="certs init"):
        tls.load_pki(tmp_path / "nowhere")


def test_an_agent_checks_its_own_identity_as_a_peer_would(
        tmp_path: Path, ca: tls.CertificateAuthority) -> None:
    """TLSFiles.server_identity (the standard library's handshake) agrees with cryptography's view."""
    files = tls.TLSFiles.in_dir(tmp_path, "agent")
    key = tls.new_key()
    cert = ca.sign_agent(tls.make_csr(key, "h"), "h")
    files.write(key, cert, ca.cert_pem)
    identity = files.server_identity("h")
    assert identity.names == frozenset(tls.cert_names(cert))
    assert identity.not_after == tls.expires(cert).replace(microsecond=0)
    assert not identity.needs_renewal()
    with pytest.raises(tls.TLSError, match="'other'"):
        files.server_identity("other")
    # From another CA, or our CA's control-plane (client) certificate: a peer would refuse both.
    foreign = tls.CertificateAuthority.create()
    files.write(key, foreign.sign_agent(tls.make_csr(key, "h"), "h"), ca.cert_pem)
    with pytest.raises(tls.TLSError, match="does not verify"):
        files.server_identity("h")
    pair = ca.issue_control_plane()
    files.write(pair.key_pem, pair.cert_pem, ca.cert_pem)
    with pytest.raises(tls.TLSError):
        files.server_identity(tls.CONTROL_PLANE_NAME)
    # Expired: the verifier says so.
    old = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
    files.write(key, ca.sign_agent(tls.make_csr(key, "h"), "h", days=30, now=old), ca.cert_pem)
    with pytest.raises(tls.TLSError, match="expired"):
        files.server_identity("h")
    # Due for renewal within a month, though still valid.
    soon = dt.datetime.now(dt.UTC) - dt.timedelta(days=360)
    files.write(key, ca.sign_agent(tls.make_csr(key, "h"), "h", days=365, now=soon), ca.cert_pem)
    assert files.server_identity("h").needs_renewal()
