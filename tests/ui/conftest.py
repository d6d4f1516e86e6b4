"""The dashboard's tests reuse the control plane's fixtures: every API test on SQLite and PostgreSQL."""

from tests.server.conftest import (  # noqa: F401 - fixtures, registered by being imported here
    agent_pki,
    app,
    client,
    clock,
    db_url,
    make_app,
    pg_database,
    sqlite_template,
    token_for,
)
