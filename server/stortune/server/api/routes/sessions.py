"""/api/v1/session: the dashboard's sign-in, its session, and its sign-out.

The dashboard (/ui/) must not keep a token where its scripts can read it: a script
injected into the page could send it anywhere. So the page signs in once with
``POST /api/v1/session`` and a bearer token, and gets an HttpOnly, SameSite=Strict cookie
(Secure over TLS) that stands for that token from then on, and the session's CSRF token,
which every write made with the cookie carries (api/access.py checks both). The cookie's
secret is new at every sign-in (no session fixation) and lives in ``ui_sessions``, so every
replica on one database accepts it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Request, Response, status

from stortune.server.api.access import SESSION, SESSION_COOKIE, Authenticator
from stortune.server.api.deps import NowDep, SessionDep, SettingsDep
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal, secret_hash
from stortune.server.errors import BadRequest
from stortune.server.models.sessions import SessionView
from stortune.server.services import ui_sessions

router = APIRouter(prefix="/session", tags=["sessions"])
#: Where the cookie is sent: the API only (api/router.py's prefix, which imports this module).
COOKIE_PATH = "/api/v1"

Person = Annotated[Principal, Authorized(Permission.USE_DASHBOARD)]


def _cookie_of(request: Request) -> str | None:
    secret = request.scope.get(SESSION)
    return secret if isinstance(secret, str) else None


def _set_cookie(response: Response, request: Request, value: str, max_age: int) -> None:
    # Path: only the API needs it; Secure whenever the browser reached us over TLS.
    response.set_cookie(SESSION_COOKIE, value, max_age=max_age, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https",
                        path=request.scope.get("root_path", "") + COOKIE_PATH)


@router.post("", status_code=status.HTTP_201_CREATED)
def sign_in(*, who: Person, request: Request, response: Response, session: SessionDep, now: NowDep,
            settings: SettingsDep) -> SessionView:
    """Exchange the bearer token of this call for a session cookie (HttpOnly, SameSite=Strict,
    Secure over TLS) and the session's CSRF token. The session ends at sign-out, after
    ``session_ttl_s`` (8 h), or when its token is revoked or expires, whichever comes first."""
    if _cookie_of(request) is not None:
        raise BadRequest("sign in with 'Authorization: Bearer <token>': a session cannot make another")
    # A cookie the browser brought along is ended, whoever's it was: the new one never equals it.
    brought = ui_sessions_cookie(request)
    secret, expires = ui_sessions.start(session, who, now=now, ttl=timedelta(seconds=settings.session_ttl_s),
                                        replacing=brought)
    if brought is not None:
        _authenticator(request).forget_session(brought)
    _set_cookie(response, request, secret, max(1, int((expires - now).total_seconds())))
    return SessionView.of(replace(who, expires_at=expires), cookie=True, csrf=ui_sessions.csrf_token(secret))


@router.get("")
def current_session(who: Person, request: Request) -> SessionView:
    """Who this call is made as; with the cookie, the session's expiry and CSRF token (a page
    reloaded from cache finds it here again)."""
    secret = _cookie_of(request)
    return SessionView.of(who, cookie=secret is not None,
                          csrf=ui_sessions.csrf_token(secret) if secret is not None else None)


@router.delete("", status_code=status.HTTP_204_NO_CONTENT)
def sign_out(who: Person, request: Request, session: SessionDep) -> Response:
    """End the session of the cookie (from every replica: its row goes) and clear the cookie.
    With a bearer header only, there is no session to end: the token stays valid."""
    secret = _cookie_of(request)
    response = Response(status_code=status.HTTP_204_NO_CONTENT)
    if secret is not None:
        ui_sessions.end(session, secret_hash(secret))
        _authenticator(request).forget_session(secret)
        _set_cookie(response, request, "", 0)
    return response


def _authenticator(request: Request) -> Authenticator:
    authenticator: Authenticator = request.app.state.authenticator
    return authenticator


def ui_sessions_cookie(request: Request) -> str | None:
    value = request.cookies.get(SESSION_COOKIE)
    return value if value and len(value) <= 256 else None
