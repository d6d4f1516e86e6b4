"""Helpers for the agent API tests: profiles and a client; the host and agent fixtures
are in tests/fixtures/agent_host.py."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import yaml

from stortune.schemas.documents import parse_profile
from stortune.schemas.profile import StorageProfile
from stortune.server.agentclient import AgentClients, Timeouts

T = TypeVar("T")


def profile(name: str = "rpc-test", **settings: Any) -> StorageProfile:
    doc = {
        "apiVersion": "stortune/v1", "kind": "StorageProfile", "metadata": {"name": name},
        "spec": {"rules": [{"name": "loops", "match": {"kind": ["loop"]},
                            "settings": settings or {"read_ahead_kb": 4096}}]},
    }
    return parse_profile(yaml.safe_load(yaml.safe_dump(doc)))


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
