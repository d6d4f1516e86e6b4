"""Every route under /api/v1 (and /metrics) with every role: allowed -> 2xx, otherwise 403; bad tokens -> 401.

TABLE is the specification, written out by hand: a route that is not in it
fails test_every_api_route_is_in_the_table, so a new route cannot ship
without someone deciding who may call it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.api.agent import tls
from stortune.schemas.bundle import Bundle, BundleInfo, pack
from stortune.server.api.security import api_routes
from stortune.server.auth import Role
from tests.server.benchfakes import finished_run, queued_run, streamers
from tests.server.builders import API, keyed, loop_topology, profile_doc, registration
from tests.server.support import FakeClock, TestClient, admin_client, bearer, issue_token
from tests.server.tunefakes import experiment_doc

ADMIN, OPERATOR, VIEWER, SUPPORT, AGENT, METRICS = (r.value for r in Role)
ROLES = [r.value for r in Role]
READERS = frozenset({ADMIN, OPERATOR, VIEWER})
HOST_READERS = READERS | {SUPPORT}
WRITERS = frozenset({ADMIN, OPERATOR})
AGENTS = frozenset({ADMIN, AGENT})
ADMINS = frozenset({ADMIN})
SUPPORT_HOSTS = "role=streamer"  # h1 is a streamer: inside the support token's reach

PUBLIC = {("GET", "/healthz"), ("GET", "/livez"), ("GET", "/openapi.json"), ("GET", "/docs"),
          ("GET", "/docs/assets/{name}"), ("GET", "/redoc"),
          # The dashboard's page and assets: code, no data (it signs in through /api/v1/session).
          ("GET", "/ui"), ("GET", "/ui/"), ("GET", "/ui/assets/{name}")}


@dataclass
class World:
    """A control plane with a profile and a registered host, and an admin to prepare more."""

    admin: TestClient
    made: dict[str, str] = field(default_factory=dict)
    app: FastAPI | None = None

    def profile(self, name: str) -> str:
        assert self.admin.post(f"{API}/profiles", json=profile_doc(name)).status_code == 201
        return name

    def rollout(self, name: str) -> str:
        """A profile selecting h1: creating it starts its rollout (h1's read-ahead changes)."""
        self.profile(name)
        assert self.admin.get(f"{API}/profiles/{name}/rollout").status_code == 200
        return name

    def host(self, name: str, labels: dict[str, str] | None = None) -> str:
        body = registration(name, labels=labels, topology=loop_topology(name))
        assert self.admin.post(f"{API}/agents/register", json=body, headers=keyed(name)).status_code == 200
        return name

    def token(self, name: str) -> str:
        """A viewer token's id."""
        created = self.admin.post(f"{API}/tokens", json={"role": VIEWER, "name": name})
        assert created.status_code == 201, created.text
        return str(created.json()["id"])

    def run(self, tag: str) -> str:
        """A finished benchmark run on h1 (stored as its agent would have sent it)."""
        assert self.app is not None
        return finished_run(self.app, "h1", streamers(f"r-{tag}"))

    def queued_run(self, tag: str) -> str:
        assert self.app is not None
        return queued_run(self.app, "h1", streamers(f"q-{tag}"))

    def baseline(self, tag: str) -> str:
        put = self.admin.put(f"{API}/benchmarks/baselines/b-{tag}", json={"run": self.run(tag)})
        assert put.status_code == 201, put.text
        return f"b-{tag}"

    def schedule(self, tag: str) -> str:
        created = self.admin.post(f"{API}/benchmarks/schedules", json=schedule(f"s-{tag}"))
        assert created.status_code == 201, created.text
        return f"s-{tag}"

    def probe(self, *, running: bool = False) -> str:
        """A probe of h1 started through the API; finished on the fake agent unless ``running``."""
        from stortune.api.agent.wire import BenchmarkProgress

        assert self.app is not None
        agent = self.app.state.agents.for_address("h1.example:7443")
        self.settle_probes()
        started = self.admin.post(f"{API}/hosts/h1/probes", json={"consent": True})
        assert started.status_code == 201, started.text
        pid = str(started.json()["id"])
        if not running:
            agent.benchmarks[pid].append(BenchmarkProgress(run_id=pid, state="done", percent=100.0))
        return pid

    def settle_probes(self) -> None:
        """End every probe the fake agent runs: one probe holds a host at a time."""
        from stortune.api.agent.wire import BenchmarkProgress

        assert self.app is not None
        agent = self.app.state.agents.for_address("h1.example:7443")
        for pid in agent.probes:
            if not agent.benchmarks[pid][-1].finished:
                agent.benchmarks[pid].append(BenchmarkProgress(run_id=pid, state="done", percent=100.0))

    def experiment(self) -> str:
        """A finished experiment on h1 (its agent measures a known surface), made once."""
        if "experiment" not in self.made:
            import time

            from tests.server.tunefakes import SurfaceAgent

            assert self.app is not None
            self.app.state.agents.add(SurfaceAgent(address=registration("h1")["address"],
                                                   topology=loop_topology("h1")))
            created = self.admin.post(f"{API}/experiments", json=experiment_doc())
            assert created.status_code == 201, created.text
            exp_id = str(created.json()["metadata"]["uid"])
            deadline = time.monotonic() + 30
            while self.admin.get(f"{API}/experiments/{exp_id}").json()["status"]["state"] != "done":
                assert time.monotonic() < deadline, "the experiment did not end"
                time.sleep(0.02)
            self.made["experiment"] = exp_id
        return self.made["experiment"]



def schedule(name: str) -> dict[str, Any]:
    return {"apiVersion": "stortune/v1", "kind": "BenchmarkSchedule", "metadata": {"name": name},
            "spec": {"schedule": "0 3 * * *", "benchmark": streamers(name)}}


def csr_for(name: str) -> str:
    return tls.make_csr(tls.new_key(), name).decode()


Request = tuple[str, dict[str, Any]]  # path below /api/v1, httpx keyword arguments


@dataclass(frozen=True)
class Case:
    allowed: frozenset[str]
    # (world, tag) -> the request; tag names what it may create, so every call gets fresh objects
    make: Callable[[World, str], Request]


def fixed(path: str, **kwargs: Any) -> Callable[[World, str], Request]:
    return lambda _world, _tag: (path, kwargs)


TABLE: dict[tuple[str, str], Case] = {
    ("GET", "/profiles"): Case(READERS, fixed("/profiles")),
    ("POST", "/profiles"): Case(WRITERS, lambda w, t: ("/profiles", {"json": profile_doc(f"new-{t}")})),
    ("GET", "/profiles/{name}"): Case(READERS, fixed("/profiles/base")),
    ("PUT", "/profiles/{name}"): Case(WRITERS, lambda w, t: (
        f"/profiles/{w.profile(f'put-{t}')}", {"json": profile_doc(f"put-{t}", priority=5)})),
    ("DELETE", "/profiles/{name}"): Case(WRITERS, lambda w, t: (f"/profiles/{w.profile(f'del-{t}')}", {})),
    # Rollouts: read as profiles are, steered by who may write them (api/routes/rollouts.py).
    ("GET", "/profiles/{name}/rollout"): Case(READERS, lambda w, t: (
        f"/profiles/{w.rollout(f'ro-{t}')}/rollout", {})),
    ("POST", "/profiles/{name}/rollout/pause"): Case(WRITERS, lambda w, t: (
        f"/profiles/{w.rollout(f'rp-{t}')}/rollout/pause", {})),
    ("POST", "/profiles/{name}/rollout/resume"): Case(WRITERS, lambda w, t: (
        f"/profiles/{w.rollout(f'rr-{t}')}/rollout/resume", {})),
    ("POST", "/profiles/{name}/rollout/undo"): Case(WRITERS, lambda w, t: (
        f"/profiles/{w.rollout(f'ru-{t}')}/rollout/undo", {})),
    # The answer to an unknown command (404 naming it); a known one is taken by its own route.
    ("POST", "/profiles/{name}/rollout/{command}"): Case(WRITERS, lambda w, t: (
        f"/profiles/{w.rollout(f'rc-{t}')}/rollout/pause", {})),
    # A dry run plans every host: writers only, as for ?dryRun=All (it needs the right to write).
    ("POST", "/plans"): Case(WRITERS, lambda w, t: ("/plans", {"json": {
        "profiles": [profile_doc(f"plan-{t}")], "delete": [w.profile(f"plan-del-{t}")]}})),
    # Arithmetic over the body alone: every role but the scrape's (which reads /metrics only).
    ("POST", "/raid-plans"): Case(frozenset(ROLES) - {METRICS}, fixed("/raid-plans", json={
        "disks": {"count": 16, "iops": 180}, "workload": {"readPct": 70}})),
    ("GET", "/hosts"): Case(HOST_READERS, fixed("/hosts")),
    ("GET", "/fleet/summary"): Case(HOST_READERS, fixed("/fleet/summary")),
    ("GET", "/hosts/{name}"): Case(HOST_READERS, fixed("/hosts/h1")),
    ("GET", "/hosts/{name}/status"): Case(HOST_READERS, fixed("/hosts/h1/status")),
    ("GET", "/hosts/{name}/lease"): Case(HOST_READERS, fixed("/hosts/h1/lease")),
    ("GET", "/hosts/{name}/topology"): Case(HOST_READERS, fixed("/hosts/h1/topology")),
    ("GET", "/hosts/{name}/analysis"): Case(HOST_READERS, fixed("/hosts/h1/analysis")),
    ("PUT", "/hosts/{name}/labels"): Case(WRITERS, lambda w, t: (
        "/hosts/h1/labels", {"json": {"labels": {"set-by": t}}})),
    ("PATCH", "/hosts/{name}/labels"): Case(WRITERS, lambda w, t: (
        "/hosts/h1/labels", {"json": {"labels": {"patched-by": t}}})),
    ("DELETE", "/hosts/{name}"): Case(ADMINS, lambda w, t: (f"/hosts/{w.host(f'gone-{t}')}", {})),
    ("GET", "/events"): Case(HOST_READERS, fixed("/events")),
    # Agent calls carry the host's key (the agent role may act for an enrolled host only with it).
    ("POST", "/agents/register"): Case(AGENTS, lambda w, t: (
        "/agents/register", {"json": registration(f"reg-{t}"), "headers": keyed(f"reg-{t}")})),
    ("POST", "/agents/{name}/heartbeat"): Case(AGENTS, fixed(
        "/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"}, headers=keyed("h1"))),
    # A topology hash the host has not stored: the watch is answered at once (the topology wanted).
    ("POST", "/agents/{name}/watch"): Case(AGENTS, fixed(
        "/agents/h1/watch", json={"topology_hash": "not-stored", "boot_id": "boot-1"},
        headers=keyed("h1"))),
    # The dashboard's sign-in: the people's roles, never an agent's or a scrape token.
    ("POST", "/session"): Case(HOST_READERS, fixed("/session")),
    ("GET", "/session"): Case(HOST_READERS, fixed("/session")),
    ("DELETE", "/session"): Case(HOST_READERS, fixed("/session")),
    ("POST", "/agents/certificate"): Case(AGENTS, lambda w, t: (
        "/agents/certificate", {"json": {"name": f"cert-{t}", "csr": csr_for(f"cert-{t}")}})),
    ("PUT", "/agents/{name}/topology"): Case(AGENTS, fixed(
        "/agents/h1/topology", json={"topology": loop_topology("h1").model_dump(mode="json")},
        headers=keyed("h1"))),
    ("POST", "/tokens"): Case(ADMINS, lambda w, t: (
        "/tokens", {"json": {"role": VIEWER, "name": f"by-{t}"}})),
    ("GET", "/tokens"): Case(ADMINS, fixed("/tokens")),
    ("GET", "/tokens/{token_id}"): Case(ADMINS, lambda w, t: (f"/tokens/{w.token(f'get-{t}')}", {})),
    ("DELETE", "/tokens/{token_id}"): Case(ADMINS, lambda w, t: (f"/tokens/{w.token(f'del-{t}')}", {})),
    ("GET", "/audit"): Case(ADMINS, fixed("/audit")),
    ("GET", "/hosts/{name}/diagnostics"): Case(ADMINS | {SUPPORT}, fixed("/hosts/h1/diagnostics")),
    ("GET", "/redactions"): Case(ADMINS, fixed("/redactions")),
    # Probes load the host's disks: who may run benchmarks may probe.
    ("POST", "/hosts/{name}/probes"): Case(WRITERS, lambda w, t: (
        w.settle_probes(), ("/hosts/h1/probes", {"json": {"consent": True}}))[1]),
    ("GET", "/hosts/{name}/probes"): Case(HOST_READERS, fixed("/hosts/h1/probes")),
    ("GET", "/hosts/{name}/probes/{probe_id}"): Case(HOST_READERS, lambda w, t: (
        f"/hosts/h1/probes/{w.probe()}", {})),
    ("POST", "/hosts/{name}/probes/{probe_id}/cancel"): Case(WRITERS, lambda w, t: (
        f"/hosts/h1/probes/{w.probe(running=True)}/cancel", {})),
    # Benchmarks: runs of the hosts a support token sees; schedules select across the fleet.
    ("POST", "/benchmarks/runs"): Case(WRITERS, lambda w, t: (
        "/benchmarks/runs", {"json": streamers(f"new-{t}"), "params": {"host": "h1"}})),
    ("GET", "/benchmarks/runs"): Case(HOST_READERS, fixed("/benchmarks/runs")),
    ("GET", "/benchmarks/runs/{run_id}"): Case(HOST_READERS, lambda w, t: (
        f"/benchmarks/runs/{w.run(t)}", {})),
    ("GET", "/benchmarks/runs/{run_id}/raw"): Case(HOST_READERS, lambda w, t: (
        f"/benchmarks/runs/{w.run(t)}/raw", {})),
    ("GET", "/benchmarks/runs/{run_id}/judgement"): Case(HOST_READERS, lambda w, t: (
        f"/benchmarks/runs/{w.run(t)}/judgement", {})),
    ("GET", "/benchmarks/runs/{run_id}/plot"): Case(HOST_READERS, lambda w, t: (
        f"/benchmarks/runs/{w.run(t)}/plot", {"params": {"format": "svg"}})),
    ("POST", "/benchmarks/runs/{run_id}/cancel"): Case(WRITERS, lambda w, t: (
        f"/benchmarks/runs/{w.queued_run(t)}/cancel", {})),
    ("GET", "/benchmarks/compare"): Case(HOST_READERS, lambda w, t: (
        "/benchmarks/compare", {"params": {"a": w.run(t), "b": w.run(t)}})),
    ("GET", "/benchmarks/compare/plot"): Case(HOST_READERS, lambda w, t: (
        "/benchmarks/compare/plot", {"params": {"a": w.run(t), "b": w.run(t), "format": "svg"}})),
    ("GET", "/benchmarks/baselines"): Case(HOST_READERS, fixed("/benchmarks/baselines")),
    ("GET", "/benchmarks/baselines/{name}"): Case(HOST_READERS, lambda w, t: (
        f"/benchmarks/baselines/{w.baseline(t)}", {})),
    ("PUT", "/benchmarks/baselines/{name}"): Case(WRITERS, lambda w, t: (
        f"/benchmarks/baselines/put-{t}", {"json": {"run": w.run(t), "hostSelector": "role=streamer"}})),
    ("DELETE", "/benchmarks/baselines/{name}"): Case(WRITERS, lambda w, t: (
        f"/benchmarks/baselines/{w.baseline(t)}", {})),
    ("GET", "/benchmarks/schedules"): Case(READERS, fixed("/benchmarks/schedules")),
    ("POST", "/benchmarks/schedules"): Case(WRITERS, lambda w, t: (
        "/benchmarks/schedules", {"json": schedule(f"new-{t}")})),
    ("GET", "/benchmarks/schedules/{name}"): Case(READERS, lambda w, t: (
        f"/benchmarks/schedules/{w.schedule(t)}", {})),
    ("PUT", "/benchmarks/schedules/{name}"): Case(WRITERS, lambda w, t: (
        f"/benchmarks/schedules/{w.schedule(t)}", {"json": schedule(f"s-{t}")})),
    ("DELETE", "/benchmarks/schedules/{name}"): Case(WRITERS, lambda w, t: (
        f"/benchmarks/schedules/{w.schedule(t)}", {})),
    # Experiments: the ones all of whose hosts a support token sees (h1 is within its reach).
    ("POST", "/experiments"): Case(WRITERS, lambda w, t: (
        "/experiments", {"json": experiment_doc(f"new-{t}"), "params": {"dryRun": "All"}})),
    ("GET", "/experiments"): Case(HOST_READERS, fixed("/experiments")),
    ("GET", "/experiments/{experiment_id}"): Case(HOST_READERS, lambda w, t: (
        f"/experiments/{w.experiment()}", {})),
    ("POST", "/experiments/{experiment_id}/cancel"): Case(WRITERS, lambda w, t: (
        f"/experiments/{w.experiment()}/cancel", {})),
    ("DELETE", "/experiments/{experiment_id}"): Case(WRITERS, lambda w, t: (
        f"/experiments/{w.experiment()}", {})),
    ("GET", "/experiments/{experiment_id}/charts/{chart}"): Case(HOST_READERS, lambda w, t: (
        f"/experiments/{w.experiment()}/charts/values.svg", {})),
    ("GET", "/experiments/{experiment_id}/profile"): Case(HOST_READERS, lambda w, t: (
        f"/experiments/{w.experiment()}/profile", {})),
}


#: Routes outside /api/v1 that need a token all the same, by their whole path.
OUTSIDE_API: dict[tuple[str, str], Case] = {
    # The Prometheus scrape: the whole fleet's state, so no support token (it sees some hosts).
    ("GET", "/metrics"): Case(READERS | {METRICS}, fixed("/metrics")),
}


def test_every_api_route_is_in_the_table(app: FastAPI) -> None:
    served = {(m, p) for m, p, _ in api_routes(app) if m != "HEAD"}
    api = {(m, p.removeprefix(API)) for m, p in served if p.startswith(API + "/")}
    assert api == set(TABLE), "decide who may call a new route: add it to TABLE"
    outside = served - {(m, API + p) for m, p in api}
    assert outside - set(OUTSIDE_API) == PUBLIC, "only these answer without a token"
    assert set(OUTSIDE_API) <= outside


def test_public_routes_need_no_token(app: FastAPI) -> None:
    from stortune.server.ui import load_assets

    ui_asset = next(name for name in load_assets() if name.endswith(".js"))
    with TestClient(app) as anonymous:
        for _, route in sorted(PUBLIC):
            # An asset /docs loads, one the dashboard loads.
            path = route.replace("/docs/assets/{name}", "/docs/assets/swagger-ui.css")
            path = path.replace("/ui/assets/{name}", f"/ui/assets/{ui_asset}")
            assert anonymous.get(path).status_code == 200, path


@pytest.fixture
def world(app: FastAPI, clock: FakeClock) -> Iterator[World]:
    with admin_client(app) as admin:
        w = World(admin, app=app)
        w.profile("base")
        w.host("h1", {"role": "streamer"})
        # What h1's agent answers to a diagnostics request (the agent client is the fake seam).
        bundle = Bundle(info=BundleInfo(collector="tests", created=clock(), host="h1"))
        bundle.add("topology.json", loop_topology("h1").model_dump_json(), source="generated",
                   origin="discovery")
        app.state.agents.for_address("h1.example:7443").diagnostics = pack(bundle)
        yield w


@pytest.mark.parametrize("route", sorted(TABLE) + sorted(OUTSIDE_API), ids=lambda r: f"{r[0]} {r[1]}")
def test_each_role_gets_what_its_role_allows(
    route: tuple[str, str], app: FastAPI, world: World, clock: FakeClock,
) -> None:
    method, _ = route
    case = OUTSIDE_API.get(route) or TABLE[route]
    base = "" if route in OUTSIDE_API else API
    tokens = {role: issue_token(app, role, hosts=SUPPORT_HOSTS if role == SUPPORT else None,
                                expires_in="72h" if role == SUPPORT else None) for role in ROLES}
    with TestClient(app) as anonymous:
        # Refused before anything happens: no, a malformed, an unknown, a revoked or an expired token.
        expiring = issue_token(app, VIEWER, expires_in="60s")
        revoked = issue_token(app, VIEWER, name="to-revoke")
        revoked_id = next(t["id"] for t in world.admin.get(f"{API}/tokens").json()["items"]
                          if t["name"] == "to-revoke")
        assert world.admin.delete(f"{API}/tokens/{revoked_id}").status_code == 200
        clock.advance(61)
        path, kwargs = case.make(world, "refused")
        for headers in ({}, {"Authorization": "Basic dXNlcjpwYXNz"}, bearer("stt_" + "x" * 43),
                        bearer(revoked), bearer(expiring)):
            response = anonymous.request(method, base + path, **{**kwargs, "headers": {
                **kwargs.get("headers", {}), **headers}})
            assert response.status_code == 401, (headers, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.json()["reason"] == "Unauthorized"

        for role in ROLES:
            path, kwargs = case.make(world, role)
            response = anonymous.request(method, base + path, **{**kwargs, "headers": {
                **kwargs.get("headers", {}), **bearer(tokens[role])}})
            if role in case.allowed:
                assert 200 <= response.status_code < 300, (role, response.text)
            else:
                assert response.status_code == 403, (role, response.text)
                assert response.json()["reason"] == "Forbidden"
                assert f"role {role}" in response.json()["message"]


def test_a_route_without_a_permission_is_refused_at_build_time(app: FastAPI) -> None:
    from fastapi import APIRouter

    from stortune.server.api.security import check_routes

    router = APIRouter(prefix=f"{API}/forgotten")

    @router.get("")
    def forgotten() -> dict[str, str]:
        return {}

    app.include_router(router)
    with pytest.raises(RuntimeError, match=r"GET /api/v1/forgotten"):
        check_routes(app, API)


def test_the_openapi_document_says_how_to_authenticate(app: FastAPI) -> None:
    with TestClient(app) as anonymous:
        schema = anonymous.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    operation = schema["paths"][f"{API}/profiles"]["post"]
    assert operation["security"] == [{"HTTPBearer": []}]
    assert {"401", "403", "422", "429"} <= set(operation["responses"])
    assert "security" not in schema["paths"]["/healthz"]["get"]
