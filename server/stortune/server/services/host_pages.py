"""Which hosts a list request shows: label selector, conditions, the caller's scope, one page.

Answered from the in-memory fleet index (services/fleet_state.py), never by reading
every host's status: a dashboard paging through 10,000 hosts, filtering on Drifted,
must cost the page it shows. Pages follow Kubernetes' list chunking: ``limit`` and an
opaque ``continue`` token naming where the next page starts, plus how many items
remain. A token holds the last name shown, not a snapshot: a host added or removed
between pages shows up (or not) where its name sorts, nothing is shown twice.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from stortune.schemas.profile import LabelSelector
from stortune.server.errors import Cause, Invalid
from stortune.server.services.fleet_state import HostRecord

#: The largest page; a list without ``limit`` is the whole fleet, as before paging.
MAX_LIMIT = 1000
#: At most this many ``condition`` filters, each at most this long.
MAX_CONDITIONS = 8
MAX_CONDITION_TEXT = 80
#: A continue token's length bound (a host name is at most 253 characters).
MAX_CONTINUE = 512
STATUSES = ("True", "False", "Unknown")
_CONDITION_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9]{0,63}")
_TOKEN_VERSION = 1

#: (condition type, status) pairs that must all hold.
ConditionFilter = tuple[tuple[str, str], ...]


def parse_conditions(values: Sequence[str] | None) -> ConditionFilter:
    """``["Drifted=True", "Ready=False"]`` -> pairs; 422 naming ``condition`` otherwise."""
    if not values:
        return ()
    if len(values) > MAX_CONDITIONS:
        raise Invalid([Cause("condition", f"at most {MAX_CONDITIONS} conditions, got {len(values)}")])
    pairs: list[tuple[str, str]] = []
    for value in values:
        kind, sep, status = value.partition("=")
        if len(value) > MAX_CONDITION_TEXT or not sep or not _CONDITION_TYPE.fullmatch(kind) \
                or status not in STATUSES:
            shown = value if len(value) <= MAX_CONDITION_TEXT else value[:MAX_CONDITION_TEXT] + "..."
            raise Invalid([Cause("condition", f"{shown!r}: expected TYPE=STATUS with STATUS one of"
                                              f" {', '.join(STATUSES)}, e.g. Drifted=True")])
        pairs.append((kind, status))
    return tuple(sorted(set(pairs)))


def status_of(record: HostRecord, kind: str) -> str:
    """The condition's status, "Unknown" when the host has not got it (yet)."""
    found = record.conditions.get(kind)
    return found[0] if found is not None and found[0] in STATUSES else "Unknown"


def matching(records: Mapping[str, HostRecord], names: Iterable[str], *,
             selector: LabelSelector | None, conditions: ConditionFilter,
             visible: Callable[[Mapping[str, str]], bool]) -> list[str]:
    """``names`` (in their order) whose records pass every filter."""
    out = []
    for name in names:
        record = records.get(name)
        if record is None or not visible(record.labels):
            continue
        if selector is not None and not selector.matches(record.labels):
            continue
        if any(status_of(record, kind) != status for kind, status in conditions):
            continue
        out.append(name)
    return out


def encode_continue(after: str) -> str:
    raw = json.dumps({"v": _TOKEN_VERSION, "after": after}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_continue(token: str) -> str:
    """The last name of the previous page; 422 naming ``continue`` for anything else."""
    def refuse(why: str) -> Invalid:
        return Invalid([Cause("continue", f"{why}: pass metadata.continue of the previous page as it"
                                          " is, or leave it out to start from the first host")])

    if len(token) > MAX_CONTINUE or not token.isascii():
        raise refuse("not a continue token this server issued")
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise refuse("not a continue token this server issued") from None
    if not isinstance(data, dict) or data.get("v") != _TOKEN_VERSION \
            or not isinstance(data.get("after"), str):
        raise refuse("not a continue token this server issued")
    return str(data["after"])


@dataclass(frozen=True)
class Page:
    names: list[str]
    #: The token for the next page; None on the last one.
    next: str | None
    #: How many matching hosts come after this page.
    remaining: int


def page(names: Sequence[str], *, limit: int, after: str | None) -> Page:
    """One page of sorted ``names``, starting after the name ``after``."""
    start = 0 if after is None else bisect.bisect_right(names, after)
    shown = list(names[start:start + limit])
    remaining = max(0, len(names) - start - len(shown))
    return Page(shown, encode_continue(shown[-1]) if remaining and shown else None, remaining)


def count_conditions(records: Mapping[str, HostRecord], names: Iterable[str],
                     kinds: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per condition type, how many of ``names`` have each status (missing counts as Unknown)."""
    counts = {kind: dict.fromkeys(STATUSES, 0) for kind in kinds}
    for name in names:
        record = records[name]
        for kind in kinds:
            counts[kind][status_of(record, kind)] += 1
    return counts


def count_applied(records: Mapping[str, HostRecord], names: Iterable[str]) -> dict[str, dict[str, int]]:
    """Per profile, how many of ``names`` last applied each of its generations."""
    counts: dict[str, dict[str, int]] = {}
    for name in names:
        for profile, generation in records[name].applied.items():
            per = counts.setdefault(profile, {})
            per[str(generation)] = per.get(str(generation), 0) + 1
    return counts
