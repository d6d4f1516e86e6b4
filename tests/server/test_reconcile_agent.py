"""The reconciler with the real agent: gRPC on loopback, a fixture sysfs tree for a host.

Everything goes through the public surfaces: the host registers over REST
with the agent's address, the profile is created over REST, and the value
lands in the fixture file the agent writes.
"""

from __future__ import annotations

from stortune.agent.serve import Agent
from stortune.server.agentclient import AgentClients, Timeouts
from tests.fixtures.agent_host import BOOT_ID, Host
from tests.server.builders import API, profile_doc
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, admin_client


def test_profile_reaches_the_real_agent_and_goes_away_again(
    make_app: AppFactory, agent: Agent, host: Host, eventually: Eventually,
) -> None:
    agents = AgentClients(timeouts=Timeouts(read=5, apply=10))
    app = make_app(agents=agents, reconcile_interval_s=0.5)
    with admin_client(app) as client:
        registered = client.post(f"{API}/agents/register", json={
            "name": "rpc-host", "address": agent.address, "labels": {"role": "streamer"},
            "facts": {"boot_id": BOOT_ID}})
        assert registered.status_code == 200, registered.text
        assert client.post(f"{API}/profiles", json=profile_doc()).status_code == 201

        def ready() -> bool:
            st = client.get(f"{API}/hosts/rpc-host/status").json()
            ready = next(c for c in st["conditions"] if c["type"] == "Ready")
            return bool(st["appliedGenerations"] == {"streaming": 1} and ready["status"] == "True")

        eventually(ready, what="rpc-host Ready with streaming applied")
        assert host.queue("read_ahead_kb") == "4096"
        st = client.get(f"{API}/hosts/rpc-host/status").json()
        assert [(d["device"], d["observed"], d["inSync"]) for d in st["devices"]] == [("loop7", 4096, True)]
        assert st["checkedBootId"] == BOOT_ID

        assert client.delete(f"{API}/profiles/streaming").status_code == 202
        eventually(lambda: client.get(f"{API}/profiles/streaming").status_code == 404,
                   what="the profile finalized")
        assert host.queue("read_ahead_kb") == "128"  # the original, from the agent's journal
