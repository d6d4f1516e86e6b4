"""Several servers on one PostgreSQL database: ``replicas`` (who is alive) and
``shard_leases`` (which server works on which shard of the hosts, fenced by generation).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "shard_leases",
        sa.Column("shard", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("shard_leases")
    op.drop_table("replicas")
