"""Large JSON bodies of the model routes, parsed and judged off the event loop.

FastAPI parses and validates a body on the event loop, even for a sync route: one
7 MiB registration of 400,000 facts held /healthz for about 2 s (issue 26). Routes
of this class parse a body over ``INLINE_BYTES`` in the document parsers' threads
(api/documents.py: bounded, 503 when flooded) and validate it there too, so a
large invalid body is answered 422 without the loop doing its work. A valid one is
validated again by FastAPI as usual: large valid bodies (a topology) are rare, and
their models bound them. Small bodies, heartbeats above all, skip the thread hop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel

from stortune.server.api.documents import Parsers

#: Bodies up to this size are parsed inline: about a millisecond of json.loads.
INLINE_BYTES = 64 * 1024
_UNSET: Any = object()


class _ParsedRequest(Request):
    """A request whose JSON body may have been parsed already, in a worker thread."""

    parsed: Any = _UNSET

    async def json(self) -> Any:
        return await super().json() if self.parsed is _UNSET else self.parsed


def _invalid_json(exc: json.JSONDecodeError) -> RequestValidationError:
    # The error FastAPI gives for a body that is not JSON.
    return RequestValidationError([{"type": "json_invalid", "loc": ("body", exc.pos),
                                    "msg": "JSON decode error", "input": {}, "ctx": {"error": exc.msg}}],
                                  body=exc.doc)


def _whole_body_model(route: APIRoute) -> Any:
    """The route's body parameter when it is one model, not embedded: FastAPI validates the
    whole body against it at loc ("body",). None otherwise (the body is then only parsed here)."""
    params = route.dependant.body_params
    if len(params) != 1 or getattr(params[0].field_info, "embed", False):
        return None
    annotation = params[0].field_info.annotation
    return params[0] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


class OffLoopBodyRoute(APIRoute):
    """Give a router ``route_class=OffLoopBodyRoute``: its large JSON bodies are parsed in a thread."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        field = _whole_body_model(self)

        def judged(body: bytes) -> Any:
            try:
                value = json.loads(body)
            except json.JSONDecodeError as exc:
                raise _invalid_json(exc) from None
            if field is not None:
                _, errors = field.validate(value, {}, loc=("body",))
                if errors:
                    raise RequestValidationError(errors, body=value)
            return value

        async def route(request: Request) -> Response:
            request = _ParsedRequest(request.scope, request.receive)
            if "json" in request.headers.get("content-type", "") and \
                    int(request.headers.get("content-length") or INLINE_BYTES + 1) > INLINE_BYTES:
                body = await request.body()
                if len(body) > INLINE_BYTES:
                    parsers: Parsers = request.app.state.document_parsers
                    request.parsed = await parsers.run(judged, body)
            return await handler(request)

        return route
