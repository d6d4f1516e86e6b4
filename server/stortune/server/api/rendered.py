"""Encoded GET responses, kept until the next write.

Every write bumps the one resourceVersion counter (services/versions.py), so a
body rendered at counter value V is exact for as long as the counter reads V.
A read then costs one counter lookup instead of loading and encoding every
row: what lets many dashboards and orchestrators poll the host list of a large
fleet. Heartbeats do not bump the counter, which is why lease times live in
their own resource (``/hosts/{name}/lease``) and not in the host document.
The counter is read from the database for every request, so several servers
sharing one PostgreSQL stay correct; concurrent requests share that lookup
(``VersionReader``), and a cached answer is sent without leaving the event loop.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import anyio.to_thread
from fastapi import Request, Response
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.services.versions import current_resource_version

JSON_MEDIA = "application/json"
#: Smaller bodies go as they are: compressing them saves less than it costs.
GZIP_MIN_BYTES = 4096


class RenderedCache:
    """A small LRU of (key) -> (resourceVersion, encoded body); safe across the threadpool.

    Each body also keeps its gzip form once a client asked for it: a fleet's
    host list is hundreds of kilobytes of repetitive JSON, compressed once per
    version instead of once per request.
    """

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, tuple[int, bytes, bytes | None]] = OrderedDict()
        self._lock = threading.Lock()
        self._flights: dict[Hashable, asyncio.Task[tuple[int, bytes]]] = {}

    def get(self, key: Hashable, version: int, *, gzipped: bool = False) -> bytes | None:
        """The body at ``version``; ``gzipped``: its compressed form, if made already."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[2] if gzipped else entry[1]

    def compress(self, key: Hashable, version: int, body: bytes) -> bytes:
        """``body`` (the one cached at ``version``) gzip-compressed, kept with it while it is current."""
        packed = gzip.compress(body, compresslevel=6, mtime=0)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == version:
                self._entries[key] = (version, body, packed)
        return packed

    def put(self, key: Hashable, version: int, body: bytes) -> None:
        with self._lock:
            current = self._entries.get(key)
            if current is not None and current[0] > version:
                return  # a slower renderer of an older snapshot must not replace a newer body
            self._entries[key] = (version, body, None)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)

    async def render(self, key: Hashable, version: int, sessions: sessionmaker[Session],
                     render: Callable[[Session], bytes]) -> tuple[int, bytes]:
        """(version, body) rendered at ``version`` or later, and cached.

        One render per key at a time: when a write invalidates the host list
        under fifty pollers, the first renders and the others wait for it
        instead of all rendering the same hundreds of rows at once. A render
        already under way serves a request only if it reads at least the
        version that request must see; otherwise a new one starts after it.
        """
        loop = asyncio.get_running_loop()
        flight = self._flights.get(key)
        if flight is not None and flight.get_loop() is loop:
            rendered = await asyncio.shield(flight)
            if rendered[0] >= version:
                return rendered
        flight = self._flights.get(key)  # another waiter may have started the next one
        if flight is None or flight.get_loop() is not loop or flight.done():
            flight = loop.create_task(self._render(key, sessions, render))
            flight.add_done_callback(_retrieved)
            self._flights[key] = flight
        # shield: the request that started it going away must not cancel it for the others
        return await asyncio.shield(flight)

    async def _render(self, key: Hashable, sessions: sessionmaker[Session],
                      render: Callable[[Session], bytes]) -> tuple[int, bytes]:
        try:
            version, body = await anyio.to_thread.run_sync(_render, sessions, render)
            self.put(key, version, body)
            return version, body
        finally:
            if self._flights.get(key) is asyncio.current_task():
                del self._flights[key]


class VersionReader:
    """The current resourceVersion for many concurrent requests, one database lookup per batch.

    A request must see every write committed before it arrived, so it never
    joins a lookup already under way: it waits for the next one, which starts
    when the current one ends and answers everyone who arrived meanwhile.
    Under load one threadpool hop serves dozens of requests (a hop costs more
    CPU than the lookup itself).
    """

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: asyncio.Future[int] | None = None  # the next lookup's answer
        self._runner: asyncio.Task[None] | None = None

    async def current(self) -> int:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new event loop (tests start one per client): start afresh
            self._loop, self._waiting, self._runner = loop, None, None
        if self._waiting is None:
            self._waiting = loop.create_future()
        answer = self._waiting
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run())
        # shield: one caller going away must not cancel the lookup the others wait for
        return await asyncio.shield(answer)

    async def _run(self) -> None:
        while self._waiting is not None:
            answer, self._waiting = self._waiting, None
            try:
                version = await anyio.to_thread.run_sync(self._read)
            except Exception as exc:  # every waiter gets it, as if it had looked itself
                answer.set_exception(exc)
            else:
                answer.set_result(version)

    def _read(self) -> int:
        with self._sessions() as session:
            return current_resource_version(session)


def _retrieved(task: asyncio.Task[tuple[int, bytes]]) -> None:
    # Its waiters get its error; if they all went away, it must not be logged as lost.
    if not task.cancelled():
        task.exception()


def _etag(version: int, key: Hashable) -> str:
    digest = hashlib.blake2b(repr(key).encode(), digest_size=6).hexdigest()
    return f'W/"{version}-{digest}"'


def _render(sessions: sessionmaker[Session], render: Callable[[Session], bytes]) -> tuple[int, bytes]:
    with sessions() as session:  # the counter first: the body is at least as new as its version
        version = current_resource_version(session)
        return version, render(session)


def accepts_gzip(accept_encoding: str) -> bool:
    for coding in accept_encoding.lower().split(","):
        name, _, params = coding.partition(";")
        if name.strip() in ("gzip", "*"):
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


async def respond(request: Request, key: Hashable, render: Callable[[Session], bytes]) -> Response:
    """The body for ``key`` at the current resourceVersion, rendering it on a miss.

    ``render`` runs in the threadpool with a session of its own; a hit never
    leaves the event loop. The ETag is the resourceVersion plus the key, so
    ``If-None-Match`` gets a 304 without a body while nothing has been written.
    Bodies over a few kilobytes go gzip-compressed to clients that accept it.
    """
    cache: RenderedCache = request.app.state.rendered
    versions: VersionReader = request.app.state.versions
    version = await versions.current()
    etag = _etag(version, key)
    headers = {"ETag": etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    cached = cache.get(key, version)
    if cached is None:
        version, body = await cache.render(key, version, request.app.state.sessions, render)
        headers["ETag"] = _etag(version, key)
    else:
        body = cached
    if len(body) >= GZIP_MIN_BYTES and accepts_gzip(request.headers.get("accept-encoding", "")):
        packed = cache.get(key, version, gzipped=True)
        if packed is None:  # once per version, off the event loop
            packed = await anyio.to_thread.run_sync(cache.compress, key, version, body)
        headers["Content-Encoding"] = "gzip"
        body = packed
    return Response(body, media_type=JSON_MEDIA, headers=headers)
