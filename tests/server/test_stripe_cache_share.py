"""Settings.stripe_cache_ram_share (stortune-server --stripe-cache-ram-share or
$STORTUNE_STRIPE_CACHE_RAM_SHARE): bad values are refused naming where they came from; a share
set changes what the reconciler and dry runs refuse and what the host analysis warns about.

The host is the md RAID5 file server fixture (md126: 5 disks, 31.3 GiB of RAM): a stripe cache of
4096 entries costs 80 MiB, 0.25 % of it."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from stortune.agent.discovery import discover
from stortune.schemas.topology import Topology
from stortune.server import cli as server_cli
from stortune.server.agentclient import FakeAgentClient, FakeAgentClients
from stortune.server.settings import Settings
from tests.fixtures.scenarios import SCENARIOS
from tests.server.builders import API, profile_doc, registration, with_changes
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, TestClient, admin_client

# all-at-once: in waves a refused setting halts the rollout and rolls it back (issue 27).
AT_ONCE = {"strategy": "all-at-once"}
ARRAYS = with_changes(profile_doc("arrays", settings={"stripe_cache_size": 4096}, kinds=("md",)),
                      rollout=AT_ONCE)


@pytest.fixture
def topology(tmp_path: Path) -> Topology:
    return discover(SCENARIOS["md_raid5_fileserver"](tmp_path / "files01"))


@pytest.mark.parametrize("share", [0, -0.25, 1.01, math.nan, math.inf])
def test_the_setting_refuses_what_is_not_a_share(share: float) -> None:
    with pytest.raises(ValidationError, match="stripe_cache_ram_share"):
        Settings(stripe_cache_ram_share=share)


@pytest.mark.parametrize("value", ["0", "1.5", "nan", "a quarter", "-1"])
def test_the_server_refuses_a_bad_share_naming_the_option_or_the_variable(
        value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--insecure", "--state-dir", str(tmp_path)]
    monkeypatch.delenv(server_cli.RAM_SHARE_ENV, raising=False)
    assert server_cli.main([*base, "--stripe-cache-ram-share", value]) == 1
    err = capsys.readouterr().err
    assert "--stripe-cache-ram-share" in err and "more than 0 and at most 1" in err
    monkeypatch.setenv(server_cli.RAM_SHARE_ENV, value)
    assert server_cli.main(base) == 1
    assert f"${server_cli.RAM_SHARE_ENV}" in capsys.readouterr().err
    assert not (tmp_path / "stortune.db").exists()  # refused before anything was made


def test_the_option_wins_over_the_variable_and_both_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(server_cli.RAM_SHARE_ENV, raising=False)
    assert server_cli._ram_share(None) == 0.25
    monkeypatch.setenv(server_cli.RAM_SHARE_ENV, "0.1")
    assert server_cli._ram_share(None) == 0.1
    assert server_cli._ram_share("0.5") == 0.5


def _dry_run(make_app: AppFactory, topology: Topology, **settings: Any) -> dict[str, Any]:
    with admin_client(make_app(**settings)) as client:
        client.post(f"{API}/agents/register", json=registration("files01", topology=topology))
        response = client.post(f"{API}/plans", json={"profiles": [ARRAYS]})
        assert response.status_code == 200, response.text
        plan: dict[str, Any] = response.json()["plans"]["files01"]
        single = client.post(f"{API}/profiles?dryRun=All", json=ARRAYS).json()["plans"]["files01"]
        assert single["rejections"] == plan["rejections"]  # the per-document dry run agrees
        return plan


def test_dry_runs_refuse_the_cache_above_the_share_set(make_app: AppFactory, topology: Topology) -> None:
    refused = _dry_run(make_app, topology, stripe_cache_ram_share=0.001)
    [rejection] = refused["rejections"]
    assert (rejection["device"], rejection["tunable"], rejection["fatal"]) == (
        "md126", "stripe_cache_size", True)
    assert "more than the 0.1 % allowed" in rejection["reason"]
    fits = _dry_run(make_app, topology)
    assert not fits["rejections"]
    assert [(c["device"], c["tunable"]) for c in fits["changes"]] == [("md126", "stripe_cache_size")]


def _stripe_check(client: TestClient) -> dict[str, Any]:
    doc = client.get(f"{API}/hosts/files01/analysis").json()
    md = next(d for d in doc["devices"] if d["device"] == "md126")
    found: dict[str, Any] = next(c for c in md["checks"] if c["code"] == "stripe-cache-ram")
    return found


def test_the_analysis_holds_arrays_to_the_share_set(make_app: AppFactory, topology: Topology) -> None:
    with admin_client(make_app()) as client:
        client.post(f"{API}/agents/register", json=registration("files01", topology=topology))
        assert _stripe_check(client)["severity"] == "info"
    # the fixture's 256 entries cost 5 MiB: 0.016 % of the RAM
    with admin_client(make_app(stripe_cache_ram_share=0.0001)) as client:
        over = _stripe_check(client)
        assert over["severity"] == "warning" and "more than the 0.01 % allowed" in over["message"]


@pytest.fixture
def agents(topology: Topology) -> FakeAgentClients:
    agents = FakeAgentClients()
    agents.add(FakeAgentClient(address="files01.example:7443", topology=topology))
    return agents


@pytest.fixture
def strict(make_app: AppFactory, agents: FakeAgentClients) -> Iterator[TestClient]:
    with admin_client(make_app(agents=agents, reconcile_interval_s=0.5,
                               stripe_cache_ram_share=0.001)) as client:
        yield client


def test_the_reconciler_refuses_the_cache_above_the_share_set(
        strict: TestClient, agents: FakeAgentClients, topology: Topology, eventually: Eventually) -> None:
    strict.post(f"{API}/agents/register", json=registration("files01", topology=topology))
    assert strict.post(f"{API}/profiles", json=ARRAYS).status_code == 201

    def applied() -> tuple[str, str] | None:
        conditions = strict.get(f"{API}/hosts/files01/status").json()["conditions"]
        found = next((c for c in conditions if c["type"] == "Applied"), None)
        return None if found is None else (found["status"], found["reason"])

    eventually(lambda: applied() == ("False", "Rejected"), what="Applied=False, Rejected")
    assert "more than the 0.1 % allowed" in dict(
        (c["type"], c["message"]) for c in strict.get(f"{API}/hosts/files01/status").json()["conditions"]
    )["Applied"]
    agent = agents.agents["files01.example:7443"]
    # The refused cache is not written, though the agent's own share (its default, 25 %) allows it:
    # the host's status and its device agree.
    assert agent.ram_shares and set(agent.ram_shares) == {0.001}  # every apply carried the share
    assert _md_value(agent, "stripe_cache_size") == 256
    events = strict.get(f"{API}/events", params={"limit": "100"}).json()["items"]
    [rejected] = [e for e in events if e["reason"] == "Rejected"]
    assert "more than the 0.1 % allowed" in rejected["message"]


def _md_value(agent: FakeAgentClient, tunable: str) -> object:
    md = agent.topology.device("md126")
    return md.tunables[tunable].value if md is not None else None


def test_the_share_travels_with_the_apply_so_the_agent_does_not_write_what_it_refuses(
        strict: TestClient, agents: FakeAgentClients, topology: Topology, eventually: Eventually) -> None:
    """An apply goes out for the array's other setting: it carries the control plane's share, and
    the agent (allowed 25 % by its own) leaves the cache alone, as the host's status says."""
    strict.post(f"{API}/agents/register", json=registration("files01", topology=topology))
    both = with_changes(profile_doc("arrays", settings={"stripe_cache_size": 4096, "read_ahead_kb": 8192},
                                    kinds=("md",)), rollout=AT_ONCE)
    assert strict.post(f"{API}/profiles", json=both).status_code == 201
    agent = agents.agents["files01.example:7443"]

    def applied() -> dict[str, Any]:
        conditions = strict.get(f"{API}/hosts/files01/status").json()["conditions"]
        return next((c for c in conditions if c["type"] == "Applied"), {})

    eventually(lambda: _md_value(agent, "read_ahead_kb") == 8192 and applied().get("reason") == "Rejected",
               what="read_ahead_kb 8192 applied, the cache rejected")
    assert agent.ram_shares and set(agent.ram_shares) == {0.001}
    assert _md_value(agent, "stripe_cache_size") == 256  # refused by the server: not written
    assert "more than the 0.1 % allowed" in applied()["message"]


def test_without_the_share_the_reconciler_applies_it(
        make_app: AppFactory, agents: FakeAgentClients, topology: Topology, eventually: Eventually) -> None:
    app: FastAPI = make_app(agents=agents, reconcile_interval_s=0.5)
    with admin_client(app) as client:
        client.post(f"{API}/agents/register", json=registration("files01", topology=topology))
        assert client.post(f"{API}/profiles", json=ARRAYS).status_code == 201
        agent = agents.agents["files01.example:7443"]

        def cache() -> object:
            md = agent.topology.device("md126")
            return md.tunables["stripe_cache_size"].value if md is not None else None

        eventually(lambda: cache() == 4096, what="stripe_cache_size 4096 applied")
