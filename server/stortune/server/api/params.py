"""Query parameter types the routes share.

A parameter documented as ``format: date-time`` takes an RFC 3339 date-time and
nothing else. pydantic alone would also read ``1`` (a Unix time), ``2025-03-01``
(a date) and ``2025-03-01 12:00`` as times, which the documentation does not
promise and a client cannot rely on; each of those is a 422 naming the parameter.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Final

from pydantic import BeforeValidator

#: YYYY-MM-DDTHH:MM:SS, a fraction, and a zone (Z or ±HH:MM; none means UTC, as everywhere in the API).
_RFC3339: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?(?:[Zz]|[+-][0-9]{2}:[0-9]{2})?")
_LONGEST: Final = 40
_EXAMPLE: Final = "an RFC 3339 date-time like 2025-03-01T12:00:00Z or 2025-03-01T13:00:00+01:00"


def date_time(value: object) -> datetime:
    """An RFC 3339 date-time text -> an aware datetime (UTC when it names no zone)."""
    if isinstance(value, datetime):  # called from Python with a value already typed
        parsed = value
    elif not isinstance(value, str) or len(value) > _LONGEST or not _RFC3339.fullmatch(value):
        raise ValueError(f"{str(value)[:_LONGEST]!r} is not {_EXAMPLE}")
    else:
        try:
            parsed = datetime.fromisoformat(value.upper())
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a valid date-time: {exc}") from None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    try:  # in UTC here, as the database compares it: 0001-01-01T00:00:00+23:59 is before year 1
        return parsed.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{str(value)[:_LONGEST]!r} is not a date-time of the years 1 to 9999 in UTC"
                         ) from None


#: A date-time query parameter: ``since: Annotated[DateTime | None, Query(...)] = None``.
DateTime = Annotated[datetime, BeforeValidator(date_time)]
