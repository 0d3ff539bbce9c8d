"""Per-fleet modes (shadow / live / fallback / latched), the hash-chained audit log and
the promotion gate's runs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG, INT, TEXT, DOUBLE, BOOL = sa.BigInteger, sa.Integer, sa.Text, sa.Double, sa.Boolean


def _col(name: str, kind: type, nullable: bool = True) -> sa.Column:
    return sa.Column(name, kind(), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "fleet_modes",
        _col("fleet", TEXT, False),
        _col("mode", TEXT, False),
        _col("policy", TEXT),
        _col("since", DOUBLE, False),
        _col("trips_json", TEXT, False),
        # The K-of-M window outcomes, so a restart does not forget recent bad windows.
        _col("recent_json", TEXT),
        _col("healthy_windows", BIG, False),
        _col("frozen", BOOL, False),
        _col("cooldown_until", DOUBLE),
        _col("last_gate_verdict", TEXT),
        _col("updated_at", DOUBLE, False),
        sa.PrimaryKeyConstraint("fleet", name="pk_fleet_modes"),
    )
    # seq is assigned densely (max + 1) by shadow.auditlog, not by a sequence: a rolled
    # back sequence value would leave a gap that verify() must treat as a deleted row.
    op.create_table(
        "audit_log",
        # autoincrement=False: a lone integer PK would otherwise render as BIGSERIAL.
        sa.Column("seq", BIG(), nullable=False, autoincrement=False),
        _col("ts", DOUBLE, False),
        _col("fleet", TEXT),
        _col("kind", TEXT, False),
        _col("actor", TEXT, False),
        _col("reason", TEXT),
        _col("payload", TEXT, False),
        _col("prev_hash", TEXT, False),
        _col("hash", TEXT, False),
        sa.PrimaryKeyConstraint("seq", name="pk_audit_log"),
    )
    # DuckDB has no SERIAL: gate run ids come from a sequence.
    op.execute(sa.schema.CreateSequence(sa.Sequence("gate_runs_id_seq")))
    op.create_table(
        "gate_runs",
        sa.Column(
            "id",
            BIG(),
            server_default=sa.text("nextval('gate_runs_id_seq')"),
            nullable=False,
        ),
        _col("ts", DOUBLE, False),
        _col("fleet", TEXT, False),
        _col("candidate", TEXT, False),
        _col("baseline", TEXT, False),
        _col("verdict", TEXT, False),
        _col("exit_code", INT, False),
        _col("report", TEXT, False),
        sa.PrimaryKeyConstraint("id", name="pk_gate_runs"),
    )


def downgrade() -> None:
    op.drop_table("gate_runs")
    op.execute(sa.schema.DropSequence(sa.Sequence("gate_runs_id_seq")))
    op.drop_table("audit_log")
    op.drop_table("fleet_modes")
