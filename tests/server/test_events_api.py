"""Events: filtered, newest first, identical consecutive ones counted."""

from __future__ import annotations

from tests.server.builders import API, profile_doc, registration, with_changes
from tests.server.support import FakeClock, TestClient

EVENTS = f"{API}/events"


def test_events_newest_first_and_filtered(client: TestClient, clock: FakeClock) -> None:
    client.post(f"{API}/agents/register", json=registration("h1"))
    clock.advance(1)
    # all-at-once: a rollout (issue 27) would add its own events to the profile's.
    client.post(f"{API}/profiles", json=with_changes(profile_doc("p1"), rollout={"strategy": "all-at-once"}))
    clock.advance(1)
    client.post(f"{API}/agents/register", json=registration("h2"))

    items = client.get(EVENTS).json()["items"]
    assert [(e["reason"], e["involvedObject"]["name"]) for e in items] == [
        ("Registered", "h2"), ("Created", "p1"), ("Registered", "h1")]
    assert items[0]["involvedObject"] == {"kind": "Host", "name": "h2"}
    assert [e["reason"] for e in client.get(EVENTS, params={"profile": "p1"}).json()["items"]] == ["Created"]
    assert [e["host"] for e in client.get(EVENTS, params={"host": "h1"}).json()["items"]] == ["h1"]
    assert len(client.get(EVENTS, params={"limit": 2}).json()["items"]) == 2
    assert client.get(EVENTS, params={"host": "Bad Name"}).status_code == 422


def test_identical_consecutive_events_are_counted(client: TestClient, clock: FakeClock) -> None:
    client.post(f"{API}/agents/register", json=registration())
    for _ in range(3):
        clock.advance(10)
        client.post(f"{API}/agents/register", json=registration())
    (reregistered, registered) = client.get(EVENTS, params={"host": "h1"}).json()["items"]
    assert registered["reason"] == "Registered" and registered["count"] == 1
    assert reregistered["reason"] == "Reregistered" and reregistered["count"] == 3
    assert reregistered["firstTimestamp"] == "2025-03-01T12:00:10Z"
    assert reregistered["lastTimestamp"] == "2025-03-01T12:00:30Z"
