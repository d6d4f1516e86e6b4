"""A deleted host's agent is not dialled any more.

The channel to an agent re-dials on its own after a failure (with a short reconnect backoff,
agentclient.DEFAULT_CHANNEL_OPTIONS), whether or not anything calls it: a host deleted while
its agent was away was dialled for minutes after. Here the "agent" is a TCP port that accepts
and hangs up, counting every dial; the real reconciler dials it through real gRPC channels.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from stortune.server.agentclient import DEFAULT_CHANNEL_OPTIONS, AgentClients, FakeAgentClients, Timeouts
from stortune.server.services import hosts
from tests.server.builders import API, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, admin_client

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # no database question here
#: A channel re-dials a failed agent at most this far apart (milliseconds) in these tests.
MAX_BACKOFF_MS = 300
QUIET_S = 5 * MAX_BACKOFF_MS / 1000


class Dials:
    """A port that accepts and hangs up, counting connections."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.count = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.count += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dials() -> Iterator[Dials]:
    port = Dials()
    yield port
    port.close()


def quiet_for(dials: Dials, seconds: float, deadline_s: float) -> bool:
    """True once ``seconds`` pass without a dial; False if dials go on until ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        seen = dials.count
        time.sleep(seconds)
        if dials.count == seen:
            return True
    return False


def test_hostile_a_deleted_hosts_agent_is_not_dialled(make_app: AppFactory, dials: Dials,
                                                      eventually: Eventually) -> None:
    options = (*[o for o in DEFAULT_CHANNEL_OPTIONS if "reconnect" not in o[0]],
               ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", MAX_BACKOFF_MS))
    agents = AgentClients(options=options, timeouts=Timeouts(read=1, apply=1))
    app = make_app(agents=agents, reconcile_interval_s=0.5)
    with admin_client(app) as client:
        registered = client.post(f"{API}/agents/register", json={**registration(), "address": dials.address})
        assert registered.status_code == 200
        # The reconciler looked, and the channel keeps re-dialling the agent that hangs up.
        eventually(lambda: dials.count >= 3, what="the reconciler dialling the agent")
        assert not quiet_for(dials, QUIET_S, deadline_s=QUIET_S)  # the control: a live host is dialled
        assert client.delete(f"{API}/hosts/h1").status_code == 200
        assert quiet_for(dials, QUIET_S, deadline_s=10 * QUIET_S), "the deleted host is still dialled"
        assert agents.open_channels() == 0


def test_a_host_deleted_through_another_replica_is_forgotten_by_its_reconciler(
        make_app: AppFactory, eventually: Eventually) -> None:
    """The replica that owns the host learns of the deletion by reconciling it, not by the API call."""
    agents = FakeAgentClients()
    app = make_app(agents=agents, reconcile_interval_s=0.5)
    with admin_client(app) as client:
        client.post(f"{API}/agents/register", json=registration())
        with app.state.sessions() as session:  # as the other replica's DELETE does
            hosts.delete(session, "h1", datetime.now(UTC))
        eventually(lambda: "h1" in agents.forgotten, what="the reconciler forgetting h1's agent")
