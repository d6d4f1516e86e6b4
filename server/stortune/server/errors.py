"""Every error the API reports, in one place.

Services raise these; one exception handler turns them into a Kubernetes-style
``Status`` body. ``reason`` and ``code`` follow the Kubernetes StatusReason
values so clients written for that convention read them unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class Cause:
    """One invalid field: its path inside the document and what is wrong with it."""

    field: str
    message: str


class ApiError(Exception):
    code: ClassVar[int] = 500
    reason: ClassVar[str] = "InternalError"

    def __init__(self, message: str, *, kind: str | None = None, name: str | None = None,
                 causes: Sequence[Cause] = (), headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.name = name
        self.causes = list(causes)
        self.headers = dict(headers or {})


class BadRequest(ApiError):
    code = 400
    reason = "BadRequest"


class Unauthorized(ApiError):
    """No token, or one that is unknown, revoked or expired (RFC 6750)."""

    code = 401
    reason = "Unauthorized"

    def __init__(self, message: str, *, invalid_token: bool = False) -> None:
        challenge = 'Bearer realm="stortune"' + (', error="invalid_token"' if invalid_token else "")
        super().__init__(message, headers={"WWW-Authenticate": challenge})


class Forbidden(ApiError):
    """A valid token whose role may not do this."""

    code = 403
    reason = "Forbidden"


class NotFound(ApiError):
    code = 404
    reason = "NotFound"

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f'{kind} "{name}" not found', kind=kind, name=name)


class AlreadyExists(ApiError):
    code = 409
    reason = "AlreadyExists"

    def __init__(self, kind: str, name: str, message: str | None = None) -> None:
        super().__init__(message or f'{kind} "{name}" already exists', kind=kind, name=name)


class Conflict(ApiError):
    """The write was based on a stale read (resourceVersion), or the object is being deleted."""

    code = 409
    reason = "Conflict"


class Invalid(ApiError):
    code = 422
    reason = "Invalid"

    def __init__(self, causes: Sequence[Cause], *, kind: str | None = None,
                 name: str | None = None) -> None:
        what = f'{kind} "{name}"' if kind and name else (kind or "request")
        detail = "; ".join(f"{c.field}: {c.message}" if c.field else c.message for c in causes)
        super().__init__(f"{what} is invalid: {detail}", kind=kind, name=name, causes=causes)


class TooLarge(ApiError):
    """A request within the byte limit whose content is past another bound (nodes, a value's length)."""

    code = 413
    reason = "RequestEntityTooLarge"


class TooManyRequests(ApiError):
    code = 429
    reason = "TooManyRequests"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})
        self.retry_after_s = retry_after_s


class Unavailable(ApiError):
    code = 503
    reason = "ServiceUnavailable"
