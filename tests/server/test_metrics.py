"""/metrics: series names, labels and values after drift, a correction and an unreachable agent;
who may scrape; that no secret and no raw path reaches the scrape.

The reconciler cases run the app's real reconciler against the fake agents (as
test_reconcile.py does, whose helpers they share); the others a RecordingController.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from stortune.server.agentclient import AgentBusy, AgentError, FakeAgentClient, FakeAgentClients
from stortune.server.auth import Role
from stortune.server.metrics.exposition import FleetExposition
from stortune.server.services.fleet_state import FleetState, record_of
from tests.server.builders import API, host_key, keyed, loop_topology, profile_doc, registration, with_changes
from tests.server.conftest import Eventually
from tests.server.support import AppFactory, FakeClock, TestClient, admin_client, bearer, issue_token
from tests.server.test_reconcile import (
    ADDRESS,
    INTERVAL,
    condition,
    events,
    host_info,
    set_value,
    setup_streaming,
)

#: (name, frozenset of label items) -> value
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """The scrape parsed by prometheus-client's own parser: escaping errors fail here."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one series ``name`` whose labels include ``labels``."""
    found = [v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def lint(text: str) -> None:
    """promtool's own checks of the exposition (naming conventions, format)."""
    tool = shutil.which("promtool")
    assert tool is not None, "promtool missing: apt-get install prometheus (./dev test installs it)"
    done = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def scrape(app: FastAPI) -> str:
    with TestClient(app, headers=bearer(issue_token(app, Role.METRICS))) as scraper:
        response = scraper.get("/metrics")  # httpx asks for gzip and unpacks it
    assert response.status_code == 200, response.text
    assert response.headers["content-encoding"] == "gzip"
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return response.text


# -- with the reconciler ------------------------------------------------------------------
@pytest.fixture
def agents() -> FakeAgentClients:
    return FakeAgentClients()


@pytest.fixture
def agent(agents: FakeAgentClients) -> FakeAgentClient:
    return agents.add(FakeAgentClient(address=ADDRESS, topology=loop_topology(), info=host_info()))


@pytest.fixture
def reconciled(make_app: AppFactory, agents: FakeAgentClients) -> FastAPI:
    return make_app(agents=agents, reconcile_interval_s=INTERVAL)


@pytest.fixture
def client(reconciled: FastAPI) -> Iterator[TestClient]:
    with admin_client(reconciled) as test_client:
        yield test_client


def test_drift_and_its_correction_are_counted_and_the_settings_shown(
    reconciled: FastAPI, client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    set_value(agent, 128)
    eventually(lambda: events(client, "Corrected", host="h1"), what="a Corrected event")
    eventually(lambda: condition(client, "Drifted") == ("False", "NoDrift"), what="no drift")
    text = scrape(reconciled)
    lint(text)
    s = parse(text)
    assert sample(s, "stortune_drift_events_total", tunable="read_ahead_kb", cause="runtime") == 1
    assert sample(s, "stortune_correction_events_total", tunable="read_ahead_kb", cause="runtime") == 1
    where = {"host": "h1", "device": "loop0", "tunable": "read_ahead_kb"}
    assert sample(s, "stortune_setting_desired", **where) == 4096
    assert sample(s, "stortune_setting_observed", **where) == 4096
    for status, value in (("true", 0), ("false", 1), ("unknown", 0)):
        assert sample(s, "stortune_host_condition", host="h1", condition="Drifted", status=status) == value
    assert sample(s, "stortune_host_condition", host="h1", condition="Ready", status="true") == 1
    assert sample(s, "stortune_host_info", host="h1", address=ADDRESS, agent_version="0.1.0",
                  kernel="6.1.0") == 1
    assert sample(s, "stortune_host_labels", host="h1", label_role="streamer") == 1
    assert (sample(s, "stortune_reconcile_duration_seconds_count", result="done") or 0) >= 2
    assert sample(s, "stortune_reconcile_queue_depth") is not None
    assert sample(s, "stortune_hosts") == 1


def test_string_settings_are_info_series(
    reconciled: FastAPI, client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    client.post(f"{API}/agents/register", json=registration("h1"))
    # all-at-once: in waves the refused value would halt the rollout and put the host back (issue 27)
    refused = with_changes(profile_doc(settings={"scheduler": "bfq"}), rollout={"strategy": "all-at-once"})
    client.post(f"{API}/profiles", json=refused)
    eventually(lambda: condition(client, "Applied") == ("False", "Rejected"), what="Applied=False")
    s = parse(scrape(reconciled))
    where = {"host": "h1", "device": "loop0", "tunable": "scheduler"}
    assert sample(s, "stortune_setting_desired_info", **where, value="bfq") == 1
    assert sample(s, "stortune_setting_desired", **where) is None  # a string is no gauge value
    assert sample(s, "stortune_host_condition", host="h1", condition="Applied", status="false") == 1


def test_an_unreachable_agent(
    reconciled: FastAPI, client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    agent.unreachable("connection refused")
    eventually(lambda: condition(client, "Reachable") == ("False", "AgentUnreachable"), what="unreachable")
    s = parse(scrape(reconciled))
    assert sample(s, "stortune_host_condition", host="h1", condition="Reachable", status="false") == 1
    assert sample(s, "stortune_host_condition", host="h1", condition="Reachable", status="true") == 0
    assert sample(s, "stortune_host_condition", host="h1", condition="Ready", status="false") == 1
    assert sample(s, "stortune_host_condition_reason", host="h1", condition="Reachable",
                  reason="AgentUnreachable") == 1
    assert (sample(s, "stortune_agent_rpc_errors_total", kind="unreachable") or 0) >= 1


def test_failed_applies_are_counted_by_reason_and_a_busy_agent_is_no_failure(
    reconciled: FastAPI, client: TestClient, agent: FakeAgentClient, eventually: Eventually,
) -> None:
    agent.fail("apply", AgentBusy(ADDRESS, "state directory locked", "ABORTED"), times=1)
    client.post(f"{API}/agents/register", json=registration("h1"))
    client.post(f"{API}/profiles", json=profile_doc())
    eventually(lambda: condition(client, "Applied") == ("True", "Applied"), what="applied after busy")
    agent.fail("apply", AgentError(ADDRESS, "disk on fire", "INTERNAL"))
    assert client.put(f"{API}/profiles/streaming", json=profile_doc(priority=5)).status_code == 200
    eventually(lambda: condition(client, "Applied") == ("False", "ApplyFailed"), what="ApplyFailed")
    s = parse(scrape(reconciled))
    assert (sample(s, "stortune_apply_failures_total", reason="error") or 0) >= 1
    assert sample(s, "stortune_apply_failures_total", reason="busy") is None
    assert sample(s, "stortune_agent_rpc_errors_total", kind="busy") == 1
    assert sample(s, "stortune_host_condition_reason", host="h1", condition="Applied",
                  reason="ApplyFailed") == 1


def test_a_lease_expiry_and_the_heartbeat_that_ends_it(
    reconciled: FastAPI, client: TestClient, agent: FakeAgentClient, clock: FakeClock, eventually: Eventually,
) -> None:
    setup_streaming(client, eventually)
    clock.advance(16)
    eventually(lambda: condition(client, "Reachable") == ("False", "LeaseExpired"), what="lease expired")
    s = parse(scrape(reconciled))
    assert sample(s, "stortune_lease_expiries_total") == 1
    assert sample(s, "stortune_host_condition_reason", host="h1", condition="Reachable",
                  reason="LeaseExpired") == 1
    client.post(f"{API}/agents/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"})
    s = parse(scrape(reconciled))  # the heartbeat's write is seen at once: no stale snapshot
    assert sample(s, "stortune_host_condition", host="h1", condition="Reachable", status="true") == 1
    assert sample(s, "stortune_agent_heartbeats_total") == 1


# -- who may scrape, and what a scrape holds ---------------------------------------------------
def test_a_scrape_without_gzip(app: FastAPI) -> None:
    headers = {**bearer(issue_token(app, Role.VIEWER)), "Accept-Encoding": "identity"}
    with TestClient(app, headers=headers) as plain:
        response = plain.get("/metrics")
    assert "content-encoding" not in response.headers
    assert sample(parse(response.text), "stortune_hosts") == 0


def test_a_scrape_needs_a_token_whose_role_may_read_metrics(app: FastAPI) -> None:
    with TestClient(app) as anonymous:
        assert anonymous.get("/metrics").status_code == 401
        assert anonymous.get("/metrics", headers=bearer("stt_" + "x" * 43)).status_code == 401
        for role in Role:
            response = anonymous.get("/metrics", headers=bearer(issue_token(app, role, **(
                {"hosts": "role=streamer", "expires_in": "72h"} if role is Role.SUPPORT else {}))))
            # Support tokens see some hosts only; the scrape is the whole fleet's.
            allowed = role in (Role.ADMIN, Role.OPERATOR, Role.VIEWER, Role.METRICS)
            assert response.status_code == (200 if allowed else 403), (role, response.text)
    with TestClient(app, headers=bearer(issue_token(app, Role.METRICS))) as scraper:
        assert scraper.get(f"{API}/hosts").status_code == 403  # the scrape role reads nothing else


def test_no_secret_reaches_the_scrape(app: FastAPI) -> None:
    secrets = [issue_token(app, role) for role in (Role.ADMIN, Role.AGENT, Role.VIEWER)]
    with admin_client(app) as admin:
        assert admin.post(f"{API}/agents/register", json=registration("h1"), headers=keyed("h1")
                          ).status_code == 200
        created = admin.post(f"{API}/tokens", json={"role": "metrics", "name": "prometheus"})
        assert created.status_code == 201
        secrets.append(created.json()["token"])
        admin.post(f"{API}/agents/h1/heartbeat", json={"boot_id": "boot-1"}, headers=keyed("h1"))
    text = scrape(app)
    assert "h1" in text
    for secret in [*secrets, host_key("h1")]:
        assert secret not in text
    assert "stt_" not in text
    assert sample(parse(text), "stortune_agent_heartbeats_total") == 1


def test_hostile_label_values_are_escaped(app: FastAPI) -> None:
    kernel = 'evil"} 1\nstortune_hosts{x="\\'
    body = registration("h1")
    body["facts"]["kernel"] = kernel
    with admin_client(app) as admin:
        assert admin.post(f"{API}/agents/register", json=body).status_code == 200
    s = parse(scrape(app))
    assert sample(s, "stortune_host_info", host="h1", kernel=kernel) == 1
    assert sample(s, "stortune_hosts") == 1


def test_requests_are_labelled_by_route_template_not_path(app: FastAPI) -> None:
    names = [f"h-{uuid.uuid4().hex}" for _ in range(20)]
    with admin_client(app) as admin:
        admin.post(f"{API}/agents/register", json=registration("h1"))
        for name in names:
            assert admin.get(f"{API}/hosts/{name}/status").status_code == 404
            assert admin.get(f"/nowhere/{name}").status_code == 404
        admin.get(f"{API}/hosts/h1")  # answered by the cached reads once kept
        admin.get(f"{API}/hosts/h1")
    with TestClient(app) as anonymous:
        anonymous.get(f"{API}/hosts/{names[0]}")  # refused before routing
    text = scrape(app)
    assert not any(name in text for name in names)
    routes = {dict(ls)["route"] for (n, ls), _ in parse(text).items()
              if n == "stortune_http_request_duration_seconds_count"}
    assert routes <= {f"{API}/hosts/{{name}}/status", f"{API}/hosts/{{name}}", f"{API}/agents/register",
                      "(unmatched)", "/metrics"}
    s = parse(text)
    assert sample(s, "stortune_http_request_duration_seconds_count", method="GET",
                  route=f"{API}/hosts/{{name}}/status", code="404") == 20
    assert sample(s, "stortune_http_request_duration_seconds_count", method="GET",
                  route=f"{API}/hosts/{{name}}", code="200") == 2
    assert sample(s, "stortune_http_request_duration_seconds_count", method="GET",
                  route="(unmatched)", code="401") == 1


def test_a_scrape_rereads_only_the_hosts_written_since_the_last(app: FastAPI) -> None:
    fleet = app.state.metrics_fleet.fleet
    with admin_client(app) as admin:
        for name in ("h1", "h2"):
            admin.post(f"{API}/agents/register", json=registration(name))
        assert sample(parse(scrape(app)), "stortune_hosts") == 2
        h1 = fleet.hosts["h1"]
        assert admin.put(f"{API}/hosts/h2/labels", json={"labels": {"rack": "a1"}}).status_code == 200
        s = parse(scrape(app))
    assert fleet.hosts["h1"] is h1  # not read again
    assert sample(s, "stortune_host_labels", host="h2", label_rack="a1") == 1


def test_a_deleted_host_leaves_the_scrape(app: FastAPI) -> None:
    with admin_client(app) as admin:
        for name in ("h1", "h2"):
            admin.post(f"{API}/agents/register", json=registration(name))
        assert sample(parse(scrape(app)), "stortune_hosts") == 2
        assert admin.delete(f"{API}/hosts/h2").status_code == 200
    s = parse(scrape(app))
    assert sample(s, "stortune_hosts") == 1
    assert sample(s, "stortune_host_info", host="h2") is None


def test_label_keys_become_label_names_without_duplicates() -> None:
    fleet = FleetState()
    fleet.put([record_of("h1", version=1, address="a:1", facts={}, status={},
                         labels={"a.b": "dot", "a_b": "underscore", "zone/x": "z"})])
    s = parse(FleetExposition(fleet).render().decode())
    assert sample(s, "stortune_host_labels", host="h1", label_a_b="underscore", label_zone_x="z") == 1


def test_hostile_a_token_scraping_in_a_loop_is_rate_limited(app: FastAPI) -> None:
    # 30 a minute in bursts of 8: a scrape loop gets 429 with Retry-After, not the API's threads.
    with TestClient(app, headers=bearer(issue_token(app, Role.VIEWER))) as looping:
        codes = [looping.get("/metrics").status_code for _ in range(9)]
        refused = looping.get("/metrics")
    assert codes == [200] * 8 + [429]
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "'metrics'" in refused.json()["message"]
    assert scrape(app)  # another token (another Prometheus) still scrapes


def test_a_host_whose_latest_run_is_worse_than_its_baseline_is_a_regression(app: FastAPI) -> None:
    from tests.server.benchfakes import finished_run, steady, streamers

    with admin_client(app) as admin:
        for name in ("h1", "h2"):
            admin.post(f"{API}/agents/register", json=registration(name, topology=loop_topology(name)))
        doc = streamers("stream", repeats=3)
        reference = finished_run(app, "h1", doc, values=steady(1.0))
        assert admin.put(f"{API}/benchmarks/baselines/ref", json={"run": reference}).status_code == 201
        finished_run(app, "h2", doc, values=steady(1.0))  # as fast as the reference
        text = scrape(app)
        lint(text)
        assert sample(parse(text), "stortune_benchmark_regressed", benchmark="stream", host="h2",
                      baseline="ref") == 0
        app.state.metrics_fleet.regressions._at = float("-inf")  # the next scrape judges again now
        finished_run(app, "h2", doc, values=steady(0.6))  # its latest run: 40 % slower
        samples = parse(scrape(app))
    assert sample(samples, "stortune_benchmark_regressed", benchmark="stream", host="h2", baseline="ref") == 1
    assert (sample(samples, "stortune_benchmark_objectives_worse", benchmark="stream", host="h2",
                   baseline="ref") or 0) >= 1


def test_hostile_regression_labels_are_escaped_and_each_verdict_is_one_series() -> None:
    """The API validates these names, but the exposition must not depend on it: a quote, a
    backslash, a newline and injected series text come back intact, as label values."""
    from stortune.server.metrics.exposition import regression_lines
    from stortune.server.services.regressions import Verdict

    evil = 'x"} 1\nstortune_hosts{y="\\'
    text = regression_lines([Verdict(evil, "h1", "ref", "r1", 2), Verdict("b", evil, evil, "r2", 0)])
    samples = parse(text)
    assert sample(samples, "stortune_benchmark_regressed", benchmark=evil, host="h1", baseline="ref") == 1
    assert sample(samples, "stortune_benchmark_objectives_worse", benchmark=evil, host="h1",
                  baseline="ref") == 2
    assert sample(samples, "stortune_benchmark_regressed", benchmark="b", host=evil, baseline=evil) == 0
    assert sample(samples, "stortune_hosts") is None
