"""Continuous counterfactuals: each window row names the window its runs started at.

A window of a continuous run is a consecutive piece of one simulated fleet per policy;
`run_start` is the index of the window those runs started from (after a restart or a
missing window they start again). NULL: a window replayed on its own from its start
state (the per-window reset replay). The gate drops a warm-up after each start.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 13:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("windows", sa.Column("run_start", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("windows", "run_start")
