"""Window metrics the gate needs to estimate what a full replay measures.

`busy_s`: the seconds a run's throughput is over (a continuous run's busy clock: the
window's span while it has work, up to its last step end once it has none, past the
window's end when the last window drains it), so tokens over busy time summed across
windows is the replay's tokens over its makespan. `tpot_ms`: the per-request TPOTs of the
window (float32 little-endian), which the gate pools to take the TPOT P95 over requests
rather than a mean of window P95s. NULL in rows stored before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("window_metrics", sa.Column("busy_s", sa.Double(), nullable=True))
    op.add_column("window_metrics", sa.Column("tpot_ms", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column("window_metrics", "tpot_ms")
    op.drop_column("window_metrics", "busy_s")
