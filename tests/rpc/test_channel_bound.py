"""The control plane keeps a bounded number of channels to agents open (a fleet's worth would use
up its open files beside the agents' watches); the least recently used is closed first."""

from __future__ import annotations

import asyncio

from grpc import ChannelConnectivity

from stortune.server.agentclient import AgentClients


def test_the_least_recently_used_channel_is_closed_past_the_bound() -> None:
    async def run() -> None:
        clients = AgentClients(max_channels=2)
        first = clients.stub("127.0.0.1:1", "a")
        clients.stub("127.0.0.1:2", "b")
        assert clients.stub("127.0.0.1:1", "a") is first  # used again: now the most recent
        clients.stub("127.0.0.1:3", "c")  # past the bound: b goes, a stays
        kept = list(clients._channels)
        assert kept == [("127.0.0.1:1", "a"), ("127.0.0.1:3", "c")]
        await asyncio.gather(*clients._closing)
        assert clients.stub("127.0.0.1:1", "a") is first
        channel = clients._channels[("127.0.0.1:3", "c")].channel
        await clients.close()
        assert channel.get_state() is ChannelConnectivity.SHUTDOWN

    asyncio.run(run())
