"""Request bodies within bounds: at most ``max_body_bytes``, JSON at most ``max_depth`` deep.

An ASGI middleware so the bounds hold for every route, whoever parses the
body (FastAPI's models or read_document), and before any parser runs: a
Content-Length over the limit is refused without reading a byte, and a body
without one (chunked) is counted as it arrives. JSON nesting is measured on
the raw bytes as they stream in, so a document nested thousands deep is
refused before a recursive parser or validator could overflow the stack. YAML
bodies are measured by their parser's events (api/deps.py).
"""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stortune.server.api.handlers import status_response

# The bytes that matter for nesting: brackets, and what starts, ends or escapes a string.
_STRUCTURE = re.compile(rb'[][{}"\\]')
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
_QUOTE, _BACKSLASH = ord('"'), ord("\\")


def too_large_message(limit: int) -> str:
    return (f"the request body is larger than {limit} bytes, the limit of this server "
            "(stortune-server --max-body-size)")


def too_deep_message(limit: int) -> str:
    return f"the body nests too deeply: more than {limit} levels of arrays and objects"


class JsonDepth:
    """Tracks the nesting depth of JSON text fed in pieces."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.depth = 0
        self._in_string = False
        self._escaped = False  # the previous piece ended with a backslash inside a string

    def feed(self, chunk: bytes) -> bool:
        """False as soon as the text nests deeper than the limit."""
        skip = -1
        if self._escaped and chunk:
            skip, self._escaped = 0, False
        for match in _STRUCTURE.finditer(chunk):
            at = match.start()
            if at == skip:
                continue
            byte = chunk[at]
            if self._in_string:
                if byte == _BACKSLASH:
                    skip = at + 1
                    self._escaped = skip == len(chunk)
                elif byte == _QUOTE:
                    self._in_string = False
            elif byte == _QUOTE:
                self._in_string = True
            elif byte in _OPEN:
                self.depth += 1
                if self.depth > self.limit:
                    return False
            elif byte in _CLOSE:
                self.depth -= 1
        return True


class BodyLimits:
    def __init__(self, app: ASGIApp, *, max_bytes: int, max_depth: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            response = status_response(413, "RequestEntityTooLarge", too_large_message(self.max_bytes))
            await response(scope, receive, send)
            return
        depth = None if "yaml" in headers.get("content-type", "") else JsonDepth(self.max_depth)
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                body: bytes = message.get("body", b"")
                seen += len(body)
                # HTTPException: the app's handler answers it (a Status body), and FastAPI's
                # body parsing lets it through instead of calling it a parse error.
                if seen > self.max_bytes:
                    raise HTTPException(413, too_large_message(self.max_bytes))
                if depth is not None and not depth.feed(body):
                    raise HTTPException(400, too_deep_message(self.max_depth))
            return message

        await self.app(scope, bounded, send)
