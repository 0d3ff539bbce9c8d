"""The Parquet archive's manifest: one row per file that retention moved out of DuckDB.

A file is part of the archive only once its row is here; the row is inserted in the same
transaction that deletes the file's rows from the live table, so a reader that takes the
live rows and the listed files (`shadow.storage.archive`) sees each row exactly once, even
after a crash between writing a file and deleting its rows.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "archive_files",
        #: relative to the database file's directory (absolute when outside it)
        sa.Column("path", sa.Text(), primary_key=True),
        sa.Column("table_name", sa.Text(), nullable=False),
        #: the UTC day of every row in the file, YYYY-MM-DD (the `date=` partition)
        sa.Column("day", sa.Text(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("ts_min", sa.Double(), nullable=False),
        sa.Column("ts_max", sa.Double(), nullable=False),
        sa.Column("archived_at", sa.Double(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("archive_files")
