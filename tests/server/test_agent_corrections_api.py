"""Corrections an agent reports with its heartbeats: recorded once each, with their cause, and counted.

Hostile first: what an agent sends becomes events and metric labels, so the body is bounded and
checked field by field (a tunable outside the catalog would be a new label value per request); a
batch sent twice (a held watch and a heartbeat carrying the same ones) is recorded once; a caller
without the host's key records nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI

from stortune.schemas.corrections import MAX_BATCH
from stortune.server.auth import Role
from stortune.server.models.hosts import DeviceSetting
from stortune.server.services import hosts
from tests.server.builders import API, keyed, loop_topology, registration
from tests.server.support import TestClient, bearer, issue_token
from tests.server.test_metrics import parse, sample, scrape

AGENTS = f"{API}/agents"
EPOCH = "0123456789abcdef"


def correction(seq: int, **fields: Any) -> dict[str, Any]:
    return {"seq": seq, "device": "loop0", "device_id": "loop:/var/tmp/a.img", "tunable": "read_ahead_kb",
            "found": 256, "set_to": 4096, "profile": "streaming", "rule": "loops", "cause": "runtime",
            "trigger": "start", **fields}


def beat(*items: dict[str, Any], epoch: str = EPOCH) -> dict[str, Any]:
    return {"topology_hash": "", "boot_id": "boot-1", "corrections": {"epoch": epoch, "items": list(items)}}


def events(client: TestClient, reason: str) -> list[str]:
    return [e["message"] for e in listed(client, reason)]


def listed(client: TestClient, reason: str) -> list[dict[str, Any]]:
    items = client.get(f"{API}/events", params={"host": "h1", "limit": 200}).json()["items"]
    return [e for e in reversed(items) if e["reason"] == reason]


def counted(app: FastAPI, name: str, cause: str = "runtime") -> float:
    return sample(parse(scrape(app)), name, tunable="read_ahead_kb", cause=cause) or 0


def applying(app: FastAPI, client: TestClient, name: str = "h1") -> None:
    """Host ``name`` with loop0 in its topology, where the reconciler applies streaming/loops: the
    corrections below name what the host applies (else they are recorded without the profile)."""
    response = client.post(f"{AGENTS}/register", json=registration(name, topology=loop_topology(name)))
    assert response.status_code == 200, response.text
    row = DeviceSetting(device="loop0", deviceId="name:loop0", tunable="read_ahead_kb", desired=4096,
                        observed=4096, inSync=True, profile="streaming", rule="loops", generation=1)
    with app.state.sessions() as session:
        hosts.write_status(session, name, devices=[row], applied_generations={"streaming": 1},
                           now=app.state.clock())


@pytest.fixture
def registered(app: FastAPI, client: TestClient) -> TestClient:
    applying(app, client)
    return client


# -- hostile ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("item", "field", "words"), [
    (correction(1, tunable="turbo"), "tunable", "not a tunable of the catalog"),
    (correction(1, tunable="x" * 65), "tunable", "at most 64"),
    (correction(1, device="../../etc"), "device", "not a kernel block device name"),
    (correction(1, found="a\x1b[2Jb"), "found", "printable"),
    (correction(1, set_to="y" * 65), "set_to", "1 to 64 printable"),
    (correction(1, found=2**64), "found", "64-bit"),
    (correction(1, cause="cosmic-rays"), "cause", "'reboot' or 'runtime'"),
    (correction(1, trigger="whenever"), "trigger", "'start' or 'rescan'"),
    (correction(0), "seq", "greater than or equal to 1"),
    (correction(1, profile="Not A Name"), "profile", "pattern"),
    (correction(1, extra="x"), "extra", "unknown field"),
])
def test_hostile_a_correction_out_of_bounds_is_a_422_naming_its_field(
        registered: TestClient, item: dict[str, Any], field: str, words: str) -> None:
    response = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(item))
    assert response.status_code == 422, response.text
    (cause,) = response.json()["details"]["causes"]
    assert cause["field"].startswith("corrections.items[0]") and field in cause["field"], cause
    assert words in cause["message"], cause
    assert events(registered, "Drift") == []


def test_hostile_too_many_or_disordered_corrections_are_refused(registered: TestClient) -> None:
    too_many = (correction(i) for i in range(1, MAX_BATCH + 2))
    many = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(*too_many))
    assert many.status_code == 422 and "corrections.items" in many.text, many.text
    assert f"at most {MAX_BATCH}" in many.text
    twice = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(2), correction(2)))
    assert twice.status_code == 422 and "increasing seq order" in twice.text, twice.text
    epoch = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1), epoch="not-hex"))
    assert epoch.status_code == 422 and "corrections.epoch" in epoch.text, epoch.text
    assert events(registered, "Drift") == []


def test_hostile_corrections_without_the_host_key_record_nothing(app: FastAPI, client: TestClient) -> None:
    agent = bearer(issue_token(app, Role.AGENT, name="fleet"))
    assert client.post(f"{AGENTS}/register", json=registration("h1"), headers={**agent, **keyed("h1")}
                       ).status_code == 200
    forged = client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1)), headers=agent)
    assert forged.status_code == 403, forged.text
    assert events(client, "Drift") == []
    assert counted(app, "stortune_drift_events_total") == 0
    own = client.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1)), headers={**agent, **keyed("h1")})
    assert own.status_code == 200 and own.json()["corrections_recorded"] == 1, own.text


def test_hostile_a_batch_sent_again_is_recorded_once(app: FastAPI, registered: TestClient) -> None:
    first = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1), correction(2, found=512)))
    assert first.json()["corrections_recorded"] == 2
    again = registered.post(f"{AGENTS}/h1/watch", json=beat(correction(2, found=512), correction(3)))
    assert again.status_code == 200 and again.json()["corrections_recorded"] == 3
    assert registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(3))).json()[
        "corrections_recorded"] == 3
    # The same device, tunable and cause: one event, raised once per correction (the newest's words).
    assert [(e["message"].split(":")[0], e["count"]) for e in listed(registered, "Drift")] == [
        ("loop0 read_ahead_kb observed 256, desired 4096 (streaming/loops)", 3)]
    assert counted(app, "stortune_drift_events_total") == 3
    assert counted(app, "stortune_correction_events_total") == 3


# -- the cases -----------------------------------------------------------------------------------
def test_a_correction_is_a_drift_and_a_corrected_event_and_counted(app: FastAPI, registered: TestClient
                                                                  ) -> None:
    response = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(
        correction(1), correction(2, tunable="scheduler", found="none", set_to="mq-deadline",
                                  cause="reboot")))
    assert response.status_code == 200, response.text
    assert response.json()["accepts_corrections"] is True and response.json()["corrections_recorded"] == 2
    assert events(registered, "Drift") == [
        "loop0 read_ahead_kb observed 256, desired 4096 (streaming/loops): changed outside stortune;"
        " the agent set it back at its start",
        "loop0 scheduler observed none, desired mq-deadline (streaming/loops): reset by a reboot since"
        " the agent last ran; the agent set it back at its start"]
    assert events(registered, "Corrected") == [
        "loop0 read_ahead_kb set back to 4096 (streaming/loops) by the agent at its start",
        "loop0 scheduler set back to mq-deadline (streaming/loops) by the agent at its start"]
    samples = parse(scrape(app))
    assert sample(samples, "stortune_drift_events_total", tunable="read_ahead_kb", cause="runtime") == 1
    assert sample(samples, "stortune_drift_events_total", tunable="scheduler", cause="reboot") == 1
    assert sample(samples, "stortune_correction_events_total", tunable="scheduler", cause="reboot") == 1


def test_a_new_epoch_counts_afresh_and_a_gap_is_said(registered: TestClient) -> None:
    registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1)))
    fresh = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(1), epoch="fedcba9876543210"))
    assert fresh.json()["corrections_recorded"] == 1
    gap = registered.post(f"{AGENTS}/h1/heartbeat", json=beat(correction(5), epoch="fedcba9876543210"))
    assert gap.json()["corrections_recorded"] == 5
    drift = listed(registered, "Drift")
    assert [e["count"] for e in drift] == [3, 3]  # corrections 1, 1 (the new epoch) and 5; 3 missed
    assert drift[1]["message"] == ("3 earlier setting(s) the agent set back on its own were not reported"
                                   " (it had more than it keeps)")


def test_a_heartbeat_without_corrections_is_answered_as_before(registered: TestClient) -> None:
    response = registered.post(f"{AGENTS}/h1/heartbeat", json={"topology_hash": "", "boot_id": "boot-1"})
    assert response.status_code == 200
    assert response.json()["corrections_recorded"] is None and response.json()["accepts_corrections"] is True
