"""Progress arrives as a log, compacted into `progress_latest`.

Upserting every batch's progress into `progress_latest` (primary key on fleet and request)
was the costliest statement of an ingest commit: DuckDB replaces indexed rows one by one.
Batches now append to `progress_log` (no key), and the service folds the log into
`progress_latest` every few seconds, once per request however many updates it had.
A reader wanting a request's latest progress takes the higher of the two tables.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-30 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "progress_log",
        sa.Column("fleet", sa.Text(), nullable=False),
        sa.Column("request_id", sa.Text(), nullable=False),
        sa.Column("generated", sa.BigInteger(), nullable=False),
        sa.Column("ts", sa.Double(), nullable=False),
        sa.Column("ingest_id", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    # fold what the log holds before it goes
    op.execute(
        "INSERT INTO progress_latest SELECT fleet, request_id, max(generated), "
        "arg_max(ts, generated), arg_max(ingest_id, generated) FROM progress_log "
        "GROUP BY fleet, request_id ON CONFLICT (fleet, request_id) DO UPDATE SET "
        "generated = excluded.generated, ts = excluded.ts, ingest_id = excluded.ingest_id "
        "WHERE excluded.generated > progress_latest.generated"
    )
    op.drop_table("progress_log")
