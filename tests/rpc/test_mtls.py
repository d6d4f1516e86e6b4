"""Mutual TLS between the control plane and its agents, over real gRPC on 127.0.0.1.

An agent accepts only the control plane's certificate (not one from another CA,
not another agent's, not none); the control plane accepts only an agent whose
certificate comes from its CA and names the host it dials.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from stortune.agent import identity
from stortune.agent.serve import Agent, ServeError, ServeOptions
from stortune.api.agent import HOST_KEY_HEADER, tls, wire
from stortune.api.agent.tls import TLSFiles
from stortune.server import RecordingController, Settings, create_app
from stortune.server.agentclient import (
    AgentClients,
    AgentRejected,
    AgentUnreachable,
    Observation,
    Timeouts,
)
from stortune.server.auth import Role
from stortune.server.serving import Server as UvicornServer
from tests.fixtures.agent_host import Host, build_host
from tests.server.support import issue_token

SHORT = Timeouts(read=5)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    directory = tmp_path / "pki"
    tls.init_pki(directory)
    return directory


def ca_of(pki: Path) -> tls.CertificateAuthority:
    return tls.load_pki(pki)[0]


def agent_files(directory: Path, ca: tls.CertificateAuthority, name: str) -> TLSFiles:
    files = TLSFiles.in_dir(directory, "agent")
    key = tls.new_key()
    files.write(key, ca.sign_agent(tls.make_csr(key, name), name), ca.cert_pem)
    return files


def serving(host: Host, state: Path, files: TLSFiles | None, **options: object) -> Agent:
    agent = Agent(host.fs, state, ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1,
                                               tls_files=files, **options))  # type: ignore[arg-type]
    agent.start()
    return agent


@pytest.fixture
def tls_agent(tmp_path: Path, pki: Path) -> Iterator[Agent]:
    host = build_host(tmp_path / "host")
    agent = serving(host, tmp_path / "state", agent_files(tmp_path / "agent-tls", ca_of(pki), "h1"))
    try:
        yield agent
    finally:
        agent.stop()


def clients_with(files: TLSFiles | None) -> AgentClients:
    return AgentClients(tls=files, timeouts=SHORT)


def observe(clients: AgentClients, address: str, host: str | None) -> Observation:
    async def scenario() -> Observation:
        try:
            return await clients.for_address(address, host).get_observed()
        finally:
            await clients.close()

    return asyncio.run(scenario())


def test_the_control_plane_gets_in(tls_agent: Agent, pki: Path) -> None:
    _, client = tls.load_pki(pki)
    answer = observe(clients_with(client), tls_agent.address, "h1")
    assert answer.info.hostname == "rpc-host" and "loop7" in answer.observed


def test_the_agent_refuses_a_client_from_another_ca(tls_agent: Agent, tmp_path: Path) -> None:
    forged = tmp_path / "forged"
    tls.init_pki(forged)  # a CA of its own, and a "control plane" certificate from it
    _, client = tls.load_pki(forged)
    own_ca = tls_agent.tls.ca if tls_agent.tls else None
    assert own_ca is not None
    # It trusts the real CA for the agent's certificate, so only its own certificate is wrong.
    mixed = TLSFiles(key=client.key, cert=client.cert, ca=own_ca)
    with pytest.raises(AgentUnreachable):
        observe(clients_with(mixed), tls_agent.address, "h1")


def test_the_agent_refuses_another_agents_certificate(tls_agent: Agent, pki: Path, tmp_path: Path) -> None:
    # An agent's certificate is for serving only: TLS itself refuses it as a client's.
    other = agent_files(tmp_path / "other-agent", ca_of(pki), "h2")
    with pytest.raises(AgentUnreachable):
        observe(clients_with(other), tls_agent.address, "h1")


def test_the_agent_refuses_a_client_certificate_that_does_not_name_the_control_plane(
        tls_agent: Agent, pki: Path, tmp_path: Path) -> None:
    pair = ca_of(pki).issue_control_plane(name="someone-else")
    files = TLSFiles.in_dir(tmp_path / "someone", "client")
    files.write(pair.key_pem, pair.cert_pem, (pki / "ca.crt").read_bytes())
    with pytest.raises(AgentRejected, match="only the control plane"):
        observe(clients_with(files), tls_agent.address, "h1")


def test_the_agent_refuses_a_client_without_a_certificate(tls_agent: Agent, pki: Path) -> None:
    # Trusting the agent's CA and naming the right host, but presenting no certificate.
    trust = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.crt").read_bytes())
    channel = grpc.secure_channel(tls_agent.address, trust,
                                  options=[("grpc.ssl_target_name_override", "h1")])
    with channel, pytest.raises(grpc.RpcError) as refused:
        wire.agent_stub(channel).GetObserved(wire.GetObservedRequest(), timeout=5)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(AgentUnreachable):
        observe(clients_with(None), tls_agent.address, "h1")  # plaintext gRPC


def test_the_control_plane_refuses_an_agent_with_a_foreign_certificate(
        tmp_path: Path, pki: Path) -> None:
    foreign = tmp_path / "foreign"
    tls.init_pki(foreign)
    host = build_host(tmp_path / "host")
    agent = serving(host, tmp_path / "state", agent_files(tmp_path / "foreign-agent", ca_of(foreign), "h1"))
    try:
        _, client = tls.load_pki(pki)
        with pytest.raises(AgentUnreachable, match="TLS handshake failed"):
            observe(clients_with(client), agent.address, "h1")
    finally:
        agent.stop()


def test_the_control_plane_refuses_an_agent_answering_for_another_host(tls_agent: Agent, pki: Path) -> None:
    _, client = tls.load_pki(pki)
    with pytest.raises(AgentUnreachable, match="certificate names another host"):
        observe(clients_with(client), tls_agent.address, "h2")


def served_certificate(address: str, pki: Path, name: str) -> bytes:
    _, client = tls.load_pki(pki)
    context = ssl.create_default_context(cafile=str(client.ca))
    context.load_cert_chain(str(client.cert), str(client.key))
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=name) as conn:
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_renewed_certificate_is_served_without_a_restart(tls_agent: Agent, pki: Path) -> None:
    assert tls_agent.tls is not None
    before = served_certificate(tls_agent.address, pki, "h1")
    key = tls.new_key()
    renewed = ca_of(pki).sign_agent(tls.make_csr(key, "h1"), "h1")
    time.sleep(0.01)  # a new mtime, even on coarse clocks
    tls_agent.tls.write(key, renewed, tls_agent.tls.ca.read_bytes())
    after = served_certificate(tls_agent.address, pki, "h1")
    assert after != before
    assert after == x509.load_pem_x509_certificate(renewed).public_bytes(Encoding.DER)
    _, client = tls.load_pki(pki)
    observe(clients_with(client), tls_agent.address, "h1")


def test_unusable_new_files_are_checked_once_and_the_old_certificate_kept_until_they_change(
        tmp_path: Path, pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stortune.agent import mtls

    files = agent_files(tmp_path / "tls", ca_of(pki), "h1")
    reloader = mtls._Reloader(files)
    checks: list[TLSFiles] = []
    real = identity.check_pair
    monkeypatch.setattr(identity, "check_pair", lambda f: (checks.append(f), real(f))[1])
    assert reloader() is None and checks == []  # unchanged: no check
    good_key = files.key.read_bytes()
    time.sleep(0.01)  # a new mtime, even on coarse clocks
    files.key.write_bytes(tls.new_key())  # not the certificate's key
    for _ in range(3):  # handshakes meanwhile keep the old certificate
        assert reloader() is None
    assert len(checks) == 1
    time.sleep(0.01)
    files.key.write_bytes(good_key)
    assert reloader() is not None and len(checks) == 2


def test_without_certificates_or_insecure_the_agent_will_not_start(tmp_path: Path) -> None:
    host = build_host(tmp_path / "host")
    agent = Agent(host.fs, tmp_path / "state", ServeOptions(listen="127.0.0.1:0", grace=1))
    with pytest.raises(ServeError, match=r"no usable certificate.*--insecure"):
        agent.start()
    agent.stop()


# -- enrollment against a real control plane -----------------------------------------------------
@pytest.fixture
def control_plane(tmp_path: Path, pki: Path) -> Iterator[tuple[str, str, str]]:
    """(URL, agent bootstrap token, admin token) of a real control plane signing with ``pki``."""
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'cp.db'}", agent_pki=pki),
                     controller=RecordingController())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = UvicornServer(app, log_level="warning", lifespan="on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the control plane did not start"
            time.sleep(0.02)
        yield (f"http://127.0.0.1:{sock.getsockname()[1]}", issue_token(app, Role.AGENT),
               issue_token(app, Role.ADMIN))
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        app.state.engine.dispose()


def test_an_agent_obtains_its_certificate_and_keeps_its_key_at_home(
        control_plane: tuple[str, str, str], tmp_path: Path, pki: Path) -> None:
    url, token, _ = control_plane
    host = build_host(tmp_path / "host")
    state = tmp_path / "state"
    agent = serving(host, state, None, server=url, token=token, name="enrolled-1")
    try:
        own = TLSFiles.in_dir(state / "tls", "agent")
        key, cert, ca = own.read()
        assert tls.cert_names(cert) == {"enrolled-1"} and ca == ca_of(pki).cert_pem
        assert oct(own.key.stat().st_mode & 0o777) == "0o600"
        _, client = tls.load_pki(pki)
        assert observe(clients_with(client), agent.address, "enrolled-1").info.hostname == "rpc-host"
    finally:
        agent.stop()
    # A restart keeps the certificate it has: no new request, the same key.
    again = serving(host, state, None, server="http://127.0.0.1:1", token=token, name="enrolled-1")
    try:
        assert own.read()[0] == key
    finally:
        again.stop()


def test_a_wrong_bootstrap_token_stops_the_agent_with_the_reason(
        control_plane: tuple[str, str, str], tmp_path: Path) -> None:
    url, _, _ = control_plane
    host = build_host(tmp_path / "host")
    agent = Agent(host.fs, tmp_path / "state", ServeOptions(listen="127.0.0.1:0", grace=1, server=url,
                                                            token="stt_" + "x" * 43, name="h9"))
    with pytest.raises(ServeError, match=r"refused a certificate.*401"):
        agent.start()
    agent.stop()


def test_a_bad_csr_is_a_422_naming_the_field(control_plane: tuple[str, str, str]) -> None:
    import httpx

    url, token, _ = control_plane
    response = httpx.post(f"{url}/api/v1/agents/certificate", headers={"Authorization": f"Bearer {token}"},
                          json={"name": "h1", "csr": "-----BEGIN CERTIFICATE REQUEST-----\n" + "A" * 80})
    assert response.status_code == 422
    assert response.json()["details"]["causes"][0]["field"] == "csr"


def test_a_name_stays_with_the_key_that_first_got_it(control_plane: tuple[str, str, str]) -> None:
    import httpx

    url, agent_token, admin_token = control_plane
    first, second = tls.new_key(), tls.new_key()

    def ask(key: bytes) -> httpx.Response:
        return httpx.post(f"{url}/api/v1/agents/certificate",
                          headers={"Authorization": f"Bearer {agent_token}"},
                          json={"name": "db-7", "csr": tls.make_csr(key, "db-7").decode()})

    assert ask(first).status_code == 200
    assert ask(first).status_code == 200, "renewal with the same key"
    taken = ask(second)
    assert taken.status_code == 409 and "another agent's key" in taken.json()["message"]
    # Declared gone by an admin: a reinstalled machine may take the name.
    with httpx.Client(base_url=f"{url}/api/v1", headers={"Authorization": f"Bearer {agent_token}",
                                                          HOST_KEY_HEADER: "k" * 43}) as c:
        assert c.post("/agents/register", json={"name": "db-7", "address": "127.0.0.1:9",
                                                 "labels": {}, "facts": {}}).status_code == 200
    deleted = httpx.delete(f"{url}/api/v1/hosts/db-7", headers={"Authorization": f"Bearer {admin_token}"})
    assert deleted.status_code == 200
    issued = ask(second)
    assert issued.status_code == 200
    assert tls.matches_key(issued.json()["certificate"].encode(), second)


_ENROLL_IN_A_FRESH_PROCESS = """
import sys, threading
from pathlib import Path
from stortune.agent import identity
files = identity.own_files(Path(sys.argv[1]))
identity.enroll(files, identity.Enrollment(server=sys.argv[2], name="fresh-1", token=sys.argv[3]),
                threading.Event())
print(sorted(m for m in sys.modules if m.split(".")[0] == "cryptography"))
"""


def test_enrolling_leaves_no_cryptography_in_the_agent(control_plane: tuple[str, str, str],
                                                       tmp_path: Path) -> None:
    url, token, _ = control_plane
    out = subprocess.run([sys.executable, "-c", _ENROLL_IN_A_FRESH_PROCESS, str(tmp_path / "state"), url,
                          token], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"  # the key and CSR were made by a child process
    cert = TLSFiles.in_dir(tmp_path / "state/tls", "agent").read()[1]
    assert tls.cert_names(cert) == {"fresh-1"}


def test_the_csr_tool_keeps_a_good_key_and_replaces_an_unusable_one(tmp_path: Path) -> None:
    key_file = tmp_path / "tls/agent.key"
    first = identity.make_csr(key_file, "h1")  # no key yet: made, 0600
    key = key_file.read_bytes()
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    again = identity.make_csr(key_file, "h1")
    assert key_file.read_bytes() == key
    public = [x509.load_pem_x509_csr(c).public_key().public_bytes(Encoding.PEM,
                                                                  PublicFormat.SubjectPublicKeyInfo)
              for c in (first, again)]
    assert public[0] == public[1]
    assert x509.load_pem_x509_csr(first).subject.rfc4514_string() == "CN=h1"
    key_file.write_bytes(b"not a key")
    identity.make_csr(key_file, "h1")
    assert key_file.read_bytes() != b"not a key"
    tls.make_csr(key_file.read_bytes(), "h1")  # a usable key now


def test_the_tls_check_tool_sees_what_the_standard_library_sees_in_process(tmp_path: Path, pki: Path) -> None:
    ca = ca_of(pki)
    files = agent_files(tmp_path / "tls", ca, "h1")
    assert identity.identity_of(files, "h1") == files.server_identity("h1")
    identity.check_pair(files)
    with pytest.raises(tls.TLSError, match="does not verify for 'h2'"):
        identity.identity_of(files, "h2")
    files.key.write_bytes(tls.new_key())  # another key: the pair no longer belongs together
    with pytest.raises(tls.TLSError, match=r"agent\.crt does not belong to the key"):
        identity.check_pair(files)
    files.ca.unlink()
    with pytest.raises(tls.TLSError, match=r"cannot read the TLS CA certificate .*ca\.crt"):
        identity.check_pair(files)


def test_an_unusable_certificate_in_the_answer_leaves_the_old_files_alone(tmp_path: Path, pki: Path) -> None:
    ca = ca_of(pki)
    files = agent_files(tmp_path / "tls", ca, "h1")
    before = files.read()
    ours, foreign = tls.make_csr(before[0], "h1"), tls.make_csr(tls.new_key(), "h1")
    for cert, ca_pem, why in (
            (ca.sign_agent(ours, "other-host"), ca.cert_pem, "does not verify for 'h1'"),
            (ca.sign_agent(foreign, "h1"), ca.cert_pem, "does not belong to the key"),
            (ca.sign_agent(ours, "h1"), tls.CertificateAuthority.create().cert_pem,
             "does not verify for 'h1'")):
        with pytest.raises(identity.RequestFailed, match=why):
            identity.install(files, "h1", cert, ca_pem)
        assert files.read() == before
        assert sorted(p.name for p in files.cert.parent.iterdir()) == ["agent.crt", "agent.key", "ca.crt"]
    renewed = ca.sign_agent(ours, "h1")
    identity.install(files, "h1", renewed, ca.cert_pem)
    assert files.read()[1] == renewed
