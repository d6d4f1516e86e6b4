"""mTLS: ``agent_identities``, the key each host name's certificates are issued to.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "agent_identities",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("key_sha256", sa.String(64), nullable=False),
        sa.Column("first_issued_at", TIME, nullable=False),
        sa.Column("last_issued_at", TIME, nullable=False),
        sa.Column("expires_at", TIME, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("agent_identities")
