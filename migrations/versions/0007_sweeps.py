"""Parameter sweeps (`shadow sweep`): a named sweep and which stored replays are its cells.

A cell's result is an ordinary replay run (`replay_runs` + `replay_policy_summaries`, its
parameters and `cell_key` in `config_json`); `sweep_cells` only records membership, so a
cell computed for one sweep is reused, not recomputed, by another that contains it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("trace", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
    )
    op.create_table(
        "sweep_cells",
        sa.Column("sweep", sa.Text(), primary_key=True),
        sa.Column("cell_key", sa.Text(), primary_key=True),
        sa.Column("run_id", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sweep_cells")
    op.drop_table("sweeps")
