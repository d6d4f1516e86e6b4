"""Encoded GET responses, kept until the next write.

Every write bumps the one resourceVersion counter (services/versions.py), so a
body rendered at counter value V is exact for as long as the counter reads V.
A read then costs one counter lookup instead of loading and encoding every
row: what lets many dashboards and orchestrators poll the host list of a large
fleet. Heartbeats do not bump the counter, which is why lease times live in
their own resource (``/hosts/{name}/lease``) and not in the host document.
The counter is read from the database on every request, so several servers
sharing one PostgreSQL stay correct.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

from fastapi import Request, Response
from sqlalchemy.orm import Session

from stortune.server.services.versions import current_resource_version

JSON_MEDIA = "application/json"


class RenderedCache:
    """A small LRU of (key) -> (resourceVersion, encoded body); safe across the threadpool."""

    def __init__(self, size: int = 512) -> None:
        self._size = size
        self._entries: OrderedDict[Hashable, tuple[int, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, version: int) -> bytes | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: Hashable, version: int, body: bytes) -> None:
        with self._lock:
            current = self._entries.get(key)
            if current is not None and current[0] > version:
                return  # a slower renderer of an older snapshot must not replace a newer body
            self._entries[key] = (version, body)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)


def respond(request: Request, session: Session, key: Hashable, render: Callable[[], bytes]) -> Response:
    """The body for ``key`` at the current resourceVersion, rendering it on a miss.

    The ETag is the resourceVersion plus the key, so ``If-None-Match`` gets a 304
    without a body while nothing has been written.
    """
    cache: RenderedCache = request.app.state.rendered
    version = current_resource_version(session)
    digest = hashlib.blake2b(repr(key).encode(), digest_size=6).hexdigest()
    etag = f'W/"{version}-{digest}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    body = cache.get(key, version)
    if body is None:
        body = render()
        cache.put(key, version, body)
    return Response(body, media_type=JSON_MEDIA, headers=headers)
