"""The dashboard's sign-ins: ``ui_sessions``, one row per session cookie (its secret's SHA-256),
naming the token that signed in.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "ui_sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("token_id", sa.String(16), sa.ForeignKey("api_tokens.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
    )
    op.create_index("ix_ui_sessions_token", "ui_sessions", ["token_id"])
    op.create_index("ix_ui_sessions_expires", "ui_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_ui_sessions_expires", "ui_sessions")
    op.drop_index("ix_ui_sessions_token", "ui_sessions")
    op.drop_table("ui_sessions")
