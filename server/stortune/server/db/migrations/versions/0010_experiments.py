"""Tuning experiments: ``experiments`` (the queue and the evidence), ``experiment_hosts`` (which
host an experiment owns, its baseline and originals), ``experiment_trials`` (one row per trial:
UNIQUE(experiment, host, index), so a trial is never recorded twice); and
``benchmark_runs.experiment``, the experiment a run is a trial of.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    with op.batch_alter_table("benchmark_runs") as batch:
        batch.add_column(sa.Column("experiment", sa.String(64), nullable=True))
    op.create_table(
        "experiments",
        sa.Column("seq", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("name", NAME, nullable=False),
        sa.Column("document", JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("hosts", JSON, nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("cancel_requested_at", TIME, nullable=True),
        sa.Column("outcome", JSON, nullable=True),
    )
    op.create_index("ix_experiments_state", "experiments", ["state", "seq"])
    op.create_index("ix_experiments_name", "experiments", ["name", "seq"])
    op.create_table(
        "experiment_hosts",
        sa.Column("experiment", sa.String(64), sa.ForeignKey("experiments.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("host", NAME, primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("device", sa.Text(), nullable=True),
        sa.Column("baseline", JSON, nullable=True),
        sa.Column("originals", JSON, nullable=True),
        sa.Column("current_trial", sa.Integer(), nullable=True),
        sa.Column("progress", JSON, nullable=False),
        sa.Column("outcome", JSON, nullable=True),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("updated_at", TIME, nullable=False),
    )
    op.create_index("ix_experiment_hosts_host", "experiment_hosts", ["host", "state"])
    op.create_table(
        "experiment_trials",
        sa.Column("experiment", sa.String(64), sa.ForeignKey("experiments.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("host", NAME, primary_key=True),
        sa.Column("index", sa.Integer(), primary_key=True),
        sa.Column("point", JSON, nullable=False),
        sa.Column("purpose", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("measurement", JSON, nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("finished_at", TIME, nullable=True),
        sa.UniqueConstraint("run_id", name="uq_experiment_trials_run_id"),
    )


def downgrade() -> None:
    op.drop_table("experiment_trials")
    op.drop_index("ix_experiment_hosts_host", "experiment_hosts")
    op.drop_table("experiment_hosts")
    op.drop_index("ix_experiments_name", "experiments")
    op.drop_index("ix_experiments_state", "experiments")
    op.drop_table("experiments")
    with op.batch_alter_table("benchmark_runs") as batch:
        batch.drop_column("experiment")
