"""Probes: ``probes`` holds each probe of a host's device and, once done, its ProbeResult
(the measured ceilings the host analysis uses).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    op.create_table(
        "probes",
        sa.Column("seq", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("host", NAME, nullable=False),
        sa.Column("device", NAME, nullable=True),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("result", JSON, nullable=True),
    )
    op.create_index("ix_probes_host", "probes", ["host", "seq"])


def downgrade() -> None:
    op.drop_index("ix_probes_host", table_name="probes")
    op.drop_table("probes")
