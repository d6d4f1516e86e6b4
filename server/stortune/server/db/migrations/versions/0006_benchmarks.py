"""Benchmarks: ``benchmark_runs`` (the run queue and results), ``benchmark_raw`` (fio's files),
``benchmark_schedules`` (cron) and ``benchmark_baselines`` (reference runs per host class).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)
NAME = sa.String(253)


def upgrade() -> None:
    op.create_table(
        "benchmark_runs",
        sa.Column("seq", BIG_ID, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(64), nullable=False, unique=True),
        sa.Column("name", NAME, nullable=False),
        sa.Column("host", NAME, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("requested_by", sa.Text(), nullable=False),
        sa.Column("schedule", NAME, nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("progress", JSON, nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("started_at", TIME, nullable=True),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("cancel_requested_at", TIME, nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("not_before", TIME, nullable=True),
        sa.Column("unreachable_since", TIME, nullable=True),
        sa.Column("agent_holds", sa.Boolean(), nullable=False),
        sa.Column("profiles", JSON, nullable=False),
        sa.Column("kernel", sa.Text(), nullable=True),
        sa.Column("fio_version", sa.Text(), nullable=True),
        sa.Column("topology_hash", sa.Text(), nullable=True),
        sa.Column("passed", sa.Boolean(), nullable=True),
        sa.Column("result", JSON, nullable=True),
    )
    op.create_index("ix_benchmark_runs_host", "benchmark_runs", ["host", "seq"])
    op.create_index("ix_benchmark_runs_state", "benchmark_runs", ["state", "seq"])
    op.create_index("ix_benchmark_runs_schedule", "benchmark_runs", ["schedule", "seq"])
    op.create_index("ix_benchmark_runs_name", "benchmark_runs", ["name", "seq"])
    op.create_table(
        "benchmark_raw",
        sa.Column("run_id", sa.String(64), sa.ForeignKey("benchmark_runs.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("path", sa.String(512), primary_key=True),
        sa.Column("text", sa.Text(), nullable=False),
    )
    op.create_table(
        "benchmark_schedules",
        sa.Column("name", NAME, primary_key=True),
        sa.Column("cron", sa.String(256), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("suspended", sa.Boolean(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
        sa.Column("next_due_at", TIME, nullable=True),
        sa.Column("last_fired_at", TIME, nullable=True),
        sa.Column("last_message", sa.Text(), nullable=False),
    )
    op.create_index("ix_benchmark_schedules_next_due_at", "benchmark_schedules", ["next_due_at"])
    op.create_table(
        "benchmark_baselines",
        sa.Column("name", NAME, primary_key=True),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("benchmark_runs.id"), nullable=False),
        sa.Column("host_selector", JSON, nullable=False),
        sa.Column("benchmark", NAME, nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("updated_at", TIME, nullable=False),
        sa.Column("created_by", sa.Text(), nullable=False),
    )
    op.create_index("ix_benchmark_baselines_benchmark", "benchmark_baselines", ["benchmark"])


def downgrade() -> None:
    op.drop_index("ix_benchmark_baselines_benchmark", "benchmark_baselines")
    op.drop_table("benchmark_baselines")
    op.drop_index("ix_benchmark_schedules_next_due_at", "benchmark_schedules")
    op.drop_table("benchmark_schedules")
    op.drop_table("benchmark_raw")
    for index in ("ix_benchmark_runs_name", "ix_benchmark_runs_schedule", "ix_benchmark_runs_state",
                  "ix_benchmark_runs_host"):
        op.drop_index(index, "benchmark_runs")
    op.drop_table("benchmark_runs")
