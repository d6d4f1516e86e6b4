"""Dashboard sessions (api/routes/sessions.py, api/access.py): hostile cases first.

A session cookie stands for the token that signed in and nothing more: its flags keep it from
scripts and other sites, every write made with it needs the session's CSRF token from this
origin, a sign-in never keeps a cookie it was handed, and the token's revocation or expiry,
the sign-out and the session's own expiry end it on every replica sharing the database.
"""

from __future__ import annotations

from collections.abc import Iterator
from http.cookies import SimpleCookie
from typing import Any

import pytest
from fastapi import FastAPI

from stortune.server.api.access import CSRF_HEADER, SESSION_COOKIE
from tests.server.builders import profile_doc
from tests.server.conftest import TokenFor
from tests.server.support import AppFactory, FakeClock, TestClient, bearer


def sign_in(client: TestClient, secret: str) -> dict[str, Any]:
    answer = client.post("/api/v1/session", headers=bearer(secret))
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def cookie_attributes(set_cookie: str) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    jar.load(set_cookie)
    morsel = jar[SESSION_COOKIE]
    return {"value": morsel.value, **{k: str(v) for k, v in morsel.items() if v}}


@pytest.fixture
def browser(app: FastAPI) -> Iterator[TestClient]:
    """A client without a bearer header: what the page's fetch() calls send is the cookie."""
    with TestClient(app) as test_client:
        yield test_client


def test_cookie_flags_httponly_samesite_strict_scoped_to_the_api_and_never_secure_over_plain_http(
        browser: TestClient, token_for: TokenFor) -> None:
    answer = browser.post("/api/v1/session", headers=bearer(token_for("operator")))
    flags = cookie_attributes(answer.headers["set-cookie"])
    assert flags["httponly"] == "True" and flags["samesite"].lower() == "strict"
    assert flags["path"] == "/api/v1" and "secure" not in flags
    assert flags["value"].startswith("sts_") and flags["value"] not in answer.text  # never in the body
    assert 0 < int(flags["max-age"]) <= 8 * 3600


def test_cookie_flags_secure_when_the_browser_came_over_tls(app: FastAPI, token_for: TokenFor) -> None:
    with TestClient(app, base_url="https://dashboard.example") as tls:
        answer = tls.post("/api/v1/session", headers=bearer(token_for("viewer")))
    assert cookie_attributes(answer.headers["set-cookie"])["secure"] == "True"


def test_csrf_a_write_with_the_cookie_and_no_csrf_token_is_403_and_audited_with_the_token(
        browser: TestClient, token_for: TokenFor, client: TestClient) -> None:
    session = sign_in(browser, token_for("operator", name="alice"))
    refused = browser.post("/api/v1/profiles", json=profile_doc())
    assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["message"]
    assert client.get("/api/v1/profiles/streaming").status_code == 404
    records = client.get("/api/v1/audit", params={"token": session["token"]["id"]}).json()["items"]
    assert [(r["method"], r["code"]) for r in records][:2] == [("POST", 403), ("POST", 201)]


@pytest.mark.parametrize("offered", ["", "0" * 64, "x" * 5000, "not-the-token"])
def test_csrf_a_wrong_token_is_403(browser: TestClient, token_for: TokenFor, offered: str) -> None:
    sign_in(browser, token_for("operator"))
    answer = browser.post("/api/v1/profiles", json=profile_doc(), headers={CSRF_HEADER: offered})
    assert answer.status_code == 403


def test_csrf_another_sessions_token_is_403(app: FastAPI, token_for: TokenFor) -> None:
    with TestClient(app) as mine, TestClient(app) as theirs:
        sign_in(mine, token_for("operator"))
        other = sign_in(theirs, token_for("operator"))
        answer = mine.post("/api/v1/profiles", json=profile_doc(), headers={CSRF_HEADER: other["csrfToken"]})
    assert answer.status_code == 403


def test_csrf_the_sessions_own_token_lets_the_write_through(browser: TestClient, token_for: TokenFor) -> None:
    session = sign_in(browser, token_for("operator"))
    answer = browser.post("/api/v1/profiles", json=profile_doc(), headers={CSRF_HEADER: session["csrfToken"]})
    assert answer.status_code == 201, answer.text
    # what a reloaded page learns again from the cookie alone
    assert browser.get("/api/v1/session").json()["csrfToken"] == session["csrfToken"]


@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"},
    {"Origin": "https://evil.example"},          # a browser without Fetch Metadata
    {"Sec-Fetch-Site": "same-site"},             # a sibling subdomain is another site's page too
    {"Origin": "null"},                          # a sandboxed frame or a data: page
])
def test_csrf_a_cross_site_form_post_is_refused_even_with_the_csrf_token(
        browser: TestClient, token_for: TokenFor, headers: dict[str, str]) -> None:
    session = sign_in(browser, token_for("admin"))
    answer = browser.post("/api/v1/tokens", content=b"role=admin&name=pwned",
                          headers={"Content-Type": "application/x-www-form-urlencoded",
                                   CSRF_HEADER: session["csrfToken"], **headers})
    assert answer.status_code == 403, answer.text


def test_csrf_a_cross_site_post_without_the_cookie_is_401(browser: TestClient) -> None:
    # SameSite=Strict: the browser sends no cookie along with another site's form
    answer = browser.post("/api/v1/tokens", content=b"role=admin",
                          headers={"Content-Type": "application/x-www-form-urlencoded",
                                   "Origin": "https://evil.example"})
    assert answer.status_code == 401


def test_session_fixation_a_sign_in_never_keeps_the_cookie_it_was_handed(
        app: FastAPI, token_for: TokenFor) -> None:
    with TestClient(app) as attacker:
        sign_in(attacker, token_for("viewer", name="mallory"))
        planted = attacker.cookies[SESSION_COOKIE]
    with TestClient(app, cookies={SESSION_COOKIE: planted}) as victim:
        fresh = victim.post("/api/v1/session", headers=bearer(token_for("admin", name="root")))
        assert fresh.status_code == 201
        issued = cookie_attributes(fresh.headers["set-cookie"])["value"]
        assert issued != planted
        assert victim.get("/api/v1/session").json()["token"]["name"] == "root"
    with TestClient(app, cookies={SESSION_COOKIE: planted}) as attacker_again:
        assert attacker_again.get("/api/v1/session").status_code == 401  # the planted one ended


def test_session_fixation_a_made_up_cookie_is_no_session(browser: TestClient) -> None:
    browser.cookies.set(SESSION_COOKIE, "sts_" + "A" * 43)
    answer = browser.get("/api/v1/hosts")
    assert answer.status_code == 401 and "sign in again" in answer.json()["message"]


def test_a_session_cannot_make_another(browser: TestClient, token_for: TokenFor) -> None:
    session = sign_in(browser, token_for("admin"))
    answer = browser.post("/api/v1/session", headers={CSRF_HEADER: session["csrfToken"]})
    assert answer.status_code == 400 and "Bearer" in answer.json()["message"]


@pytest.mark.parametrize("role", ["agent", "metrics"])
def test_machine_tokens_cannot_sign_in(browser: TestClient, token_for: TokenFor, role: str) -> None:
    answer = browser.post("/api/v1/session", headers=bearer(token_for(role)))
    assert answer.status_code == 403 and SESSION_COOKIE not in answer.headers.get("set-cookie", "")


def test_revoked_tokens_sessions_end_at_once_here_and_on_another_replica(
        app: FastAPI, make_app: AppFactory, token_for: TokenFor, client: TestClient) -> None:
    secret = token_for("operator")
    other = make_app(token_cache_s=0)  # a second server on the same database
    with TestClient(app) as here, TestClient(other) as there:
        session = sign_in(here, secret)
        there.cookies.set(SESSION_COOKIE, here.cookies[SESSION_COOKIE])
        assert there.get("/api/v1/hosts").status_code == 200  # replicas share sessions
        assert client.delete(f"/api/v1/tokens/{session['token']['id']}").status_code == 200
        for browser in (here, there):
            refused = browser.get("/api/v1/hosts")
            assert refused.status_code == 401 and "revoked" in refused.json()["message"]


def test_an_expired_tokens_sessions_end_with_it(browser: TestClient, token_for: TokenFor,
                                                 clock: FakeClock) -> None:
    session = sign_in(browser, token_for("support", hosts="role=streamer", expires_in="1h"))
    assert session["expiresAt"] is not None
    clock.advance(3601)
    assert browser.get("/api/v1/hosts").status_code == 401


def test_a_session_expires_after_its_lifetime(make_app: AppFactory, token_for: TokenFor,
                                              clock: FakeClock) -> None:
    app = make_app(session_ttl_s=600, token_cache_s=0)
    with TestClient(app) as browser:
        sign_in(browser, issue(app, "viewer"))
        clock.advance(599)
        assert browser.get("/api/v1/hosts").status_code == 200
        clock.advance(2)
        answer = browser.get("/api/v1/hosts")
    assert answer.status_code == 401 and "expired" in answer.json()["message"]


def issue(app: FastAPI, role: str) -> str:
    from tests.server.support import issue_token

    return issue_token(app, role)


def test_sign_out_ends_the_session_on_every_replica_and_clears_the_cookie(
        app: FastAPI, make_app: AppFactory, token_for: TokenFor) -> None:
    other = make_app(token_cache_s=0)
    with TestClient(app) as here, TestClient(other) as there:
        session = sign_in(here, token_for("viewer"))
        cookie = here.cookies[SESSION_COOKIE]
        there.cookies.set(SESSION_COOKIE, cookie)
        assert here.delete("/api/v1/session").status_code == 403  # a write: the CSRF token too
        out = here.delete("/api/v1/session", headers={CSRF_HEADER: session["csrfToken"]})
        assert out.status_code == 204 and 'Max-Age=0' in out.headers["set-cookie"]
        here.cookies.set(SESSION_COOKIE, cookie)  # a copy kept by whoever stole it
        for browser in (here, there):
            assert browser.get("/api/v1/hosts").status_code == 401


def test_a_bearer_header_decides_alone_and_needs_no_csrf_token(app: FastAPI, token_for: TokenFor) -> None:
    with TestClient(app) as browser:
        sign_in(browser, token_for("admin"))
        as_viewer = browser.post("/api/v1/profiles", json=profile_doc(), headers=bearer(token_for("viewer")))
        assert as_viewer.status_code == 403 and "viewer" in as_viewer.json()["message"]
        as_operator = browser.post("/api/v1/profiles", json=profile_doc(),
                                   headers=bearer(token_for("operator")))
        assert as_operator.status_code == 201


@pytest.mark.parametrize("cookie", [
    f"{SESSION_COOKIE}=" + "x" * 10_000,
    f'{SESSION_COOKIE}="unterminated',
    f"{SESSION_COOKIE}=\x00\x01",
    "a=b; " * 2000,
    f"{SESSION_COOKIE}=sts_%00%2f..%2f",
])
def test_odd_cookie_headers_are_401_not_500(browser: TestClient, cookie: str) -> None:
    answer = browser.get("/api/v1/hosts", headers={"Cookie": cookie})
    assert answer.status_code == 401


# Every write the dashboard can make, as the page makes it (cookie + CSRF token).
UI_WRITES = [
    ("POST", "/api/v1/profiles", profile_doc()),
    ("POST", "/api/v1/profiles?dryRun=All", profile_doc()),
    ("PUT", "/api/v1/profiles/streaming", profile_doc()),
    ("PUT", "/api/v1/profiles/streaming?dryRun=All", profile_doc()),
    ("DELETE", "/api/v1/profiles/streaming", None),
    ("DELETE", "/api/v1/profiles/streaming?dryRun=All", None),
    ("PATCH", "/api/v1/hosts/h1/labels", {"labels": {"a": "b"}}),
    ("POST", "/api/v1/benchmarks/runs/r1/cancel", None),
    ("POST", "/api/v1/experiments/x1/cancel", None),
]


@pytest.mark.parametrize(("method", "path", "body"), UI_WRITES)
@pytest.mark.parametrize("role", ["viewer", "support"])
def test_role_limits_every_write_the_ui_can_do_is_403_for_readers(
        *, browser: TestClient, token_for: TokenFor, role: str, method: str, path: str, body: Any) -> None:
    session = sign_in(browser, token_for(role, hosts="role=streamer" if role == "support" else None,
                                         expires_in="1h" if role == "support" else None))
    answer = browser.request(method, path, json=body, headers={CSRF_HEADER: session["csrfToken"]})
    assert answer.status_code == 403, (role, method, path, answer.text)


def test_role_limits_the_session_names_what_the_role_may_do(browser: TestClient, token_for: TokenFor) -> None:
    viewer = sign_in(browser, token_for("viewer"))
    assert "write profiles" not in viewer["permissions"] and "read hosts" in viewer["permissions"]
    assert viewer["token"]["role"] == "viewer" and viewer["cookie"] is True


def test_the_session_call_with_a_bearer_header_has_no_session(client: TestClient) -> None:
    answer = client.get("/api/v1/session").json()
    assert answer["cookie"] is False and answer["csrfToken"] is None and answer["token"]["role"] == "admin"
    assert client.delete("/api/v1/session").status_code == 204  # nothing to end: the token stays
    assert client.get("/api/v1/hosts").status_code == 200
