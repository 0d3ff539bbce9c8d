"""Finish events keep what the tap and the engine said of their count; engine steps keep
their tokens.

The tap's count may be an estimate, and the engine's stat-logger plugin sends the exact
one in a second finish of the same request: `events` gains the finish fields the join
needs to be rebuilt at restart (`estimated`, `from_engine`) and the engine's own reason
(`raw_reason`), and `joined_to`: on a finish that met an earlier finish of its request,
the ingest id of that one (readers count the row where it is NULL, one per request).
`engine_steps` gains `tokens`, the tokens generated in the iteration.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVENT_COLUMNS = (
    ("raw_reason", sa.Text),
    ("estimated", sa.Boolean),
    ("from_engine", sa.Boolean),
    ("joined_to", sa.BigInteger),
)


def upgrade() -> None:
    for name, kind in EVENT_COLUMNS:
        op.add_column("events", sa.Column(name, kind(), nullable=True))
    op.add_column("engine_steps", sa.Column("tokens", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("engine_steps", "tokens")
    for name, _ in reversed(EVENT_COLUMNS):
        op.drop_column("events", name)
