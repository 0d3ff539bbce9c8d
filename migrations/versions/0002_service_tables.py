"""The shadow service: lifecycle events, latest progress, engine steps, violations,
decisions, windows with per-policy metrics, step-model fits and the ingest checkpoint.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG, INT, TEXT, DOUBLE, BOOL = sa.BigInteger, sa.Integer, sa.Text, sa.Double, sa.Boolean


def _col(name: str, kind: type, nullable: bool = True) -> sa.Column:
    return sa.Column(name, kind(), nullable=nullable)


def upgrade() -> None:
    # Append-only, high-rate tables carry no index (DuckDB ART indexes slow bulk appends);
    # the service keeps their keys unique itself.
    op.create_table(
        "events",
        _col("ingest_id", BIG, False),
        _col("fleet", TEXT, False),
        _col("source", TEXT, False),
        _col("seq", BIG),
        _col("type", TEXT, False),
        _col("ts", DOUBLE, False),
        _col("request_id", TEXT),
        _col("worker", TEXT),
        _col("prompt_tokens", BIG),
        _col("prompt_hash", TEXT),
        _col("max_tokens", BIG),
        _col("policy", TEXT),
        _col("router_view", TEXT),
        _col("output_tokens", BIG),
        _col("reason", TEXT),
        _col("capacity", INT),
        _col("state", TEXT),
    )
    op.create_table(
        "progress_latest",
        _col("fleet", TEXT, False),
        _col("request_id", TEXT, False),
        _col("generated", BIG, False),
        _col("ts", DOUBLE, False),
        _col("ingest_id", BIG, False),
        sa.PrimaryKeyConstraint("fleet", "request_id", name="pk_progress_latest"),
    )
    op.create_table(
        "engine_steps",
        _col("ingest_id", BIG, False),
        _col("fleet", TEXT, False),
        _col("source", TEXT, False),
        _col("seq", BIG),
        _col("worker", TEXT, False),
        _col("step", BIG, False),
        _col("ts", DOUBLE, False),
        _col("duration_ms", DOUBLE, False),
        _col("running", INT, False),
        _col("kv_tokens", BIG),
        _col("waiting", INT),
    )
    op.create_table(
        "violations",
        _col("ingest_id", BIG, False),
        _col("fleet", TEXT, False),
        _col("kind", TEXT, False),
        _col("severity", TEXT, False),
        _col("worker", TEXT),
        _col("request_id", TEXT),
        _col("ts", DOUBLE, False),
        _col("detail", TEXT, False),
    )
    op.create_table(
        "decisions",
        _col("ingest_id", BIG, False),
        _col("fleet", TEXT, False),
        _col("ts", DOUBLE, False),
        _col("request_id", TEXT, False),
        _col("prompt_tokens", BIG, False),
        _col("incumbent_worker", TEXT, False),
        _col("incumbent_policy", TEXT, False),
        _col("policy", TEXT, False),
        _col("choice", TEXT),
        _col("agrees", BOOL, False),
        _col("f_br0_incumbent", DOUBLE, False),
        _col("f_br0_choice", DOUBLE),
        _col("f_br0_best", DOUBLE, False),
        _col("f_brh_incumbent", DOUBLE, False),
        _col("f_brh_choice", DOUBLE),
        _col("f_brh_best", DOUBLE, False),
        _col("mirror_jsq_agrees", BOOL, False),
        _col("router_view_agrees", BOOL),
        _col("snapshot", TEXT, False),
    )
    op.create_table(
        "windows",
        _col("fleet", TEXT, False),
        _col("window_index", BIG, False),
        _col("t_start", DOUBLE, False),
        _col("t_end", DOUBLE, False),
        _col("requests", BIG, False),
        _col("imputed", BIG, False),
        _col("a_ms_per_token", DOUBLE, False),
        _col("b_ms", DOUBLE, False),
        _col("step_model_fitted", BOOL, False),
        _col("fidelity_imbalance", DOUBLE),
        _col("fidelity_step", DOUBLE),
        sa.PrimaryKeyConstraint("fleet", "window_index", name="pk_windows"),
    )
    op.create_table(
        "window_metrics",
        _col("fleet", TEXT, False),
        _col("window_index", BIG, False),
        _col("policy", TEXT, False),
        _col("imbalance_mean", DOUBLE),
        _col("gap_mean", DOUBLE),
        _col("step_ms_mean", DOUBLE),
        _col("throughput_tok_s", DOUBLE),
        _col("tpot_p95_ms", DOUBLE),
        _col("pool_wait_p95_ms", DOUBLE),
        _col("steps", BIG),
        sa.PrimaryKeyConstraint("fleet", "window_index", "policy", name="pk_window_metrics"),
    )
    op.create_table(
        "step_model_fits",
        _col("fleet", TEXT, False),
        _col("fitted_at", DOUBLE, False),
        _col("a_ms_per_token", DOUBLE, False),
        _col("b_ms", DOUBLE, False),
        _col("r2", DOUBLE),
        _col("n", BIG, False),
        _col("t_start", DOUBLE),
        _col("t_end", DOUBLE),
        _col("fallback", BOOL, False),
        _col("reason", TEXT, False),
    )
    op.create_table(
        "ingest_state",
        _col("name", TEXT, False),
        _col("value", BIG, False),
        sa.PrimaryKeyConstraint("name", name="pk_ingest_state"),
    )


def downgrade() -> None:
    for table in (
        "ingest_state",
        "step_model_fits",
        "window_metrics",
        "windows",
        "decisions",
        "violations",
        "engine_steps",
        "progress_latest",
        "events",
    ):
        op.drop_table(table)
