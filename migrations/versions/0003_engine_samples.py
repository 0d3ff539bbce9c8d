"""Engine metrics samples scraped from each engine's Prometheus endpoint.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 00:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "engine_samples",
        sa.Column("fleet", sa.Text(), nullable=False),
        sa.Column("worker", sa.Text(), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("running", sa.Double(), nullable=False),
        sa.Column("waiting", sa.Double(), nullable=False),
        sa.Column("kv_usage", sa.Double(), nullable=True),
        sa.Column("generation_tokens", sa.Double(), nullable=True),
        sa.Column("mirror_active", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("engine_samples")
