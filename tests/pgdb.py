"""A PostgreSQL database of one's own: made on a server, dropped afterwards (its connections too).

Shared by the server tests' fixtures (tests/server/conftest.py) and the fleet bench
(bench/fleet.py), which both run stortune-server on a fresh database.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url


@contextlib.contextmanager
def fresh_database(admin_url: str, name: str, connect_timeout: int = 3) -> Iterator[str]:
    """CREATE DATABASE ``name`` on the server of ``admin_url`` and yield its SQLAlchemy URL
    (psycopg driver); DROP it WITH (FORCE) at the end, whatever happened meanwhile.
    psycopg.OperationalError when the server cannot be reached."""
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=connect_timeout) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        try:
            url = make_url(admin_url).set(drivername="postgresql+psycopg", database=name)
            yield url.render_as_string(hide_password=False)
        finally:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
