"""State survives a restart: a new app on the same database reads it back."""

from __future__ import annotations

from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.support import AppFactory, admin_client


def test_data_persists_across_app_restarts(make_app: AppFactory) -> None:
    first = make_app()
    with admin_client(first) as client:
        created = client.post(f"{API}/profiles", json=profile_doc()).json()
        client.post(f"{API}/agents/register", json=registration(topology=loop_topology()))
        client.put(f"{API}/hosts/h1/labels", json={"labels": {"tier": "gold"}})
        host = client.get(f"{API}/hosts/h1").json()
    first.state.engine.dispose()

    second = make_app()  # migrations run again: a no-op on a current database
    with admin_client(second) as client:
        assert client.get(f"{API}/profiles/streaming").json() == created
        assert client.get(f"{API}/hosts/h1").json() == host
        assert client.get(f"{API}/hosts/h1/topology").json() == loop_topology().model_dump(mode="json")
        # Versions keep counting from where they were.
        again = client.put(f"{API}/profiles/streaming", json=profile_doc(priority=3)).json()
        assert int(again["metadata"]["resourceVersion"]) > int(host["metadata"]["resourceVersion"])
