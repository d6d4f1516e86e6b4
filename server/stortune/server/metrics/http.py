"""REST request duration and response codes by route template, never the raw path.

A path holds host names, run ids and whatever a scanner sends; labelling by it
would grow a series per request. The template (``/api/v1/hosts/{name}``) is
what the router matched; a request answered before routing (401, or a read
the cached-reads middleware answered) carries the template it noted, and one
that matched nothing is ``(unmatched)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stortune.server.metrics.recorder import Recorder

#: A middleware answering before routing may note the template it answered for here.
ROUTE_TEMPLATE = "stortune.route_template"
UNMATCHED = "(unmatched)"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def template_of(scope: Scope, templates: Mapping[int, str]) -> str:
    noted = scope.get(ROUTE_TEMPLATE)
    if isinstance(noted, str):
        return noted
    route = scope.get("route")
    if route is None:
        return UNMATCHED
    path = templates.get(id(route), getattr(route, "path", None))
    return path if isinstance(path, str) else UNMATCHED


class RequestMetrics:
    """ASGI middleware, outermost: it times what the caller waits for, refusals included."""

    def __init__(self, app: ASGIApp, *, recorder: Recorder,
                 templates: Callable[[Any], Mapping[int, str]]) -> None:
        self.app = app
        self.recorder = recorder
        self._templates_of = templates
        self._templates: Mapping[int, str] | None = None  # the app's routes are final by the first request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        code = 500

        async def note(message: Message) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, note)
        finally:
            method = scope["method"] if scope["method"] in _METHODS else "OTHER"
            if self._templates is None:
                self._templates = self._templates_of(scope["app"])
            self.recorder.request(method, template_of(scope, self._templates), code,
                                  time.perf_counter() - started)
