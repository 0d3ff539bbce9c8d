"""The decision audit records each shadow policy's decision time (the gate's HARD rule
on decision latency reads it).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("latency_ms", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("decisions", "latency_ms")
