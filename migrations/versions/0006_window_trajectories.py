"""Bucketed per-worker load paths of every evaluated window and policy (the compare view).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "window_trajectories",
        sa.Column("fleet", sa.Text(), primary_key=True),
        sa.Column("window_index", sa.BigInteger(), primary_key=True),
        sa.Column("policy", sa.Text(), primary_key=True),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("t_ms", sa.LargeBinary(), nullable=False),
        sa.Column("loads", sa.LargeBinary(), nullable=False),
        sa.Column("imbalance", sa.LargeBinary(), nullable=False),
        sa.Column("gap", sa.LargeBinary(), nullable=False),
        sa.Column("step_ms", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("window_trajectories")
