"""Stored size texts keep the meaning they were stored with under the one size rule.

Up to 0008 a profile's ``match.size`` (and a BenchmarkSpec's ``target.device.size``,
the same model) read a bare letter as decimal: ``4T`` was 4 x 10^12 bytes, and
the bytes were ``int(float(number) * unit)``, so ``1.3K`` was 1300. The one rule
(``stortune.schemas.sizes``) reads a bare letter as binary (``4T`` = 4 TiB) and
refuses fractions that do not come out whole. Read with it, a stored
``min: 4T`` stops selecting the 4 TB disks it was written for, and the
reconciler would put their settings back on every host without anyone asking.

Each such text is rewritten to say what it meant: ``4T`` -> ``4TB``; a text the
rule reads the same way stays as written; one it cannot say that way becomes
the bytes it meant. Nothing else changes (not the generation: the meaning is
the same). Profiles, benchmark schedules and benchmark runs' specs.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from stortune.schemas.sizes import parse_size
from stortune.server.db.types import JSONDoc

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rule of 0008 and before (schemas/profile.py): decimal letters, binary with an i.
_EARLIER = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?B?|B)?\s*$", re.IGNORECASE)
_EARLIER_UNITS = {"": 1, "B": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
                  "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4, "PI": 1024**5}


def _earlier(text: str) -> int | None:
    m = _EARLIER.fullmatch(text)
    if m is None:
        return None
    try:
        return int(float(m.group(1)) * _EARLIER_UNITS[(m.group(2) or "").upper().rstrip("B")])
    except OverflowError:  # the earlier version failed on it too: never stored
        return None


def _now(text: str) -> int | None:
    try:
        return parse_size(text)
    except ValueError:
        return None


def as_meant(value: object) -> object:
    """``value`` as the rule now reads it to mean what the earlier rule read."""
    if not isinstance(value, str) or (meant := _earlier(value)) is None:
        return value  # bytes already, or nothing the earlier rule stored
    if _now(value) == meant:
        return value
    m = _EARLIER.fullmatch(value)
    assert m is not None
    letter = (m.group(2) or "")[:1].upper()
    if letter and letter != "B" and _now(candidate := f"{m.group(1)}{letter}B") == meant:
        return candidate
    return meant


def _ranges(spec: Any, where: str) -> Iterator[dict[str, Any]]:
    """The size ranges of a document's ``spec`` (profile rules, or a BenchmarkSpec's device)."""
    if not isinstance(spec, dict):
        return
    if where == "profile":
        for rule in spec.get("rules") or []:
            match = rule.get("match") if isinstance(rule, dict) else None
            if isinstance(match, dict) and isinstance(match.get("size"), dict):
                yield match["size"]
    else:
        target = spec.get("target")
        device = target.get("device") if isinstance(target, dict) else None
        if isinstance(device, dict) and isinstance(device.get("size"), dict):
            yield device["size"]


def rewritten(spec: Any, where: str) -> Any:
    """``spec``, its size texts rewritten in place to say what they meant; None when none changed."""
    changed = False
    for size in _ranges(spec, where):
        for bound in ("min", "max"):
            if bound in size and (meant := as_meant(size[bound])) != size[bound]:
                size[bound], changed = meant, True
    return spec if changed else None


def _rewrite(table: str, key: str, where: str) -> None:
    rows = sa.table(table, sa.column(key, sa.String), sa.column("spec", JSONDoc))
    conn = op.get_bind()
    for name, spec in conn.execute(sa.select(rows.c[key], rows.c.spec)).all():
        document = spec.get("spec") if where == "benchmark" and isinstance(spec, dict) else spec
        if rewritten(document, where) is not None:
            conn.execute(sa.update(rows).where(rows.c[key] == name).values(spec=spec))


def upgrade() -> None:
    _rewrite("profiles", "name", "profile")
    _rewrite("benchmark_schedules", "name", "benchmark")
    _rewrite("benchmark_runs", "id", "benchmark")


def downgrade() -> None:
    pass  # the texts written mean under the earlier rule what they meant before
