"""Agents report their values' digest: ``host_leases.observed_digest``, the digest of the
values the host's agent last reported (heartbeat or watch), so the control plane learns of
drift when it happens instead of asking every host.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("host_leases") as batch:
        batch.add_column(sa.Column("observed_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("host_leases") as batch:
        batch.drop_column("observed_digest")
