"""An agent's corrections cannot flood the control plane or speak for a profile the host does not apply.

A rogue agent holds its own host key, so it may report corrections for its host; before these
bounds, 100 heartbeats of 64 corrections wrote 12,801 event rows, and a correction naming any
profile showed up on that profile's event list. Now: the same (device, tunable, cause) within a
window raises one event's count; past a per-host budget a minute, corrections are counted and
summed up in one event; batches past a per-host rate are not taken at all (the agent sends them
again later); a profile/rule the host does not apply, or a device its topology does not hold,
is recorded on the host only.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import func, select

from stortune.server import cli
from stortune.server.db.tables import Event
from stortune.server.services.corrections import LIMIT
from tests.server.builders import API
from tests.server.support import AppFactory, TestClient, admin_client
from tests.server.test_agent_corrections_api import AGENTS, applying, beat, correction, counted

BUDGET = 5
BATCH = 64


def rows(app: FastAPI) -> int:
    with app.state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Event).where(
            Event.reason.in_(("Drift", "Corrected")))) or 0)


def listed(client: TestClient, **params: str) -> list[dict[str, Any]]:
    items = client.get(f"{API}/events", params={"limit": 1000, **params}).json()["items"]
    return [e for e in reversed(items) if e["reason"] in ("Drift", "Corrected")]


def flood(client: TestClient, beats: int, *, distinct: bool = True) -> list[int | None]:
    """``beats`` heartbeats of 64 corrections each, each on a device of its own when ``distinct``."""
    answers = []
    for b in range(beats):
        items = [correction(b * BATCH + i + 1, device=f"loop{b * BATCH + i if distinct else 0}")
                 for i in range(BATCH)]
        response = client.post(f"{AGENTS}/h1/heartbeat", json=beat(*items))
        assert response.status_code == 200, response.text
        answers.append(response.json()["corrections_recorded"])
    return answers


@pytest.fixture
def budgeted(make_app: AppFactory) -> FastAPI:
    """The budget small, the batch rate out of the way: the budget alone bounds the rows."""
    return make_app(agent_correction_events_per_minute=BUDGET, rate_limits={LIMIT: 1e6})


# -- hostile ------------------------------------------------------------------------------------
def test_hostile_the_reviews_flood_writes_a_bounded_number_of_rows_and_counts_every_correction(
        budgeted: FastAPI) -> None:
    with admin_client(budgeted) as client:
        applying(budgeted, client)
        answers = flood(client, 100)
        assert answers == [BATCH * (b + 1) for b in range(100)]  # all taken: the agent drops them
        # A series (Drift + Corrected) per correction within the budget, then one summary.
        assert rows(budgeted) == 2 * BUDGET + 1
        (summary,) = [e for e in listed(client, host="h1") if "not recorded one by one" in e["message"]]
        assert summary["message"].startswith(f"{100 * BATCH - BUDGET} more setting(s)")
        assert summary["count"] == 100 * BATCH - BUDGET and summary["profile"] is None
    assert counted(budgeted, "stortune_drift_events_total") == 100 * BATCH
    assert counted(budgeted, "stortune_correction_events_total") == 100 * BATCH


def test_hostile_batches_past_the_hosts_rate_are_not_taken_and_not_counted(
        app: FastAPI, client: TestClient) -> None:
    applying(app, client)
    answers = flood(client, 20, distinct=False)  # the fake clock stands still: the burst only
    taken = [a for a in answers if a is not None]
    assert 1 <= len(taken) < 20 and answers[: len(taken)] == taken and answers[len(taken):] == [None] * (
        20 - len(taken))
    assert counted(app, "stortune_drift_events_total") == len(taken) * BATCH
    # The same device, tunable and cause: one series however many were taken.
    assert rows(app) == 2
    (drift,) = [e for e in listed(client, host="h1") if e["reason"] == "Drift"]
    assert drift["count"] == len(taken) * BATCH
    app.state.clock.advance(60)  # the rate refills: the batch sent again is taken
    again = client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(len(taken) * BATCH + 1)))
    assert again.json()["corrections_recorded"] == len(taken) * BATCH + 1


def test_hostile_a_correction_naming_a_profile_the_host_does_not_apply_is_not_on_its_events(
        app: FastAPI, client: TestClient) -> None:
    applying(app, client)
    fakes = [correction(1, profile="victim"),                      # a profile not applied here
             correction(2, rule="other", cause="reboot"),          # a rule of it not applied here
             correction(3, device="sdz")]                          # a device the host does not hold
    assert client.post(f"{AGENTS}/h1/heartbeat", json=beat(*fakes)).json()["corrections_recorded"] == 3
    assert listed(client, profile="victim") == [] and listed(client, profile="streaming") == []
    on_host = listed(client, host="h1")
    assert len(on_host) == 6 and all(e["profile"] is None for e in on_host)
    assert "(victim/loops, which this host does not apply)" in on_host[0]["message"]
    assert "(streaming/other, which this host does not apply)" in on_host[2]["message"]
    assert "sdz read_ahead_kb" in on_host[4]["message"] and "does not apply" in on_host[4]["message"]
    # Still counted: the host did report them.
    assert (counted(app, "stortune_drift_events_total"),
            counted(app, "stortune_drift_events_total", "reboot")) == (2, 1)
    # Nor does a later one the host does apply join their series.
    client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(4)))
    (own,) = [e for e in listed(client, profile="streaming") if e["reason"] == "Drift"]
    assert own["count"] == 1 and "(streaming/loops):" in own["message"]


def test_hostile_one_past_the_budget_is_summed_up_not_written(budgeted: FastAPI) -> None:
    with admin_client(budgeted) as client:
        applying(budgeted, client)
        within = [correction(i + 1, device=f"loop{i}") for i in range(BUDGET)]
        assert client.post(f"{AGENTS}/h1/heartbeat", json=beat(*within)).status_code == 200
        assert rows(budgeted) == 2 * BUDGET and not any(
            "not recorded one by one" in e["message"] for e in listed(client, host="h1"))
        client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(BUDGET + 1, device="loop99")))
        assert rows(budgeted) == 2 * BUDGET + 1
        assert "loop99" not in str(listed(client, host="h1"))
        # One already open is still raised past the budget: it writes no row.
        client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(BUDGET + 2, device="loop0")))
        assert rows(budgeted) == 2 * BUDGET + 1
        # A minute later the budget is back.
        budgeted.state.clock.advance(60)
        client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(BUDGET + 3, device="loop98")))
        assert rows(budgeted) == 2 * BUDGET + 3
    assert counted(budgeted, "stortune_drift_events_total") == BUDGET + 3


# -- the cases -----------------------------------------------------------------------------------
def test_the_same_correction_twice_raises_one_events_count(app: FastAPI, client: TestClient) -> None:
    applying(app, client)
    client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1)))
    app.state.clock.advance(30)
    client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(2, found=512)))
    drift, corrected = listed(client, profile="streaming")
    assert (drift["reason"], drift["count"], corrected["reason"], corrected["count"]) == (
        "Drift", 2, "Corrected", 2)
    assert drift["lastTimestamp"] > drift["firstTimestamp"]
    assert "observed 512" in drift["message"]  # the newest
    # Another cause is another series; so is the same one after the window.
    client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(3, cause="reboot")))
    app.state.clock.advance(3600)
    client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(4)))
    assert [e["count"] for e in listed(client, profile="streaming") if e["reason"] == "Drift"] == [2, 1, 1]
    assert counted(app, "stortune_drift_events_total") == 3


def test_hostile_a_budget_of_none_is_refused_at_start_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--db", "sqlite://", "--agent-correction-events", "0"]) == 1
    assert "agent_correction_events_per_minute: Input should be greater than or equal to 1" in (
        capsys.readouterr().err)
