"""Initial schema: profiles, hosts, events, host condition history, counters.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported from the models: a migration must keep
# meaning what it meant when it was written.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    counters = op.create_table(
        "counters",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(counters, [{"name": "resourceVersion", "value": 0}])

    op.create_table(
        "profiles",
        sa.Column("name", NAME, primary_key=True),
        sa.Column("uid", sa.String(36), nullable=False, unique=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("annotations", JSON, nullable=False),
        sa.Column("status", JSON, nullable=False),
        sa.Column("finalizers", JSON, nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("deletion_timestamp", TIME, nullable=True),
    )

    op.create_table(
        "hosts",
        sa.Column("name", NAME, primary_key=True),
        sa.Column("uid", sa.String(36), nullable=False, unique=True),
        sa.Column("labels", JSON, nullable=False),
        sa.Column("reported_labels", JSON, nullable=False),
        sa.Column("address", sa.Text(), nullable=False),
        sa.Column("facts", JSON, nullable=False),
        sa.Column("topology", JSON, nullable=True),
        sa.Column("topology_hash", sa.Text(), nullable=True),
        sa.Column("boot_id", sa.Text(), nullable=True),
        sa.Column("registered_at", TIME, nullable=False),
        sa.Column("last_heartbeat", TIME, nullable=False),
        sa.Column("lease_expires", TIME, nullable=False),
        sa.Column("ready", sa.Boolean(), nullable=False),
        sa.Column("resource_version", sa.BigInteger(), nullable=False),
        sa.Column("status", JSON, nullable=False),
        sa.Column("applied_generations", JSON, nullable=False),
    )

    op.create_table(
        "events",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("host", NAME, nullable=True),
        sa.Column("profile", NAME, nullable=True),
        sa.Column("type", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("involved_kind", sa.String(64), nullable=False),
        sa.Column("involved_name", NAME, nullable=False),
        sa.Column("first_timestamp", TIME, nullable=False),
        sa.Column("last_timestamp", TIME, nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
    )
    op.create_index("ix_events_last_timestamp", "events", ["last_timestamp"])
    op.create_index("ix_events_host", "events", ["host", "last_timestamp"])
    op.create_index("ix_events_profile", "events", ["profile", "last_timestamp"])
    op.create_index("ix_events_involved", "events", ["involved_kind", "involved_name", "id"])

    op.create_table(
        "host_conditions_history",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("host", NAME, sa.ForeignKey("hosts.name", ondelete="CASCADE"), nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.String(128), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("at", TIME, nullable=False),
    )
    op.create_index("ix_host_conditions_history_host", "host_conditions_history", ["host", "at"])


def downgrade() -> None:
    op.drop_table("host_conditions_history")
    op.drop_table("events")
    op.drop_table("hosts")
    op.drop_table("profiles")
    op.drop_table("counters")
