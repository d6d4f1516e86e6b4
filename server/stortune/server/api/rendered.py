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
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import anyio.to_thread
from fastapi import Request, Response
from sqlalchemy.orm import Session, sessionmaker

from stortune.server.services.versions import VersionReader, current_resource_version
from stortune.server.versioned import VersionedCache

JSON_MEDIA = "application/json"
#: (resourceVersion, body, the body gzip-compressed or None when it is small)
Rendered = tuple[int, bytes, bytes | None]
#: Smaller bodies go as they are: compressing them saves less than it costs.
GZIP_MIN_BYTES = 4096


class RenderedCache:
    """A small LRU of (key) -> (resourceVersion, encoded body); safe across the threadpool.

    A body of more than a few kilobytes also keeps its gzip form, made by the
    render that made it: a fleet's host list is hundreds of kilobytes of
    repetitive JSON, compressed once per version (about 2 ms for 200 hosts)
    instead of by every poller that arrives after a write.
    """

    def __init__(self, size: int = 512) -> None:
        self._entries: VersionedCache[Hashable, Rendered] = VersionedCache(size)
        self._flights: dict[Hashable, asyncio.Task[Rendered]] = {}

    def get(self, key: Hashable, version: int) -> Rendered | None:
        """The body at ``version``, with its gzip form when it is large enough to have one."""
        return self._entries.get(key, version)

    def put(self, key: Hashable, version: int, body: bytes) -> Rendered:
        """Keep ``body`` (and its gzip form) as ``key`` at ``version``; call it off the event loop."""
        packed = gzip.compress(body, compresslevel=3, mtime=0) if len(body) >= GZIP_MIN_BYTES else None
        entry = (version, body, packed)
        self._entries.put(key, version, entry)
        return entry

    async def render(self, key: Hashable, version: int, sessions: sessionmaker[Session],
                     render: Callable[[Session], bytes]) -> Rendered:
        """(version, body, gzipped body) rendered at ``version`` or later, and cached.

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
                      render: Callable[[Session], bytes]) -> Rendered:
        def render_and_keep() -> Rendered:
            return self.put(key, *_render(sessions, render))

        try:
            return await anyio.to_thread.run_sync(render_and_keep)
        finally:
            if self._flights.get(key) is asyncio.current_task():
                del self._flights[key]


class DocumentCache:
    """Each object's encoded document at its own resourceVersion: what lists are assembled from.

    A write changes one host's resourceVersion; the next list render encodes
    that host again and joins the others as they were, instead of loading and
    encoding the whole fleet after every write. Safe across the threadpool.
    """

    def __init__(self, size: int = 50_000) -> None:
        self._docs: VersionedCache[str, bytes] = VersionedCache(size)

    def encoded(self, wanted: Sequence[tuple[str, int]],
                render: Callable[[Sequence[str]], Iterable[tuple[str, int, bytes]]]) -> list[bytes]:
        """The documents of ``wanted`` (name, resourceVersion), in its order.

        ``render(names)`` encodes the ones not kept at that version, as (name,
        resourceVersion, document), all in one call; a name it does not return
        (deleted meanwhile) is left out.
        """
        kept = {name: doc for name, version in wanted if (doc := self._docs.get(name, version)) is not None}
        missing = [name for name, _ in wanted if name not in kept]
        if missing:
            for name, version, body in render(missing):
                self._docs.put(name, version, body)
                kept[name] = body
        return [kept[name] for name, _ in wanted if name in kept]


def join_list(envelope: bytes, items: Sequence[bytes]) -> bytes:
    """``envelope``, a list document encoded with no items, with ``items`` in it."""
    empty = b'"items":[]}'
    if not envelope.endswith(empty):
        raise ValueError("the list envelope must end with its empty items")
    return b"".join((envelope[:-len(empty)], b'"items":[', b",".join(items), b"]}"))


def _retrieved(task: asyncio.Task[Rendered]) -> None:
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


def _answer(headers: Mapping[str, str], key: Hashable, version: int, rendered: Rendered | None) -> Response:
    """A 304 when the client holds ``version`` already, else ``rendered`` (gzip when accepted)."""
    etag = _etag(version, key)
    out = {"ETag": etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
    if headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=out)
    assert rendered is not None  # callers render first unless the client's copy is current
    _, body, packed = rendered
    if packed is not None and accepts_gzip(headers.get("accept-encoding", "")):
        out["Content-Encoding"] = "gzip"
        body = packed
    return Response(body, media_type=JSON_MEDIA, headers=out)


async def _kept(app: Any, headers: Mapping[str, str], key: Hashable) -> tuple[int, Response | None]:
    versions: VersionReader = app.state.versions
    version = await versions.current()
    cache: RenderedCache = app.state.rendered
    rendered = cache.get(key, version)
    if rendered is None and headers.get("if-none-match") != _etag(version, key):
        return version, None
    return version, _answer(headers, key, version, rendered)


async def kept(app: Any, headers: Mapping[str, str], key: Hashable) -> Response | None:
    """The answer for ``key`` if it needs no rendering (a 304, or a body kept at the current
    resourceVersion); None otherwise. Never leaves the event loop but for the shared counter read."""
    return (await _kept(app, headers, key))[1]


async def respond(request: Request, key: Hashable, render: Callable[[Session], bytes]) -> Response:
    """The body for ``key`` at the current resourceVersion, rendering it on a miss.

    ``render`` runs in the threadpool with a session of its own; a hit never
    leaves the event loop. The ETag is the resourceVersion plus the key, so
    ``If-None-Match`` gets a 304 without a body while nothing has been written.
    Bodies over a few kilobytes go gzip-compressed to clients that accept it.
    """
    version, found = await _kept(request.app, request.headers, key)
    if found is not None:
        return found
    cache: RenderedCache = request.app.state.rendered
    rendered = await cache.render(key, version, request.app.state.sessions, render)
    return _answer(request.headers, key, rendered[0], rendered)
