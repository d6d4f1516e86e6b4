"""Fixtures for the agent API tests: a fixture host, the real agent on loopback, a client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from stortune.agent.kernelfs import KernelFS
from stortune.agent.serve import Agent, ServeOptions
from stortune.schemas.documents import parse_profile
from stortune.schemas.profile import StorageProfile
from stortune.server.agentclient import AgentClients, Timeouts
from tests.fixtures.sysfs_builder import SysfsBuilder

BOOT_ID = "0b5e4f3c-1111-4222-8333-444455556666"
LOOP_ID = "loop:/var/tmp/rpc-test.img"

T = TypeVar("T")


@dataclass
class Host:
    """A fixture host: a loop device (loop7) on a plain-file sysfs tree."""

    root: Path
    fs: KernelFS
    builder: SysfsBuilder

    def queue(self, attr: str, device: str = "loop7") -> str:
        return (self.fs.sysfs / "block" / device / "queue" / attr).read_text().strip()


def build_host(root: Path) -> Host:
    b = SysfsBuilder(root, hostname="rpc-host", kernel="6.1.0-18-amd64")
    b.loop(7, size=131072, backing_file="/var/tmp/rpc-test.img")
    b.write("sys/kernel/random/boot_id", BOOT_ID, base=b.proc)
    return Host(root, b.finish(), b)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return build_host(tmp_path / "host")


def profile(name: str = "rpc-test", **settings: Any) -> StorageProfile:
    doc = {
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": name},
        "spec": {"rules": [{"name": "loops", "match": {"kind": ["loop"]},
                            "settings": settings or {"read_ahead_kb": 4096}}]},
    }
    return parse_profile(yaml.safe_load(yaml.safe_dump(doc)))


@pytest.fixture
def agent(host: Host, tmp_path: Path) -> Iterator[Agent]:
    """The real agent (gRPC API, hot-plug loop), standalone, on 127.0.0.1:<free port>."""
    running = Agent(host.fs, tmp_path / "state",
                    ServeOptions(listen="127.0.0.1:0", rescan_interval=3600, grace=1))
    running.start()
    try:
        yield running
    finally:
        running.stop()


def call(make: Callable[[AgentClients], Awaitable[T]], timeouts: Timeouts | None = None) -> T:
    """Run one client scenario on a fresh event loop with its own channel cache."""

    async def scenario() -> T:
        clients = AgentClients(timeouts=timeouts)
        try:
            return await make(clients)
        finally:
            await clients.close()

    return asyncio.run(scenario())


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
