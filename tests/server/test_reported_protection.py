"""Issue 26, points 6 and 10 on the control plane, with what the host reports: the dry runs of
benchmarks and experiments, and a probe's submission, refuse the devices the agent protects
(swap on zram, a device the host named with --protect-device), not only those holding a default
mount. Before, the uploaded topology carried no swap and no flags: `bench run --dry-run` on a
zram0 used as swap passed and the agent refused the real run.

The topology is the one the agent uploads (HostProtection.report over a fixture host), so the
agent's rule and the control plane's preview are tested together; the agent still refuses
(tests/agent/test_protection.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI

from stortune.agent import local
from stortune.agent.protection import HostProtection
from stortune.schemas.protection import HOW_TO_CHANGE
from stortune.schemas.topology import Topology
from tests.fixtures.sysfs_builder import SysfsBuilder
from tests.server.builders import API, loop_topology, registration
from tests.server.support import TestClient, admin_client
from tests.server.tunefakes import experiment_doc

RUNS = f"{API}/benchmarks/runs"
EXPERIMENTS = f"{API}/experiments"


def _host(tmp_path: Path) -> Topology:
    """/ on loop2, swap on zram0, loop7 named by the host, loop8 free; as the agent reports it."""
    b = SysfsBuilder(tmp_path / "host", hostname="h1")
    _, root = b.loop(2, size=131072, backing_file="/srv/os.img")
    b.loop(7, size=131072, backing_file="/srv/seven.img")
    b.loop(8, size=131072, backing_file="/srv/eight.img")
    b.zram(0, size=131072)
    b.mount(root, "/", "ext4", "/dev/loop2")
    fs = b.finish()
    (fs.procfs / "swaps").write_text("Filename Type Size Used Priority\n/dev/zram0 partition 65532 0 100\n")
    nothing_owned = HostProtection(devices=("loop7",), stat=lambda _path: None, uid=os.geteuid())
    return nothing_owned.report(fs, local.discover(fs))


@pytest.fixture
def client(app: FastAPI, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[TestClient]:
    topology = _host(tmp_path)
    if getattr(request, "param", "") == "older agent":
        topology = topology.model_copy(update={"protected": None})
    with admin_client(app) as client:
        body = registration("h1", topology=topology, topology_hash=topology.structure_hash())
        assert client.post(f"{API}/agents/register", json=body).status_code == 200
        yield client


def _bench(client: TestClient, device: str) -> list[str]:
    doc = {"apiVersion": "stortune/v1", "kind": "BenchmarkSpec", "metadata": {"name": "b"},
           "spec": {"target": {"device": {"name": [device]}},
                    "workloads": [{"preset": "stream-32k", "runtime": "1s"}]}}
    response = client.post(RUNS, json=doc, params={"dryRun": "All", "host": "h1"})
    assert response.status_code == 200, response.text
    refusals: list[str] = response.json()["hosts"][0]["refusals"]
    return refusals


# -- hostile first ---------------------------------------------------------------------------------
def test_hostile_a_bench_dry_run_on_zram_used_as_swap_is_refused_naming_the_reason(
        client: TestClient) -> None:
    assert _bench(client, "zram0") == [
        f"zram0 backs swap (/dev/zram0): a protected device, no benchmark runs on it ({HOW_TO_CHANGE})"]
    assert client.get(RUNS).json()["items"] == []


@pytest.mark.parametrize("query", [{}, {"dryRun": "All"}], ids=["submission", "dry run"])
def test_hostile_an_experiment_on_a_device_the_host_protects_by_flag_is_refused(
        client: TestClient, query: dict[str, str]) -> None:
    doc = experiment_doc(target={"device": {"name": ["loop7"]}})
    response = client.post(EXPERIMENTS, params=query, json=doc)
    assert response.status_code == 422, response.text
    causes = response.json()["details"]["causes"]
    assert [(c["field"], c["message"]) for c in causes] == [(
        "spec.target.device", "on host h1: loop7 is named protected by the host (--protect-device):"
                              f" a protected device, no experiment runs on it ({HOW_TO_CHANGE})")]
    assert client.get(EXPERIMENTS).json()["items"] == []


def test_hostile_a_probe_of_swap_is_refused_at_submission_naming_the_device(client: TestClient) -> None:
    response = client.post(f"{API}/hosts/h1/probes", json={"consent": True, "device": "zram0"})
    assert response.status_code == 422, response.text
    causes = response.json()["details"]["causes"]
    assert [c["field"] for c in causes] == ["device"]
    assert causes[0]["message"].startswith("zram0 backs swap (/dev/zram0): a protected device, no probe")


@pytest.mark.parametrize("client", ["older agent"], indirect=True)
def test_an_agent_that_reports_no_protected_devices_leaves_the_default_mounts(client: TestClient) -> None:
    """An older agent: the preview knows only the default mounts; the agent refuses the rest."""
    assert _bench(client, "loop2")[0].startswith("loop2 holds /: a protected device")
    assert _bench(client, "zram0") == [] and _bench(client, "loop7") == []


def test_a_free_device_of_the_host_is_previewed_without_refusals(client: TestClient) -> None:
    assert _bench(client, "loop8") == []
    assert _bench(client, "loop2")[0].startswith("loop2 holds /: a protected device")
    assert client.get(f"{API}/hosts/h1/topology").json()["protected"] == [
        {"name": "loop2", "id": "loop:/srv/os.img", "reason": "loop2 holds /"},
        {"name": "loop7", "id": "loop:/srv/seven.img",
         "reason": "loop7 is named protected by the host (--protect-device)"},
        {"name": "zram0", "id": "name:zram0", "reason": "zram0 backs swap (/dev/zram0)"}]


@pytest.mark.parametrize(("protected", "field"), [
    ([{"name": "loop0", "id": "name:loop0", "reason": "loop0 holds /\x1b[2J"}],
     "topology.protected[0].reason"),
    ([{"name": "loop0", "id": "name:loop0", "reason": "loop0 holds /"}] * 100_000, "topology.protected"),
], ids=["control characters", "100k entries"])
def test_hostile_a_registration_with_bad_protected_devices_is_refused_naming_the_field(
        app: FastAPI, protected: list[dict[str, str]], field: str) -> None:
    body = registration("h2", topology=loop_topology("h2"))
    body["topology"]["protected"] = protected
    with admin_client(app) as client:
        response = client.post(f"{API}/agents/register", json=body)
        assert response.status_code == 422, response.text
        assert [c["field"] for c in response.json()["details"]["causes"]] == [field]
        assert client.get(f"{API}/hosts/h2").status_code == 404
