"""Failed sign-ins are throttled per client address, and logged in aggregate.

300 wrong tokens in 1.5 s were each checked against the database and each written to the log.
Now an address that keeps failing gets 429 with Retry-After for credentials the server does
not already know, and the log holds a line per address now and then that counts the rest.
"""

from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI

from stortune.server.api import access, signins
from tests.server.builders import API
from tests.server.support import AppFactory, FakeClock, TestClient, bearer, issue_token

BURST, PER_MINUTE = 5, 10
SESSION = f"{API}/session"


@pytest.fixture
def app(make_app: AppFactory) -> FastAPI:
    return make_app(failed_auth_burst=BURST, failed_auth_per_minute=PER_MINUTE)


LOGGERS = (access.log.name, signins.log.name)


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in LOGGERS]


def test_hostile_300_wrong_tokens_from_one_address_are_throttled_and_logged_in_aggregate(
        app: FastAPI, caplog: pytest.LogCaptureFixture) -> None:
    for name in LOGGERS:
        caplog.set_level(logging.INFO, logger=name)
    with TestClient(app, client=("203.0.113.9", 4711)) as attacker:
        answers = [attacker.post(SESSION, headers=bearer(f"guess-{i:04d}")) for i in range(300)]
    codes = [a.status_code for a in answers]
    assert codes[:BURST] == [401] * BURST and set(codes[BURST:]) == {429}
    refused = answers[-1]
    assert int(refused.headers["retry-after"]) == 60 // PER_MINUTE
    assert "203.0.113.9" in refused.json()["message"] and "failed" in refused.json()["message"]
    lines = _refusals(caplog)
    assert 1 <= len(lines) <= 3, lines  # not 300
    assert any("203.0.113.9" in line and "throttl" in line for line in lines)


def test_hostile_a_throttled_address_cannot_go_on_guessing_with_other_kinds_of_credential(
        app: FastAPI) -> None:
    with TestClient(app, client=("203.0.113.9", 4711)) as attacker:
        for i in range(BURST):
            attacker.get(f"{API}/hosts", headers=bearer(f"guess-{i}"))
        assert attacker.get(f"{API}/hosts", headers=bearer(issue_token(app, "viewer"))).status_code == 429
        cookie = attacker.get(f"{API}/hosts", headers={"Cookie": f"{access.SESSION_COOKIE}=made-up"})
        assert cookie.status_code == 429
        assert attacker.get(f"{API}/hosts").status_code == 429  # no credentials at all: another guess


def test_a_throttled_address_keeps_the_tokens_it_already_used_and_others_are_not_throttled(
        app: FastAPI, clock: FakeClock) -> None:
    """Behind one NAT a fleet's agents share the address of whoever guesses: what was accepted
    before goes on working, and the throttle ends as its bucket refills."""
    admin = bearer(issue_token(app, "admin"))
    with TestClient(app, client=("198.51.100.7", 1000)) as shared, \
            TestClient(app, client=("198.51.100.8", 1000)) as elsewhere:
        assert shared.get(f"{API}/hosts", headers=admin).status_code == 200
        for i in range(BURST):
            assert shared.get(f"{API}/hosts", headers=bearer(f"guess-{i}")).status_code == 401
        assert shared.get(f"{API}/hosts", headers=bearer("guess-more")).status_code == 429
        assert shared.get(f"{API}/hosts", headers=admin).status_code == 200
        assert elsewhere.get(f"{API}/hosts", headers=bearer("typo")).status_code == 401
        clock.advance(2 * 60 / PER_MINUTE)  # two more tries
        assert shared.get(f"{API}/hosts", headers=bearer(issue_token(app, "viewer"))).status_code == 200
        assert shared.get(f"{API}/hosts", headers=bearer("guess-again")).status_code == 401
        assert shared.get(f"{API}/hosts", headers=bearer("and-again")).status_code == 401
        assert shared.get(f"{API}/hosts", headers=bearer("once-more")).status_code == 429
