"""REST authentication: ``api_tokens`` (hashed bearer tokens with a role) and ``audit_log``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(16), primary_key=True),
        sa.Column("secret_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("name", NAME, nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("host_selector", sa.Text(), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("expires_at", TIME, nullable=True),
        sa.Column("last_used_at", TIME, nullable=True),
        sa.Column("revoked_at", TIME, nullable=True),
        sa.Column("revoked_by", sa.Text(), nullable=True),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("at", TIME, nullable=False),
        sa.Column("token_id", sa.String(16), nullable=False),
        sa.Column("token_name", NAME, nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("resource", sa.Text(), nullable=False),
        sa.Column("code", sa.Integer(), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_token", "audit_log", ["token_id", "at"])


def downgrade() -> None:
    op.drop_index("ix_audit_log_token", "audit_log")
    op.drop_index("ix_audit_log_at", "audit_log")
    op.drop_table("audit_log")
    op.drop_table("api_tokens")
