"""Every error leaves the API as a Status body (see models/status.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from stortune.schemas.documents import field_path
from stortune.server.errors import ApiError
from stortune.server.models.status import Status, StatusCause, StatusDetails

log = logging.getLogger(__name__)
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
            405: "MethodNotAllowed", 406: "NotAcceptable", 409: "Conflict", 413: "RequestEntityTooLarge",
            415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests"}


class _StatusJSON(JSONResponse):
    """A Status quotes what the client sent, which may hold a lone surrogate (JSON's "\\ud800"
    in a name): UTF-8 cannot encode it, so such a body goes out with non-ASCII escaped
    instead of failing as a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def status_response(
    code: int, reason: str, message: str, details: StatusDetails | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = Status(code=code, reason=reason, message=message, details=details or StatusDetails())
    return _StatusJSON(body.model_dump(mode="json", exclude_none=True), status_code=code, headers=headers)


def error_response(exc: ApiError) -> JSONResponse:
    details = StatusDetails(name=exc.name, kind=exc.kind,
                            causes=[StatusCause(field=c.field, message=c.message) for c in exc.causes])
    return status_response(exc.code, exc.reason, exc.message, details, exc.headers)


def _api_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc)


def _cause(error: Any) -> StatusCause:
    loc = tuple(error.get("loc", ()))
    if loc[:1] == ("body",):
        loc = loc[1:]  # paths are relative to the body, as in documents
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    if error.get("type") == "extra_forbidden":
        message = "unknown field"
    return StatusCause(field=field_path(loc), message=message)


def _request_invalid(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    causes = [_cause(e) for e in exc.errors()]
    summary = "; ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
    return status_response(422, "Invalid", f"request is invalid: {summary}", StatusDetails(causes=causes))


#: The order methods are listed in ``Allow``.
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path, and OPTIONS.

    Starlette answers 405 with the methods of the first route whose path matched,
    but one path often has several routes (GET, PUT and DELETE of /profiles/{name}
    are registered apart). So each method is tried against all the app's routes,
    through the routes' own ``matches``: the same decision the router makes.
    """
    routes = request.app.router.routes
    served = [method for method in _METHODS[:-1]
              if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)]
    return [*served, "OPTIONS"]


def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request))
        if request.method == "OPTIONS":  # what may I do here? The Allow header is the answer.
            return Response(status_code=204, headers=headers)
    return status_response(exc.status_code, _REASONS.get(exc.status_code, "Unknown"), str(exc.detail),
                           headers=headers)


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error in %s %s", request.method, request.url.path, exc_info=exc)
    return status_response(500, "InternalError", "internal error; the server log has the details")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
