"""A dispatch's frozen snapshot is stored once, on one of its decision rows.

The audit wrote the same snapshot on every policy's row of a dispatch; at G = 256 it is
~10 KB of JSON, and writing it three times was most of the server's commit time. The
other rows now hold NULL and readers take the snapshot from the row that has it
(`storage.queries.with_snapshots`); rows stored before keep theirs.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 06:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("decisions", "snapshot", existing_type=sa.Text(), nullable=True)


def downgrade() -> None:
    """Every row gets its dispatch's snapshot back, which is what the code before reads.
    The column stays nullable: DuckDB cannot add NOT NULL in the transaction that filled
    it ("Cannot create index with outstanding updates"), and that code never writes NULL."""
    op.execute(
        "UPDATE decisions AS d SET snapshot = s.snapshot FROM decisions AS s "
        "WHERE d.snapshot IS NULL AND s.snapshot IS NOT NULL "
        "AND s.fleet = d.fleet AND s.ingest_id = d.ingest_id"
    )
