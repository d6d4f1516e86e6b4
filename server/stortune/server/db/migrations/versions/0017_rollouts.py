"""Progressive rollouts (issue 27): ``profile_generations`` (a profile as it was at a
generation, None a tombstone), ``rollouts`` (a profile's latest rollout: the machine's state),
``rollout_pins`` (the generation a host must hold while a rollout moves it) and
``rollout_analyses`` (a canary's before- and after-run and the noise rule's verdict).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    op.create_table(
        "profile_generations",
        sa.Column("profile", NAME, primary_key=True),
        sa.Column("generation", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("spec", JSON, nullable=True),
        sa.Column("created_at", TIME, nullable=False),
    )
    op.create_table(
        "rollouts",
        sa.Column("profile", NAME, primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("state", JSON, nullable=False),
        sa.Column("known", JSON, nullable=False),
        sa.Column("commands", JSON, nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
    )
    op.create_index("ix_rollouts_phase", "rollouts", ["phase"])
    op.create_table(
        "rollout_pins",
        sa.Column("profile", NAME, primary_key=True),
        sa.Column("host", NAME, primary_key=True),
        sa.Column("generation", sa.Integer(), nullable=False),
    )
    op.create_index("ix_rollout_pins_host", "rollout_pins", ["host"])
    op.create_table(
        "rollout_analyses",
        sa.Column("profile", NAME, primary_key=True),
        sa.Column("generation", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("host", NAME, primary_key=True),
        sa.Column("before_run", sa.String(64), nullable=True),
        sa.Column("after_run", sa.String(64), nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("detail", JSON, nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("rollout_analyses")
    op.drop_index("ix_rollout_pins_host", "rollout_pins")
    op.drop_table("rollout_pins")
    op.drop_index("ix_rollouts_phase", "rollouts")
    op.drop_table("rollouts")
    op.drop_table("profile_generations")
