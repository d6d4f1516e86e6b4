"""The real thing: stortune-server under uvicorn in a subprocess, spoken to over TCP."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from stortune.api.agent import HOST_KEY_HEADER
from stortune.server.db.engine import make_engine
from stortune.server.db.tables import Base
from tests.server import hostile
from tests.server.builders import API, host_key, keyed, loop_topology, profile_doc, registration


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_command() -> list[str]:
    script = Path(sys.executable).with_name("stortune-server")
    if script.exists():
        return [str(script)]
    found = shutil.which("stortune-server")
    return [found] if found else [sys.executable, "-m", "stortune.server"]


def wait_until_serving(base: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"server did not answer on {base} within {timeout}s")


def test_server_serves_over_tcp(db_url: str, tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "server.log"
    state = tmp_path / "state"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*server_command(), "--db", db_url, "--state-dir", str(state), "--listen", f"127.0.0.1:{port}",
             "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(base, proc)
            # The first start wrote an admin token for whoever can read the state directory.
            admin = (state / "admin.token").read_text().strip()
            assert (state / "admin.token").stat().st_mode & 0o777 == 0o600
            with httpx.Client(base_url=base + API, headers={"Authorization": f"Bearer {admin}"},
                              timeout=5) as http:
                created = http.post("/profiles", json=profile_doc())
                assert created.status_code == 201, created.text
                listed = http.get("/profiles").json()
                assert [i["metadata"]["name"] for i in listed["items"]] == ["streaming"]
            assert httpx.get(f"{base}{API}/profiles", timeout=5).status_code == 401
            assert httpx.get(f"{base}/openapi.json", timeout=5).json()["info"]["title"]
        except BaseException:
            print(log.read_text(errors="replace"))
            raise
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    # uvicorn re-raises the signal once it has shut down gracefully.
    assert proc.returncode in (0, -signal.SIGTERM), log.read_text(errors="replace")


def test_cli_rejects_bad_settings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from stortune.server.cli import main

    assert main(["--db", f"sqlite:///{tmp_path}/x.db", "--listen", "nope"]) == 1
    assert "HOST:PORT" in capsys.readouterr().err


@dataclass
class Running:
    base: str
    state: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def token(self, name: str = "admin.token") -> str:
        return (self.state / name).read_text().strip()

    def client(self, token: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.base, timeout=10,
                            headers={"Authorization": f"Bearer {token or self.token()}"})


@contextmanager
def running_server(db_url: str, tmp_path: Path, *args: str) -> Iterator[Running]:
    port = free_port()
    server = Running(f"http://127.0.0.1:{port}", tmp_path / "state", tmp_path / "server.log",
                     None)  # type: ignore[arg-type]
    with server.log.open("wb") as out:
        server.proc = subprocess.Popen(
            [*server_command(), "--db", db_url, "--state-dir", str(server.state),
             "--listen", f"127.0.0.1:{port}", *args], stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until_serving(server.base, server.proc)
            yield server
        except BaseException:
            print(server.log.read_text(errors="replace")[-20_000:])
            raise
        finally:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()


def test_hostile_input_against_the_real_server(db_url: str, tmp_path: Path) -> None:
    with running_server(db_url, tmp_path, "--max-body-size", str(hostile.MAX_BODY),
                        "--log-level", "warning") as server, server.client() as client:
        assert client.post(f"{API}/agents/register", json=registration("h1")).status_code == 200
        for case in hostile.CASES:
            hostile.check(case, case.send(client))
            hostile.still_serving(client)
        # A declared size far over the limit is answered before a byte of the body is read.
        with socket.create_connection(("127.0.0.1", int(server.base.rpartition(":")[2])), timeout=10) as raw:
            raw.sendall(b"POST /api/v1/profiles HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: Bearer " + server.token().encode() + b"\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n")
            assert raw.recv(4096).startswith(b"HTTP/1.1 413 ")
        hostile.still_serving(client)
        assert server.proc.poll() is None


def test_no_secret_reaches_the_log_events_or_audit(db_url: str, tmp_path: Path) -> None:
    wrong = "stt_" + "w" * 43
    with running_server(db_url, tmp_path, "--log-level", "debug") as server, server.client() as admin:
        secrets = [server.token(), server.token("agent-bootstrap.token"), wrong]
        for role, extra in (("viewer", {}), ("operator", {}), ("agent", {}),
                            ("support", {"hostSelector": "role=streamer", "expiresIn": "1h"})):
            made = admin.post(f"{API}/tokens", json={"role": role, **extra})
            assert made.status_code == 201, made.text
            secrets.append(made.json()["token"])
        viewer, operator, agent, support = (httpx.Client(base_url=server.base, timeout=10,
                                            headers={"Authorization": f"Bearer {s}"}) for s in secrets[3:])
        key = keyed("h1")  # the agent's host key is a secret too
        secrets.append(host_key("h1"))
        with viewer, operator, agent, support:
            assert agent.post(f"{API}/agents/register", headers=key,
                              json=registration("h1", topology=loop_topology())).status_code == 200
            assert agent.post(f"{API}/agents/h1/heartbeat", headers={HOST_KEY_HEADER: "x" * 43},
                              json={"topology_hash": "", "boot_id": "b"}).status_code == 403
            assert agent.post(f"{API}/agents/h1/heartbeat", headers=key,
                              json={"topology_hash": "", "boot_id": "b"}).status_code == 200
            assert operator.post(f"{API}/profiles", json=profile_doc()).status_code == 201
            assert operator.patch(f"{API}/hosts/h1/labels", json={"labels": {"a": "b"}}).status_code == 200
            assert viewer.post(f"{API}/profiles", json=profile_doc("x")).status_code == 403
            assert support.get(f"{API}/hosts/h1").status_code == 200
        with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {wrong}"}) as bad:
            assert bad.get(f"{API}/hosts").status_code == 401
        assert admin.get(f"{API}/events").json()["items"]  # something was recorded
        assert len(admin.get(f"{API}/audit").json()["items"]) >= 5
        revoked = admin.get(f"{API}/tokens").json()["items"][0]["id"]
        assert admin.delete(f"{API}/tokens/{revoked}").status_code == 200
    log = server.log.read_text(errors="replace")
    assert "DEBUG" in log and "POST /api/v1/tokens" in log  # debug logging really was on
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            tables = {t.name: "\n".join(repr(tuple(r)) for r in conn.execute(select(t)))
                      for t in Base.metadata.sorted_tables}
    finally:
        engine.dispose()
    assert tables["events"] and tables["audit_log"]
    for secret in secrets:
        assert secret not in log
        for name, dump in tables.items():
            assert secret not in dump, name
