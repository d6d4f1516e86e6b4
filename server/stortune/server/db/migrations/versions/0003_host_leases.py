"""Host leases move out of ``hosts`` into ``host_leases``.

A heartbeat renews only the lease; in its own narrow row that is a small
write instead of rewriting a host row that carries the topology and the
settings table (SQLite rewrites whole rows).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    op.create_table(
        "host_leases",
        sa.Column("name", NAME, sa.ForeignKey("hosts.name", ondelete="CASCADE"), primary_key=True),
        sa.Column("renew_time", TIME, nullable=False),
        sa.Column("expire_time", TIME, nullable=False),
    )
    op.create_index("ix_host_leases_expire_time", "host_leases", ["expire_time"])
    op.execute("INSERT INTO host_leases (name, renew_time, expire_time) "
               "SELECT name, last_heartbeat, lease_expires FROM hosts")
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("last_heartbeat")
        batch.drop_column("lease_expires")


def downgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("last_heartbeat", TIME, nullable=True))
        batch.add_column(sa.Column("lease_expires", TIME, nullable=True))
    op.execute("UPDATE hosts SET last_heartbeat = (SELECT renew_time FROM host_leases l "
               "WHERE l.name = hosts.name), lease_expires = (SELECT expire_time FROM host_leases l "
               "WHERE l.name = hosts.name)")
    with op.batch_alter_table("hosts") as batch:
        batch.alter_column("last_heartbeat", nullable=False)
        batch.alter_column("lease_expires", nullable=False)
    op.drop_index("ix_host_leases_expire_time", "host_leases")
    op.drop_table("host_leases")
