"""The real thing: stortune-server under uvicorn in a subprocess, spoken to over TCP."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.server.builders import API, profile_doc


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
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*server_command(), "--db", db_url, "--listen", f"127.0.0.1:{port}", "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT,
        )
        try:
            wait_until_serving(base, proc)
            created = httpx.post(f"{base}{API}/profiles", json=profile_doc(), timeout=5)
            assert created.status_code == 201, created.text
            listed = httpx.get(f"{base}{API}/profiles", timeout=5).json()
            assert [i["metadata"]["name"] for i in listed["items"]] == ["streaming"]
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

    assert main(["--db", f"sqlite:///{tmp_path}/x.db", "--listen", "nope"]) == 2
    assert "HOST:PORT" in capsys.readouterr().err
