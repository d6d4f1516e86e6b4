"""Hosts: ``lease_expired``, set when the lease runs out and cleared by the next heartbeat.

Ready became the reconciler's verdict (Reachable, Applied, not Drifted), so a
heartbeat can no longer use ``ready`` to learn whether its lease had lapsed.

Revision ID: 0002
Revises: 0001
Create Date: 2025-03-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("lease_expired", sa.Boolean(), nullable=False,
                                   server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("lease_expired")
