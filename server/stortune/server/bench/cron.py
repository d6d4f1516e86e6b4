"""Cron expressions of benchmark schedules: the five classic fields, evaluated in UTC.

``minute hour day-of-month month day-of-week`` with ``*``, lists, ranges,
steps and names (``0 3 * * mon-fri``, ``*/15 * * * *``), or one of
``@hourly @daily @midnight @weekly @monthly @yearly @annually``. When both
day fields are restricted a day matching either counts (Vixie cron's rule).

The arithmetic is croniter's (a widely used, maintained implementation whose
edge cases, month lengths and the day-field rule included, are well tested);
this module only narrows what is accepted to the standard form: croniter's
seconds and years fields, ``@reboot`` and hashed ``H`` values are refused
with a message naming what is wrong.
"""

from __future__ import annotations

from datetime import UTC, datetime

from croniter import CroniterError, croniter

_MACROS = frozenset({"@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly", "@annually"})
_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
_REFERENCE = datetime(2000, 1, 1, tzinfo=UTC)
_EXAMPLE = "e.g. '0 3 * * *' (03:00 UTC daily) or '*/30 * * * mon-fri'"


def check(expression: str) -> str:
    """The expression, normalised (single spaces); ValueError saying what is wrong."""
    text = " ".join(expression.split())
    if not text:
        raise ValueError(f"empty; give five fields: minute hour day-of-month month day-of-week, {_EXAMPLE}")
    if text.startswith("@"):
        if text.lower() not in _MACROS:
            raise ValueError(f"{text!r}: known shortcuts are {', '.join(sorted(_MACROS))}")
        return text.lower()
    fields = text.split(" ")
    if len(fields) != len(_FIELDS):
        raise ValueError(f"{text!r} has {len(fields)} fields; give five: minute hour day-of-month month "
                         f"day-of-week ({_EXAMPLE}); seconds and years are not supported")
    for index, (name, field) in enumerate(zip(_FIELDS, fields, strict=True)):
        alone = " ".join(field if i == index else "*" for i in range(len(_FIELDS)))
        if not croniter.is_valid(alone):
            raise ValueError(f"{text!r}: the {name} field {field!r} is not valid ({_EXAMPLE})")
    if not croniter.is_valid(text):
        raise ValueError(f"{text!r} is not a valid cron expression ({_EXAMPLE})")
    try:  # 0 0 31 2 * is well formed and never fires
        croniter(text, _REFERENCE).get_next(datetime)
    except CroniterError:
        raise ValueError(f"{text!r} never fires (no such day)") from None
    return text


def next_after(expression: str, moment: datetime) -> datetime:
    """The first fire time strictly after ``moment`` (aware), in UTC."""
    start = moment.astimezone(UTC)
    found: datetime = croniter(check(expression), start).get_next(datetime)
    return found.astimezone(UTC)
