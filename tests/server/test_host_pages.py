"""The host list in pages (?limit=, ?continue=), filtered by condition, and the fleet's counts."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.server.services import hosts
from tests.server.builders import API, registration
from tests.server.support import FakeClock, TestClient, admin_client, bearer, issue_token

HOSTS = f"{API}/hosts"
SUMMARY = f"{API}/fleet/summary"


def _enroll(app: FastAPI, names: list[str], role: str = "web") -> None:
    with admin_client(app) as client:
        for name in names:
            response = client.post(f"{API}/agents/register", json=registration(name, labels={"role": role}))
            assert response.status_code == 200, response.text


def _drifted(app: FastAPI, clock: FakeClock, *names: str) -> None:
    """As the reconciler writes it: the host's Drifted condition True."""
    with app.state.sessions() as session:
        for name in names:
            hosts.write_status(session, name, now=clock(), conditions=[
                ("Drifted", "True", "SettingsChanged", "read_ahead_kb 128 -> 4096")])


def _names(body: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in body["items"]]


def _all_pages(client: TestClient, query: str, limit: int) -> tuple[list[list[str]], list[int]]:
    pages, remaining = [], []
    url = f"{HOSTS}?limit={limit}{query}"
    while True:
        response = client.get(url)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append(_names(body))
        remaining.append(body["metadata"]["remainingItemCount"])
        token = body["metadata"].get("continue")
        if token is None:
            return pages, remaining
        url = f"{HOSTS}?limit={limit}&continue={token}{query}"


@pytest.fixture
def fleet(app: FastAPI, clock: FakeClock) -> list[str]:
    names = [f"h{i:02d}" for i in range(25)]
    _enroll(app, names[:20], role="web")
    _enroll(app, names[20:], role="db")
    _drifted(app, clock, "h03", "h07", "h21")
    return names


# -- hostile first ---------------------------------------------------------------------------

@pytest.mark.parametrize("token", [
    "!!!", "bm90IGpzb24",  # base64 of "not json"
    base64.urlsafe_b64encode(b"[1,2]").decode(),
    base64.urlsafe_b64encode(json.dumps({"v": 99, "after": "h1"}).encode()).decode(),
    base64.urlsafe_b64encode(json.dumps({"v": 1, "after": 7}).encode()).decode(),
    "\u00e9t\u00e9",
], ids=["not-base64", "not-json", "a-list", "another-version", "not-a-name", "non-ascii"])
def test_hostile_continue_tokens_are_refused_naming_continue(client: TestClient, token: str) -> None:
    response = client.get(HOSTS, params={"limit": 5, "continue": token})
    assert response.status_code == 422, response.text
    assert response.json()["details"]["causes"][0]["field"] == "continue"


def test_hostile_a_continue_token_without_a_limit_or_too_long_is_refused(client: TestClient,
                                                                        fleet: list[str]) -> None:
    token = client.get(HOSTS, params={"limit": 5}).json()["metadata"]["continue"]
    response = client.get(HOSTS, params={"continue": token})
    assert response.status_code == 422 and response.json()["details"]["causes"][0]["field"] == "limit"
    response = client.get(HOSTS, params={"limit": 5, "continue": "A" * 10_000})
    assert response.status_code == 422 and "continue" in response.text


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "x", "1e3", "99999999999999999999999"])
def test_hostile_limits_are_refused_naming_limit(client: TestClient, limit: str) -> None:
    response = client.get(HOSTS, params={"limit": limit})
    assert response.status_code == 422, response.text
    assert "limit" in response.text


@pytest.mark.parametrize("conditions", [
    ["Drifted"], ["Drifted=Maybe"], ["=True"], ["Drifted=true"], ["Dr ifted=True"], ["(a+)+$=True"],
    ["Drifted=True" + "x" * 10_000], [f"C{i}=True" for i in range(9)],
], ids=["no-status", "bad-status", "no-type", "lower-case", "space", "pattern", "huge", "too-many"])
def test_hostile_condition_filters_are_refused_naming_condition(client: TestClient,
                                                                conditions: list[str]) -> None:
    for url in (HOSTS, SUMMARY):
        response = client.get(url, params={"condition": conditions, "limit": 5})
        assert response.status_code == 422, (url, response.text)
        assert "condition" in response.text


# -- pages -----------------------------------------------------------------------------------

def test_pages_cover_every_host_once_in_name_order(client: TestClient, fleet: list[str]) -> None:
    pages, remaining = _all_pages(client, "", limit=10)
    assert pages == [fleet[:10], fleet[10:20], fleet[20:]]
    assert remaining == [15, 5, 0]
    unpaged = client.get(HOSTS).json()
    assert _names(unpaged) == fleet
    assert "continue" not in unpaged["metadata"] and "remainingItemCount" not in unpaged["metadata"]


def test_a_host_added_or_deleted_between_pages_shows_where_it_sorts(
        app: FastAPI, client: TestClient, fleet: list[str]) -> None:
    first = client.get(HOSTS, params={"limit": 10}).json()
    token = first["metadata"]["continue"]
    _enroll(app, ["h05a", "h15a"])  # one sorts into the page already read, one into the next
    assert client.delete(f"{HOSTS}/h12").status_code == 200
    second = client.get(HOSTS, params={"limit": 10, "continue": token}).json()
    assert _names(second) == ["h10", "h11", "h13", "h14", "h15", "h15a", "h16", "h17", "h18", "h19"]


def test_the_condition_filter_and_the_selector_page_together(client: TestClient, fleet: list[str]) -> None:
    pages, remaining = _all_pages(client, "&condition=Drifted=True", limit=2)
    assert pages == [["h03", "h07"], ["h21"]] and remaining == [1, 0]
    pages, _ = _all_pages(client, "&condition=Drifted=True&labelSelector=role=db", limit=2)
    assert pages == [["h21"]]
    # A host without the condition yet counts as Unknown, so the three statuses cover the fleet.
    counts = [len(_all_pages(client, f"&condition=Drifted={s}", limit=50)[0][0])
              for s in ("True", "False", "Unknown")]
    assert counts == [3, 0, 22]
    both = client.get(HOSTS, params={"condition": ["Drifted=True", "Reachable=True"], "limit": 50})
    assert _names(both.json()) == ["h03", "h07", "h21"]


def test_a_page_answers_304_until_something_changes(app: FastAPI, client: TestClient, clock: FakeClock,
                                                   fleet: list[str]) -> None:
    first = client.get(HOSTS, params={"limit": 5, "condition": "Drifted=True"})
    etag = first.headers["ETag"]
    again = client.get(HOSTS, params={"limit": 5, "condition": "Drifted=True"},
                       headers={"If-None-Match": etag})
    assert again.status_code == 304
    _drifted(app, clock, "h11")
    changed = client.get(HOSTS, params={"limit": 5, "condition": "Drifted=True"},
                         headers={"If-None-Match": etag})
    assert changed.status_code == 200 and _names(changed.json()) == ["h03", "h07", "h11", "h21"]


def test_a_support_token_pages_and_counts_only_its_hosts(app: FastAPI, fleet: list[str]) -> None:
    secret = issue_token(app, "support", hosts="role=db", expires_in="24h")
    with TestClient(app, headers=bearer(secret)) as support:
        pages, remaining = _all_pages(support, "", limit=3)
        assert pages == [["h20", "h21", "h22"], ["h23", "h24"]] and remaining == [2, 0]
        summary = support.get(SUMMARY).json()
        assert summary["hosts"] == 5 and summary["conditions"]["Drifted"]["True"] == 1


def test_the_fleet_summary_counts_each_condition_status(client: TestClient, fleet: list[str]) -> None:
    body = client.get(SUMMARY).json()
    assert body["kind"] == "FleetSummary" and body["hosts"] == 25
    assert body["conditions"]["Drifted"] == {"True": 3, "False": 0, "Unknown": 22}
    assert body["conditions"]["Reachable"] == {"True": 25, "False": 0, "Unknown": 0}
    assert set(body["conditions"]) == {"Ready", "Reachable", "Applied", "Drifted"}
    web = client.get(SUMMARY, params={"labelSelector": "role=web", "condition": "Drifted=True"}).json()
    assert web["hosts"] == 2
    assert client.get(SUMMARY, params={"labelSelector": "role in (("}).status_code in (400, 422)


def test_the_fleet_summary_counts_the_generations_hosts_applied(app: FastAPI, client: TestClient,
                                                                clock: FakeClock, fleet: list[str]) -> None:
    with app.state.sessions() as session:
        for name, generation in (("h01", 2), ("h02", 3), ("h03", 3)):
            hosts.write_status(session, name, now=clock(), applied_generations={"streaming": generation},
                               conditions=[("Applied", "True", "Applied", f"generation {generation}")])
    body = client.get(SUMMARY).json()
    assert body["appliedGenerations"] == {"streaming": {"2": 1, "3": 2}}
    drifted = client.get(SUMMARY, params={"condition": "Drifted=True"}).json()
    assert drifted["appliedGenerations"] == {"streaming": {"3": 1}}  # h03 is the drifted one
