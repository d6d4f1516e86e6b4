"""Profiles an earlier version stored and this one refuses (a pattern only Python's ``re`` ran).

Upgrading the control plane does not rewrite them; until someone replaces or deletes them, the
hosts they select are held (nothing planned, nothing applied, nothing put back, a condition saying
why) and every other host, dry run and diff works as before. Runs on SQLite and PostgreSQL, with the
real reconciler and agents faked at the gRPC seam.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import update

from stortune.server.agentclient import FakeAgentClient, FakeAgentClients, HostInfo
from stortune.server.db.tables import Profile
from stortune.server.services.versions import next_resource_version
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, TestClient, admin_client

PROFILES = f"{API}/profiles"
#: What Python's re ran and RE2 refuses: a lookahead.
PYTHON_ONLY = "QEMU(?= HARDDISK).*"


@pytest.fixture
def agents() -> FakeAgentClients:
    fakes = FakeAgentClients()
    for name in ("h1", "h2"):
        fakes.add(FakeAgentClient(address=f"{name}.example:7443", topology=loop_topology(name),
                                  info=HostInfo(hostname=name, kernel="6.1.0", boot_id="boot-1",
                                                agent_version="fake")))
    return fakes


@pytest.fixture
def app(make_app: AppFactory, agents: FakeAgentClients) -> FastAPI:
    return make_app(agents=agents, reconcile_interval_s=0.5)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with admin_client(app) as test_client:
        yield test_client


def read_ahead(agents: FakeAgentClients, host: str) -> Any:
    loop = agents.agents[f"{host}.example:7443"].topology.device("loop0")
    assert loop is not None
    return loop.tunables["read_ahead_kb"].value


def applied(client: TestClient, host: str) -> tuple[str, str, str]:
    found = next(c for c in client.get(f"{API}/hosts/{host}/status").json()["conditions"]
                 if c["type"] == "Applied")
    return found["status"], found["reason"], found["message"]


def stored_by_an_earlier_version(app: FastAPI, name: str, model: str) -> None:
    """What the upgrade leaves: the row as the earlier version validated it, a pattern RE2 refuses."""
    with app.state.sessions() as session:
        # The write lock first, as the services do: on SQLite a transaction that read and then
        # writes fails once the reconciler or the rollout driver committed in between.
        next_resource_version(session)
        row = session.get(Profile, name)
        assert row is not None
        spec = dict(row.spec)
        spec["rules"] = [{**spec["rules"][0], "match": {**spec["rules"][0]["match"], "model": model}}]
        session.execute(update(Profile).where(Profile.name == name).values(spec=spec))
        session.commit()


@pytest.fixture
def fleet(client: TestClient, agents: FakeAgentClients, eventually: Eventually) -> None:
    """h1 runs 'streaming' (role streamer), h2 runs 'batch' (role batch); both converged."""
    client.post(f"{API}/agents/register", json=registration("h1", labels={"role": "streamer"}))
    client.post(f"{API}/agents/register", json=registration("h2", labels={"role": "batch"}))
    assert client.post(PROFILES, json=profile_doc("streaming")).status_code == 201
    batch = profile_doc("batch", selector={"matchLabels": {"role": "batch"}},
                        settings={"read_ahead_kb": 1024})
    assert client.post(PROFILES, json=batch).status_code == 201
    eventually(lambda: read_ahead(agents, "h1") == 4096 and read_ahead(agents, "h2") == 1024
                   and applied(client, "h1")[0] == applied(client, "h2")[0] == "True", what="both applied")


@pytest.mark.usefixtures("fleet")
def test_hostile_a_stored_pattern_re2_refuses_holds_its_hosts_and_says_why(
    app: FastAPI, client: TestClient, agents: FakeAgentClients, eventually: Eventually,
    caplog: pytest.LogCaptureFixture,
) -> None:
    h1 = agents.agents["h1.example:7443"]
    applies = sum(m == "apply" for m, _ in list(h1.calls))
    stored_by_an_earlier_version(app, "streaming", PYTHON_ONLY)

    status, _, message = eventually(lambda: (c := applied(client, "h1"))[1] == "InvalidProfile" and c,
                                         what="h1 held for the profile")
    assert status == "False"
    assert "streaming: spec.rules[0].match.model: not a regular expression RE2 can run" in message
    assert message.endswith("replace (PUT) or delete them")
    # Held: nothing applied there, and above all nothing of the profile's put back.
    assert sum(m == "apply" for m, _ in list(h1.calls)) == applies and read_ahead(agents, "h1") == 4096
    assert [e["reason"] for e in client.get(f"{API}/events", params={"host": "h1"}).json()["items"]
            ].count("InvalidProfile") == 1
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "no traceback loop"

    # Every other host is reconciled as before: drift on h2 is corrected.
    loop = agents.agents["h2.example:7443"].topology.device("loop0")
    assert loop is not None
    loop.tunables["read_ahead_kb"].value = 128
    eventually(lambda: read_ahead(agents, "h2") == 1024, what="h2's drift corrected")


def test_hostile_a_stored_pattern_re2_refuses_fails_only_the_dry_runs_it_takes_part_in(
    app: FastAPI, client: TestClient, fleet: None,
) -> None:
    stored_by_an_earlier_version(app, "streaming", PYTHON_ONLY)
    elsewhere = profile_doc("more-batch", selector={"matchLabels": {"role": "batch"}})
    assert client.post(f"{PROFILES}?dryRun=All", json=elsewhere).status_code == 200
    assert client.post(f"{API}/plans", json={"profiles": [elsewhere]}).status_code == 200

    # A dry run that would plan h1 cannot leave 'streaming' out: 409 naming it and its field.
    alongside = profile_doc("more-streaming", settings={"scheduler": "mq-deadline"})
    for response in (client.post(f"{PROFILES}?dryRun=All", json=alongside),
                     client.post(f"{API}/plans", json={"profiles": [alongside]})):
        assert response.status_code == 409, response.text
        body = response.json()
        assert body["details"]["name"] == "streaming"
        assert body["details"]["causes"][0]["field"] == "spec.rules[0].match.model"
        assert "replace it (PUT" in body["message"]

    # Its replacement and deletion are planned without reading it.
    assert client.put(f"{PROFILES}/streaming?dryRun=All", json=profile_doc("streaming")).status_code == 200
    response = client.delete(f"{PROFILES}/streaming?dryRun=All")
    assert response.status_code == 200
    assert response.json()["plans"]["h1"]["restorations"][0]["desired"] == 128
    # A diagnostics bundle of h1 still shows it, as stored.
    assert client.get(f"{API}/hosts/h1/diagnostics").status_code == 200


def test_replacing_a_stored_profile_re2_refuses_releases_its_hosts(
    app: FastAPI, client: TestClient, agents: FakeAgentClients, eventually: Eventually, fleet: None,
) -> None:
    stored_by_an_earlier_version(app, "streaming", PYTHON_ONLY)
    eventually(lambda: applied(client, "h1")[1] == "InvalidProfile", what="h1 held")
    rewritten = profile_doc("streaming", settings={"read_ahead_kb": 8192})
    assert client.put(f"{PROFILES}/streaming", json=rewritten).status_code == 200
    eventually(lambda: read_ahead(agents, "h1") == 8192 and applied(client, "h1")[:2] == ("True", "Applied"),
               what="h1 converged on the replacement")
