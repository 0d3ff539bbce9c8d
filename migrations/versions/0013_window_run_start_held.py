"""Continuous counterfactuals: each window row says how many requests its runs' start held.

The gate drops a warm-up after a start of the runs because their fleet still holds what
the incumbent placed; runs that started from an empty fleet (the start of a recorded log,
a fleet that was idle) hold nothing of it, so none of their windows is a warm-up, and
dropping them would leave out of the estimate the ramp-up a full replay measures.
`run_start_held`: the requests decoding in the start window's observed state. NULL: a
window replayed on its own, or stored before (the warm-up is then dropped).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 16:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("windows", sa.Column("run_start_held", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("windows", "run_start_held")
