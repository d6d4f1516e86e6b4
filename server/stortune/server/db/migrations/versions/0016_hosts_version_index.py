"""``ix_hosts_resource_version``: the in-memory fleet index (services/fleet_state.py) reads the
hosts written since its last look after every write; at 10,000 hosts without the index that
was a scan of the table each time.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_hosts_resource_version", "hosts", ["resource_version"])


def downgrade() -> None:
    op.drop_index("ix_hosts_resource_version", table_name="hosts")
