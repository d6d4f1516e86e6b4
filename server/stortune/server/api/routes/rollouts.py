"""/api/v1/profiles/{name}/rollout: read and steer a profile's progressive rollout (issue 27).

    GET  /profiles/{name}/rollout                     the status (waves, counts, hosts, analysis)
    GET  /profiles/{name}/rollout?watch=true          JSON lines: the status at once, then again at
                                                      each change of its ``version``; an ``end``
                                                      line says why the stream ended
    POST /profiles/{name}/rollout/pause|resume|undo   a command for the rollout driver

Who may: reading takes the permission to read profiles (viewer, operator, admin), steering the
permission to write them (operator, admin), as the change being rolled out does. A support token
(the only kind scoped to hosts by a selector) may read neither: a rollout's status names hosts
across the fleet, and profiles are outside such a token's reach already. Every steering call is
audited by the API's audit machinery (a POST: whatever its outcome, a refused 403 included); the
command is also an event of the profile (services/rollouts.command).

The watch holds no database session while it waits: each look is a short read in a worker
thread (the row's ``version`` alone; the whole status only when it moved), between looks the
coroutine sleeps. It ends when the rollout is Complete or Halted (Halted while reverting: once
rolled back), at ``timeoutSeconds``, when the rollout row goes away, or when the server drains.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any, Final, Literal, NoReturn

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.api.deps import NowDep, ProfileName, SessionDep
from stortune.server.api.openapi import NOT_FOUND, TOO_MANY
from stortune.server.api.ratelimit import Quota, QuotaOf, RateLimited
from stortune.server.api.security import Authorized
from stortune.server.auth import Permission, Principal
from stortune.server.errors import NotFound
from stortune.server.services import profiles, rollouts
from stortune.server.services.watches import WatchBook
from stortune.server.settings import Settings

log = logging.getLogger("stortune.server.rollouts")
router = APIRouter(prefix="/profiles", tags=["profiles"])

Reader = Annotated[Principal, Authorized(Permission.READ_PROFILES)]
Steerer = Annotated[Principal, Authorized(Permission.WRITE_PROFILES)]

#: A watch lasts this long unless asked otherwise, at most WATCH_MAX_S: as long as an agent's
#: watch is held by default (Settings.agent_watch_s), and at most the bound that setting has.
WATCH_DEFAULT_S: Final = 300
WATCH_MAX_S: Final = 3600
#: Between two looks at the row's version; Settings.rollout_interval_s when smaller (the
#: driver cannot write more often than it steps).
WATCH_POLL_S: Final = 1.0
HOSTS_DEFAULT: Final = rollouts.DEFAULT_STATUS_HOSTS
HOSTS_MAX: Final = rollouts.MAX_STATUS_HOSTS
#: A watch holds a connection for minutes: a caller opens few (a dashboard, a CI gate).
WATCHES_PER_MINUTE: Final = 60
COMMANDS_PER_MINUTE: Final = 60
#: More than the pending commands a rollout holds (services/rollouts.MAX_PENDING_COMMANDS):
#: that bound, not the rate, answers a burst with what it means (409).
COMMANDS_BURST: Final = 2 * rollouts.MAX_PENDING_COMMANDS
MEDIA_TYPE: Final = "application/jsonl"

Watch = Annotated[bool, Query(
    description="Stream the status as JSON lines until it ends (see timeoutSeconds)")]
TimeoutSeconds = Annotated[int, Query(
    alias="timeoutSeconds", ge=1, le=WATCH_MAX_S,
    description=f"A watch ends after this many seconds (default {WATCH_DEFAULT_S}, at most {WATCH_MAX_S})")]
WatchQuota = Annotated[Quota, QuotaOf("rollout-watch", per_minute=WATCHES_PER_MINUTE)]
Limit = Annotated[int, Query(ge=1, le=HOSTS_MAX, description="At most this many hosts in ``hosts``")]

_STATUS: Final[dict[int | str, dict[str, Any]]] = {200: {
    "description": "The rollout's status; with watch=true a stream of JSON lines: "
                   '{"type": "status", "status": {...}} per change, then {"type": "end", "reason": '
                   '"Complete"|"Halted"|"Timeout"|"Gone"|"ServerShutdown"|"Error", "phase": ...}',
    "content": {"application/json": {"schema": {"type": "object"}},
                MEDIA_TYPE: {"schema": {"type": "string"}}}}}


class NoRollout(NotFound):
    """The profile exists, but no rollout of it is stored: its changes reached every host at once
    (``strategy: all-at-once``, or no host's settings changed), or it was never changed."""

    def __init__(self, name: str) -> None:
        super().__init__("Rollout", name)
        self.message = (f'StorageProfile "{name}" has no rollout: its last change went to every host '
                        "at once (strategy all-at-once, or no host's settings changed)")
        self.args = (self.message,)


def _missing(session: Session, name: str) -> NoReturn:
    profiles.get(session, name)  # 404 naming the profile when it does not exist
    raise NoRollout(name)


def _status(session: Session, name: str, limit: int) -> dict[str, Any]:
    found = rollouts.status(session, name, limit=limit)
    if found is None:
        _missing(session, name)
    return found


def _read(sessions: sessionmaker[Session], read: Callable[[Session], Any]) -> Any:
    # A session of its own per look, closed before the watch sleeps again.
    with sessions() as session:
        return read(session)


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":"), default=str).encode() + b"\n"


def _ended(status: dict[str, Any]) -> str | None:
    """Why a watch ends at this status, or None: Complete, or Halted once nothing is moving
    back (a halt that reverts ends when every reverted host holds the previous generation)."""
    phase = status.get("phase")
    if phase == "Complete":
        return "Complete"
    if phase == "Halted" and (not status.get("rollback") or status.get("rolledBack")):
        return "Halted"
    return None


async def _watch(request: Request, name: str, limit: int, seconds: int,
                 first: dict[str, Any]) -> AsyncIterator[bytes]:
    sessions: sessionmaker[Session] = request.app.state.sessions
    settings: Settings = request.app.state.settings
    watches: WatchBook = request.app.state.watches  # drained when the server shuts down
    interval = min(WATCH_POLL_S, settings.rollout_interval_s)
    deadline = time.monotonic() + seconds
    status = first
    yield _line({"type": "status", "status": status})
    while True:
        reason = _ended(status)
        remaining = deadline - time.monotonic()
        if reason is None and remaining <= 0:
            reason = "Timeout"
        if reason is None and watches.draining:
            reason = "ServerShutdown"  # the client watches again, here or on another replica
        if reason is not None:
            yield _line({"type": "end", "reason": reason, "phase": status.get("phase")})
            return
        await anyio.sleep(min(interval, remaining))
        try:
            version = await run_in_threadpool(_read, sessions, lambda s: rollouts.version(s, name))
            moved = status
            if version is not None and version != rollouts.seen_version(status):
                moved = await run_in_threadpool(_read, sessions,
                                                lambda s: rollouts.status(s, name, limit=limit))
        except SQLAlchemyError as exc:  # the status line is sent already: say so in the stream
            log.warning("watch of the rollout of %s: cannot read it: %s", name, exc)
            yield _line({"type": "end", "reason": "Error", "phase": status.get("phase"),
                         "message": "the control plane could not read the rollout; watch again"})
            return
        if version is None or moved is None:
            # Replaced by an all-at-once change, or the deleted profile's rollout is gone.
            yield _line({"type": "end", "reason": "Gone", "phase": status.get("phase")})
            return
        if moved is not status:
            status = moved
            yield _line({"type": "status", "status": status})


@router.get("/{name}/rollout", operation_id="getProfileRollout", response_model=None,
            responses={**NOT_FOUND, **TOO_MANY, **_STATUS})
async def get_rollout(
    *, who: Reader, quota: WatchQuota, name: ProfileName, request: Request, watch: Watch = False,
    timeout_seconds: TimeoutSeconds = WATCH_DEFAULT_S, limit: Limit = HOSTS_DEFAULT,
) -> dict[str, Any] | StreamingResponse:
    """The profile's rollout: its generation and the previous one, phase (Progressing, Paused,
    Halted, Complete), the open wave, per wave the hosts in each stage, failures, and up to
    ``limit`` hosts with their wave, stage, failure and verdict. 404 names the profile when it
    does not exist, or says it has no rollout. ``watch=true`` streams (see the 200 response)."""
    sessions: sessionmaker[Session] = request.app.state.sessions
    first: dict[str, Any] = await run_in_threadpool(_read, sessions, lambda s: _status(s, name, limit))
    if not watch:
        return first
    await run_in_threadpool(quota.spend)
    return StreamingResponse(_watch(request, name, limit, timeout_seconds, first), media_type=MEDIA_TYPE,
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _steer(command: Literal["pause", "resume", "undo"], who: Principal, name: str, session: Session,
           now: datetime) -> dict[str, Any]:
    try:
        return rollouts.command(session, name, command, f"{who.name} (token {who.token_id})", now)
    except NotFound:
        session.rollback()
        _missing(session, name)


_STEERED = {**NOT_FOUND, **TOO_MANY}
_STEERING = [RateLimited("rollout-commands", per_minute=COMMANDS_PER_MINUTE, burst=COMMANDS_BURST)]


@router.post("/{name}/rollout/pause", operation_id="pauseProfileRollout", responses=_STEERED,
             dependencies=_STEERING)
def pause_rollout(who: Steerer, name: ProfileName, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """Stop starting hosts and waves; hosts being changed finish. The driver takes the command at
    its next step; the answer is the status with the command pending."""
    return _steer("pause", who, name, session, now)


@router.post("/{name}/rollout/resume", operation_id="resumeProfileRollout", responses=_STEERED,
             dependencies=_STEERING)
def resume_rollout(who: Steerer, name: ProfileName, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """Lift a pause, or a halt that reverted nothing (the failures so far are excused)."""
    return _steer("resume", who, name, session, now)


@router.post("/{name}/rollout/undo", operation_id="undoProfileRollout", responses=_STEERED,
             dependencies=_STEERING)
def undo_rollout(who: Steerer, name: ProfileName, session: SessionDep, now: NowDep) -> dict[str, Any]:
    """Put every host the rollout changed back to the previous generation, even after Complete."""
    return _steer("undo", who, name, session, now)


@router.post("/{name}/rollout/{command}", include_in_schema=False, response_model=None)
def unknown_command(who: Steerer, name: ProfileName, command: str) -> NoReturn:
    # Without this, POST .../rollout/explode is the router's bare "Not Found".
    refused = NotFound("RolloutCommand", command[:64])
    refused.message = f'no rollout command "{command[:64]}": pause, resume or undo'
    refused.args = (refused.message,)
    raise refused
