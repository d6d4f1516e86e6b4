"""GET /api/v1/hosts/{name}/diagnostics: the agent's bundle plus the control plane's view, redacted.

The agent side is the real collector on a fixture PERC streamer with fake tools
printing captured-style output; the agent RPC client is the fake seam handing
that bundle to the route.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.agent.diagnostics import ToolRunner, collect
from stortune.agent.discovery import discover
from stortune.schemas.bundle import pack
from stortune.schemas.topology import Topology
from stortune.server.agentclient import AgentUnreachable, FakeAgentClients
from stortune.server.auth import Role
from tests.agent.test_diagnostics import archive, check_complete, sensitive_values, spellings
from tests.fixtures.diag_hosts import PERC_STREAMER, DiagHost, build
from tests.server.benchfakes import finished_run, streamers
from tests.server.builders import API, profile_doc
from tests.server.support import TestClient, admin_client, bearer, issue_token

HOST = "stream01"
ADDRESS_IP = "10.9.8.7"


class Streamer:
    def __init__(self, diag: DiagHost, topology: Topology, bundle: bytes) -> None:
        self.diag, self.topology, self.bundle = diag, topology, bundle

    def sensitive(self) -> set[str]:
        return sensitive_values(self.diag, self.topology) | {HOST, ADDRESS_IP}


@pytest.fixture
def streamer(tmp_path: Path) -> Streamer:
    fs, bin_dir = build(PERC_STREAMER, tmp_path / "host")
    bundle = collect(fs, tools=ToolRunner([bin_dir], timeout=10),
                     now=datetime(2025, 3, 1, 11, 0, tzinfo=UTC))
    return Streamer(PERC_STREAMER, discover(fs), pack(bundle))


@pytest.fixture
def admin(app: FastAPI, streamer: Streamer) -> Any:
    """An admin client on a control plane where the streamer registered and a profile selects it."""
    agents: FakeAgentClients = app.state.agents
    agents.for_address(f"{ADDRESS_IP}:7443").diagnostics = streamer.bundle
    with admin_client(app) as client:
        registered = client.post(f"{API}/agents/register", json={
            "name": HOST, "address": f"{ADDRESS_IP}:7443", "labels": {"role": "streamer"},
            "facts": {"kernel": "6.1.0", "hostname": HOST},
            "topology_hash": streamer.topology.structure_hash(),
            "topology": streamer.topology.model_dump(mode="json")})
        assert registered.status_code == 200, registered.text
        created = client.post(f"{API}/profiles", json=profile_doc(
            "vod", selector={"matchLabels": {"role": "streamer"}}))
        assert created.status_code == 201, created.text
        yield client


def leaks(files: dict[str, bytes], values: set[str]) -> list[tuple[str, str]]:
    found = []
    for name, body in files.items():
        text = (name + "\n" + body.decode("utf-8", "replace")).lower()
        for value in values:
            if any(form in text for form in spellings(value)):
                found.append((name, value))
    return found


def test_support_gets_a_complete_bundle_with_nothing_of_the_customer_in_it(
        app: FastAPI, admin: Any, streamer: Streamer) -> None:
    support = issue_token(app, Role.SUPPORT, hosts="role=streamer", expires_in="72h")
    with TestClient(app) as client:
        response = client.get(f"{API}/hosts/{HOST}/diagnostics", headers=bearer(support))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/gzip"
    assert response.headers["x-stortune-redacted"] == "true"
    assert HOST not in response.headers["content-disposition"]

    manifest = check_complete(response.content)
    files = archive(response.content)
    paths = {p.split("/", 1)[1] for p in files}
    assert {"control-plane/settings.json", "control-plane/conditions.json", "control-plane/events.json",
            "control-plane/drift.json", "control-plane/profiles.json", "control-plane/benchmarks.json",
            "control-plane/analysis.json", "topology.json"} <= paths
    # The agent's own record of what it ran and missed survives the repacking.
    assert {m["tool"] for m in manifest["missing"]} >= {"nvme", "multipath"}
    assert manifest["redaction"]["masked"]["hostname"]["values"] >= 1
    assert leaks(files, streamer.sensitive()) == []
    # No secret of the control plane travels with it: tokens, private keys.
    everything = b"".join(files.values())
    assert b"stt_" not in everything and b"PRIVATE KEY" not in everything
    assert support.encode() not in everything
    profiles = next(body for name, body in files.items() if name.endswith("control-plane/profiles.json"))
    assert json.loads(profiles)[0]["metadata"]["name"] == "vod"


def test_tokens_are_stable_and_only_admins_can_map_them_back(
        app: FastAPI, admin: Any, streamer: Streamer) -> None:
    first = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    mapping = admin.get(f"{API}/redactions", params={"host": HOST}).json()["items"]
    second = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert first.status_code == second.status_code == 200
    assert admin.get(f"{API}/redactions").json()["items"] == mapping, "no new token the second time"

    wwn = next(d.wwn for d in streamer.topology.devices if d.wwn)
    (row,) = [r for r in mapping if r["value"] == wwn or r["value"].endswith(wwn.removeprefix("naa."))]
    for response in (first, second):
        topology = next(b for n, b in archive(response.content).items() if n.endswith("/topology.json"))
        assert row["token"] in topology.decode()
    looked_up = admin.get(f"{API}/redactions", params={"token": row["token"]}).json()["items"]
    assert [r["kind"] for r in looked_up] == ["wwn"]
    bad = admin.get(f"{API}/redactions", params={"token": "not-a-token\x00"})
    assert bad.status_code == 422 and "token" in bad.text

    support = issue_token(app, Role.SUPPORT, hosts="role=streamer", expires_in="72h")
    with TestClient(app) as client:
        assert client.get(f"{API}/redactions", headers=bearer(support)).status_code == 403


def test_only_admins_may_have_it_in_clear(app: FastAPI, admin: Any, streamer: Streamer) -> None:
    clear = admin.get(f"{API}/hosts/{HOST}/diagnostics", params={"redact": "false"})
    assert clear.status_code == 200
    assert clear.headers["x-stortune-redacted"] == "false"
    assert leaks(archive(clear.content), {HOST}) != []
    support = issue_token(app, Role.SUPPORT, hosts="role=streamer", expires_in="72h")
    with TestClient(app) as client:
        refused = client.get(f"{API}/hosts/{HOST}/diagnostics", params={"redact": "false"},
                             headers=bearer(support))
    assert refused.status_code == 403 and "redacted" in refused.json()["message"]


def test_support_outside_its_selector_sees_no_such_host(app: FastAPI, admin: Any) -> None:
    support = issue_token(app, Role.SUPPORT, hosts="role=database", expires_in="72h")
    with TestClient(app) as client:
        assert client.get(f"{API}/hosts/{HOST}/diagnostics", headers=bearer(support)).status_code == 404


def test_downloads_are_audited_and_rate_limited(app: FastAPI, admin: Any) -> None:
    codes = [admin.get(f"{API}/hosts/{HOST}/diagnostics").status_code for _ in range(8)]
    assert codes[0] == 200 and codes[-1] == 429
    limited = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert int(limited.headers["retry-after"]) > 0
    records = admin.get(f"{API}/audit", params={"method": "GET"}).json()["items"]
    downloads = [r for r in records if r["path"].startswith(f"{API}/hosts/{HOST}/diagnostics")]
    assert {r["code"] for r in downloads} == {200, 429}


def test_an_unreachable_agent_or_a_broken_bundle_is_a_503_with_the_reason(app: FastAPI, admin: Any) -> None:
    agent = app.state.agents.for_address(f"{ADDRESS_IP}:7443")
    agent.fail("collect_diagnostics", AgentUnreachable(agent.address, "connection refused"), times=1)
    response = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert response.status_code == 503 and "connection refused" in response.json()["message"]
    agent.diagnostics = agent.diagnostics[:-100]
    response = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert response.status_code == 503 and "does not verify" in response.json()["message"]


def test_the_bundle_carries_the_latest_benchmark_results(
        app: FastAPI, admin: Any, streamer: Streamer) -> None:
    older = finished_run(app, HOST, streamers("before"))
    newer = finished_run(app, HOST, streamers("after"))
    response = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert response.status_code == 200, response.text
    files = archive(response.content)
    body = next(b for n, b in files.items() if n.endswith("control-plane/benchmarks.json"))
    runs = json.loads(body)
    assert [r["metadata"]["name"] for r in runs] == [newer, older], "newest first"
    result = runs[0]["status"]["result"]
    assert result["state"] == "done" and result["summaries"], "the normalised result, not just the row"
    # The run's context named the host; redacted like everything else.
    assert leaks({"benchmarks.json": body}, {HOST}) == []


def test_a_bundle_redacted_while_another_numbers_the_same_tokens_is_redone(
        app: FastAPI, admin: Any, streamer: Streamer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Redaction runs outside the write lock; when another bundle stored tokens meanwhile
    (same numbers, its own values), this one is redacted again instead of colliding."""
    from stortune.server.db.tables import Redaction
    from stortune.server.services import diagnostics

    real = diagnostics._redacted
    taken: dict[str, str] = {}

    def racing(bundle: Any, mapping: Any, known: Any) -> Any:
        redacted, after = real(bundle, mapping, known)
        if not taken:  # the other bundle commits first, numbering the same new tokens
            with app.state.sessions() as other:
                for kind, tokens in after.values.items():
                    for token in tokens.keys() - mapping.values.get(kind, {}).keys():
                        taken[token] = f"other-{token.lower()}"
                        other.add(Redaction(token=token, kind=kind, value=taken[token], host="elsewhere",
                                            created_at=app.state.clock()))
                other.commit()
        return redacted, after

    monkeypatch.setattr(diagnostics, "_redacted", racing)
    response = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert response.status_code == 200, response.text
    assert taken, "the race happened"
    theirs = admin.get(f"{API}/redactions", params={"host": "elsewhere"}).json()["items"]
    assert {r["token"]: r["value"] for r in theirs} == taken, "theirs kept"
    rows = admin.get(f"{API}/redactions", params={"host": HOST}).json()["items"]
    wwn = next(d.wwn for d in streamer.topology.devices if d.wwn)
    (mine,) = [r for r in rows if r["value"] == wwn or r["value"].endswith(wwn.removeprefix("naa."))]
    assert mine["token"] not in taken
    topology = next(b for n, b in archive(response.content).items() if n.endswith("/topology.json"))
    assert mine["token"] in topology.decode() and leaks(archive(response.content), streamer.sensitive()) == []


def test_hostile_the_boot_id_and_the_agents_loopback_address_are_masked(
        app: FastAPI, streamer: Streamer) -> None:
    boot_id = "0b5e4f3c-1111-4222-8333-444455556666"
    address = "127.0.0.1:47113"  # no hostname or routable IP in it: it was sent in clear
    app.state.agents.for_address(address).diagnostics = streamer.bundle
    with admin_client(app) as client:
        registered = client.post(f"{API}/agents/register", json={
            "name": "loopy", "address": address, "labels": {"role": "streamer"},
            "facts": {"kernel": "6.1.0", "hostname": "loopy", "boot_id": boot_id},
            "topology_hash": streamer.topology.structure_hash(),
            "topology": streamer.topology.model_dump(mode="json")})
        assert registered.status_code == 200, registered.text
        finished_run(app, "loopy", streamers("with-context"))
        response = client.get(f"{API}/hosts/loopy/diagnostics")
        assert response.status_code == 200, response.text
        files = archive(response.content)
        clear = archive(client.get(f"{API}/hosts/loopy/diagnostics", params={"redact": "false"}).content)
        kinds = {r["value"]: r["kind"] for r in client.get(f"{API}/redactions").json()["items"]}
    assert sum(body.count(boot_id.encode()) for body in clear.values()) >= 2  # what was masked
    assert leaks(files, {boot_id, address, "47113"}) == []
    assert kinds[boot_id] == "bootid" and kinds[address] == "address"
    with admin_client(app) as client:
        rows = client.get(f"{API}/redactions").json()["items"]
        token = next(r["token"] for r in rows if r["value"] == address)
        looked_up = client.get(f"{API}/redactions", params={"token": token})
    assert looked_up.status_code == 200 and [r["value"] for r in looked_up.json()["items"]] == [address]


def test_the_filesystem_tokens_can_be_looked_up(app: FastAPI, admin: Any) -> None:
    """The streamer's lsblk names filesystem and partition UUIDs, a label (video) and /srv/video:
    their UUID-, PARTUUID-, LABEL- and MNT- tokens are taken by ?token= like the others (a 422
    when the route knew only the first kinds)."""
    response = admin.get(f"{API}/hosts/{HOST}/diagnostics")
    assert response.status_code == 200, response.text
    assert leaks(archive(response.content), {"video"}) == []
    rows = admin.get(f"{API}/redactions", params={"host": HOST}).json()["items"]
    first = {}
    for row in rows:
        first.setdefault(row["kind"], row)
    assert {"uuid", "partuuid", "label", "mountpoint"} <= set(first)
    assert first["label"]["value"] == "video" and first["mountpoint"]["value"] == "/srv/video"
    for kind in ("uuid", "partuuid", "label", "mountpoint"):
        token = first[kind]["token"]
        looked_up = admin.get(f"{API}/redactions", params={"token": token})
        assert looked_up.status_code == 200, (kind, looked_up.text)
        assert [r["value"] for r in looked_up.json()["items"]] == [first[kind]["value"]]
    for bad in ("MNT-1", "UUID-0001x", "LABEL0001"):
        refused = admin.get(f"{API}/redactions", params={"token": bad})
        assert refused.status_code == 422 and "token" in refused.text, bad
