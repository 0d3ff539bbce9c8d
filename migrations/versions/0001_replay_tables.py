"""Replay results: runs, per-policy summaries, per-step and per-worker series.

Revision ID: 0001
Revises:
Create Date: 2025-01-01 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # DuckDB has no SERIAL: run ids come from a sequence.
    op.execute(sa.schema.CreateSequence(sa.Sequence("replay_runs_id_seq")))
    op.create_table(
        "replay_runs",
        sa.Column(
            "id",
            sa.BigInteger(),
            server_default=sa.text("nextval('replay_runs_id_seq')"),
            nullable=False,
        ),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("trace", sa.Text(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("a_ms_per_token", sa.Double(), nullable=False),
        sa.Column("b_ms", sa.Double(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=True),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("tool_version", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_replay_runs"),
    )
    op.create_table(
        "replay_policy_summaries",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("policy", sa.String(), nullable=False),
        sa.Column("imbalance_mean", sa.Double(), nullable=True),
        sa.Column("gap_mean", sa.Double(), nullable=True),
        sa.Column("idle_frac", sa.Double(), nullable=True),
        sa.Column("throughput_tok_s", sa.Double(), nullable=True),
        sa.Column("tpot_p50_ms", sa.Double(), nullable=True),
        sa.Column("tpot_p95_ms", sa.Double(), nullable=True),
        sa.Column("tpot_p99_ms", sa.Double(), nullable=True),
        sa.Column("pool_wait_p95_ms", sa.Double(), nullable=True),
        sa.Column("sched_ms_p50", sa.Double(), nullable=True),
        sa.Column("sched_ms_p99", sa.Double(), nullable=True),
        sa.Column("steps", sa.BigInteger(), nullable=True),
        sa.Column("makespan_s", sa.Double(), nullable=True),
        sa.Column("output_tokens", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["replay_runs.id"],
            name="fk_replay_policy_summaries_run_id_replay_runs",
        ),
        sa.PrimaryKeyConstraint("run_id", "policy", name="pk_replay_policy_summaries"),
    )
    # Bulk series: no PK/FK/index on purpose (DuckDB ART indexes cost ~4.5x on append);
    # rows are appended clustered by (run_id, policy, step) so zonemaps prune by run.
    op.create_table(
        "replay_steps",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("policy", sa.String(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("start_ms", sa.Double(), nullable=False),
        sa.Column("duration_ms", sa.Double(), nullable=False),
        sa.Column("max_load", sa.BigInteger(), nullable=False),
        sa.Column("min_load", sa.BigInteger(), nullable=False),
        sa.Column("sum_load", sa.BigInteger(), nullable=False),
        sa.Column("active", sa.Integer(), nullable=False),
    )
    op.create_table(
        "replay_worker_loads",
        sa.Column("run_id", sa.BigInteger(), nullable=False),
        sa.Column("policy", sa.String(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("worker", sa.Integer(), nullable=False),
        sa.Column("load", sa.BigInteger(), nullable=False),
        sa.Column("active", sa.Integer(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("replay_worker_loads")
    op.drop_table("replay_steps")
    op.drop_table("replay_policy_summaries")
    op.drop_table("replay_runs")
    op.execute(sa.schema.DropSequence(sa.Sequence("replay_runs_id_seq")))
