"""Fixed response headers on every answer under some paths, whoever made the answer.

A header set by a route is missing from the answers the route never makes: the 404 of an
unknown name, the 405 of another method, the redirect of a trailing slash. A middleware
sets them on all of those too.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class PathHeaders:
    """ASGI middleware: ``headers`` on every HTTP response at or under one of ``roots``."""

    def __init__(self, app: ASGIApp, *, roots: tuple[str, ...], headers: Mapping[str, str]) -> None:
        self.app = app
        self.roots = roots
        self.prefixes = tuple(root + "/" for root in roots)
        self.headers = dict(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path not in self.roots and not path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, with_headers)
