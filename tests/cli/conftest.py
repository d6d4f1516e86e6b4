"""The CLI against the real control plane: uvicorn on 127.0.0.1 in a background thread, fresh
SQLite per test, spoken to over TCP. Nothing of HTTP is faked."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from stortune.cli.main import main
from stortune.schemas.topology import (
    Device,
    DeviceKind,
    RecordedOriginal,
    ScsiHost,
    Topology,
    TunableState,
)
from stortune.server import RecordingController, Settings, create_app, serving
from stortune.server.auth import Role
from tests.server.support import issue_token

API = "/api/v1"


def raid_volume(read_ahead_kb: int = 128, original: int | None = None) -> Device:
    """A MegaRAID volume as discovery reports it: what examples/vod-streamer.yaml selects.
    ``original``: stortune changed read_ahead_kb from it (its agent's journal says so)."""
    return Device(
        name="sda", kind=DeviceKind.DISK, id="wwn:naa.600605b0", size_bytes=4 << 40, rotational=True,
        scsi_host=ScsiHost(name="host0", driver="megaraid_sas"),
        tunables={
            "read_ahead_kb": TunableState(
                supported=True, value=read_ahead_kb, raw=str(read_ahead_kb), writable=True,
                original=None if original is None else RecordedOriginal(value=original)),
            "scheduler": TunableState(supported=True, value="none", raw="[none] mq-deadline",
                                      writable=True, choices=["none", "mq-deadline"]),
            "nr_requests": TunableState(supported=True, value=256, raw="256", writable=True, minimum=4,
                                        maximum=2048),
            "max_sectors_kb": TunableState(supported=True, value=1024, raw="1024", writable=True,
                                           minimum=4, maximum=4096),
        },
    )


@dataclass
class ControlPlane:
    url: str
    admin_token: str
    issue: Callable[..., str]  # issue(role, hosts=..., expires_in=...) -> a new token's secret

    def http(self, token: str | None = None) -> httpx.Client:
        """A client sending ``token`` (default: the admin token)."""
        secret = token or self.admin_token
        return httpx.Client(base_url=self.url + API, timeout=10,
                            headers={"Authorization": f"Bearer {secret}"})

    def register(self, name: str, labels: dict[str, str], *, devices: list[Device] | None = None,
                 topology: bool = True) -> None:
        """What an agent sends at start: the host appears with its labels and (optionally) topology."""
        body: dict[str, Any] = {
            # Nothing listens on port 9 here: whatever dials the agent fails fast.
            "name": name, "address": "127.0.0.1:9", "labels": labels,
            "facts": {"kernel": "6.1.0", "agent_version": "0.1.0", "boot_id": "boot-1"},
        }
        if topology:
            topo = Topology(hostname=name, kernel="6.1.0",
                            devices=devices if devices is not None else [raid_volume()])
            body["topology"] = topo.model_dump(mode="json")
        with self.http() as http:
            response = http.post("/agents/register", json=body)
            assert response.status_code == 200, response.text

    def profiles(self) -> dict[str, dict[str, Any]]:
        with self.http() as http:
            items = http.get("/profiles").json()["items"]
        return {p["metadata"]["name"]: p for p in items}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def control_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    # The API is the real one; the reconciler is held back (a RecordingController) so host status
    # changes only when a test says so, and outputs compared within a test cannot move under it.
    app = create_app(Settings(db_url=f"sqlite:///{tmp_path / 'control-plane.db'}"),
                     controller=RecordingController())
    yield from serve(app)


def serve(app: FastAPI) -> Iterator[ControlPlane]:
    """Serve ``app`` with uvicorn on 127.0.0.1 in a thread until the generator is closed."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound here and handed over: no race for the port
    port = sock.getsockname()[1]
    server = serving.Server(app, log_level="warning", lifespan="on")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert thread.is_alive(), "the control plane exited during startup"
            assert time.monotonic() < deadline, "the control plane did not start within 20s"
            time.sleep(0.02)
        yield ControlPlane(f"http://127.0.0.1:{port}", issue_token(app, Role.ADMIN, name="cli-tests"),
                           lambda role, **kw: issue_token(app, role, **kw))
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        app.state.engine.dispose()


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


Run = Callable[..., Result]


@pytest.fixture
def stortune(control_plane: ControlPlane, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run the CLI in-process against the test's control plane: stortune("get", "hosts"), as an
    admin unless ``token=`` says otherwise (None: no token)."""
    capsys.readouterr()

    def run(*args: str, server: str | None = control_plane.url,
            token: str | None = control_plane.admin_token) -> Result:
        code = main([*args, *(["--server", server] if server else []),
                     *(["--token", token] if token else [])])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def profile_yaml(name: str, *, selector: str = "{matchLabels: {role: streamer}}", read_ahead_kb: int = 4096,
                 labels: str = "{}", mode: str = "enforce", extra_metadata: str = "") -> str:
    """One StorageProfile document; ``extra_metadata`` is YAML lines at the metadata level."""
    return "\n".join([
        "apiVersion: stortune/v1",
        "kind: StorageProfile",
        "metadata:",
        f"  name: {name}",
        f"  labels: {labels}",
        *([f"  {extra_metadata}"] if extra_metadata else []),
        "spec:",
        f"  hostSelector: {selector}",
        "  priority: 10",
        f"  mode: {mode}",
        "  rules:",
        "    - name: raid-volumes",
        "      match: {kind: [disk], rotational: true}",
        f"      settings: {{read_ahead_kb: {read_ahead_kb}}}",
    ]) + "\n"
