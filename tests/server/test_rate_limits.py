"""Per-token rate limits of expensive calls: token buckets, 429 with Retry-After."""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import APIRouter, FastAPI

from stortune.server.api.ratelimit import RateLimited, RateLimiter
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from tests.server.builders import API, loop_topology, profile_doc, registration
from tests.server.support import AppFactory, FakeClock, TestClient, bearer, issue_token


def test_bucket_allows_a_burst_then_the_rate(clock: FakeClock) -> None:
    limiter = RateLimiter()

    def take(key: str = "t1") -> float:
        return limiter.take("dry-run", key, per_minute=6, burst=3, now=clock())

    assert [take() for _ in range(3)] == [0, 0, 0]
    assert take() == 10.0  # one call every 10 s
    assert take("t2") == 0  # another token has its own bucket
    clock.advance(9)
    assert take() == pytest.approx(1.0)
    clock.advance(1)
    assert take() == 0
    clock.advance(3600)  # refills up to the burst, not beyond
    assert [take() for _ in range(4)] == [0, 0, 0, 10.0]


def test_many_tokens_do_not_grow_without_bound(clock: FakeClock) -> None:
    limiter = RateLimiter(max_buckets=10)
    for i in range(100):
        limiter.take("x", f"t{i}", per_minute=60, burst=1, now=clock.advance(1))
    assert len(limiter._buckets) <= 10
    # A bucket still spent survives pruning while its key keeps calling.
    assert limiter.take("x", "t99", per_minute=60, burst=1, now=clock()) > 0


def test_dry_runs_are_rate_limited_per_token(make_app: AppFactory, clock: FakeClock) -> None:
    app = make_app(rate_limits={"dry-run": 4})  # 4 a minute; the burst scales down to 2
    one, other = issue_token(app, "operator"), issue_token(app, "operator")
    with TestClient(app, headers=bearer(one)) as client:
        client.post(f"{API}/agents/register", json=registration("h1", topology=loop_topology()),
                    headers=bearer(issue_token(app, "agent")))
        dry = f"{API}/profiles?dryRun=All"
        assert [client.post(dry, json=profile_doc()).status_code for _ in range(2)] == [200, 200]
        refused = client.post(dry, json=profile_doc())
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "15"
        assert refused.json()["reason"] == "TooManyRequests" and "'dry-run'" in refused.json()["message"]
        assert client.post(dry, json=profile_doc(), headers=bearer(other)).status_code == 200
        assert client.post(f"{API}/profiles", json=profile_doc()).status_code == 201  # not a dry run
        assert client.put(f"{API}/profiles/streaming?dryRun=All", json=profile_doc()).status_code == 429
        clock.advance(15)
        assert client.put(f"{API}/profiles/streaming?dryRun=All", json=profile_doc()).status_code == 200


def test_a_route_can_declare_its_limit(app: FastAPI, clock: FakeClock) -> None:
    """How the diagnostics and benchmark routes will use it: RateLimited(...) on the route."""
    router = APIRouter(prefix=f"{API}/hosts")

    @router.get("/{name}/expensive-example", dependencies=[RateLimited("diagnostics", per_minute=2, burst=1)])
    def expensive(who: Annotated[Principal, Authorized(Permission.READ_HOSTS)]) -> dict[str, bool]:
        return {"ok": True}

    app.include_router(router)
    with TestClient(app, headers=bearer(issue_token(app, "viewer"))) as client:
        url = f"{API}/hosts/h1/expensive-example"
        assert client.get(url).status_code == 200
        refused = client.get(url)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "30"
        clock.advance(30)
        assert client.get(url).status_code == 200


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite is one server
def test_a_rate_limit_holds_across_servers_sharing_the_database(make_app: AppFactory,
                                                                clock: FakeClock) -> None:
    one, two = make_app(rate_limits={"dry-run": 4}), make_app(rate_limits={"dry-run": 4})  # bursts of 2
    token = issue_token(one, "operator")
    dry = f"{API}/profiles?dryRun=All"
    with TestClient(one, headers=bearer(token)) as a, TestClient(two, headers=bearer(token)) as b:
        a.post(f"{API}/agents/register", json=registration("h1", topology=loop_topology()),
               headers=bearer(issue_token(one, "agent")))
        # Alternating servers: the token gets its burst once, not once per server.
        assert [c.post(dry, json=profile_doc()).status_code for c in (a, b, a, b)] == [200, 200, 429, 429]
        refused = b.post(dry, json=profile_doc())
        assert refused.headers["retry-after"] == "15"
        clock.advance(15)
        assert b.post(dry, json=profile_doc()).status_code == 200
        assert a.post(dry, json=profile_doc()).status_code == 429


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_hostile_concurrent_calls_on_two_servers_get_the_burst_exactly(db_url: str, clock: FakeClock) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from stortune.server.api.sharedlimits import SharedRateLimiter
    from stortune.server.db.engine import make_engine
    from stortune.server.db.migrate import upgrade

    engines = [make_engine(db_url) for _ in range(2)]
    try:
        upgrade(engines[0])
        limiters = [SharedRateLimiter(e) for e in engines]
        now = clock()

        def take(i: int) -> float:
            return limiters[i % 2].take("charts", "tok-1", per_minute=60, burst=5, now=now)

        with ThreadPoolExecutor(max_workers=16) as pool:
            waits = list(pool.map(take, range(40)))
        assert waits.count(0.0) == 5  # the row lock serialises the servers: never 5 each
        assert all(w == pytest.approx(1.0) for w in waits if w)
    finally:
        for engine in engines:
            engine.dispose()


@pytest.mark.parametrize(("method", "path", "calls"), [
    ("GET", f"{API}/hosts/h1/diagnostics", 6), ("GET", "/metrics", 30),
    ("POST", f"{API}/benchmarks/runs", 30)])
def test_hostile_a_role_without_the_permission_gets_403_never_429(
        app: FastAPI, method: str, path: str, calls: int) -> None:
    """The rate limit answered before the role check: a bootstrap token hammering a route it may
    not call got 429 (and spent the route's bucket) instead of 403."""
    with TestClient(app, headers=bearer(issue_token(app, "agent"))) as client:
        answers = [client.request(method, path, json={}).status_code for _ in range(calls + 2)]
    assert set(answers) == {403}


def test_the_role_check_comes_before_the_limit_on_a_declared_route(app: FastAPI) -> None:
    router = APIRouter(prefix=f"{API}/hosts")

    @router.get("/{name}/limited-example", dependencies=[RateLimited("diagnostics", per_minute=2, burst=1)])
    def limited(who: Annotated[Principal, Authorized(Permission.READ_AUDIT)]) -> dict[str, bool]:
        return {"ok": True}

    app.include_router(router)
    url = f"{API}/hosts/h1/limited-example"
    with TestClient(app) as client:
        viewer, admin = bearer(issue_token(app, "viewer")), bearer(issue_token(app, "admin"))
        assert [client.get(url, headers=viewer).status_code for _ in range(3)] == [403, 403, 403]
        assert [client.get(url, headers=admin).status_code for _ in range(2)] == [200, 429]
