"""A dispatch's frozen snapshot is stored compressed, in `decisions.snapshot_z` (BLOB).

At G = 256 the snapshot is ~7.8 KB of JSON a dispatch, ~95% of the decisions table, and
DuckDB rewrites a table's open row group whole at each checkpoint: at 550 dispatches a
second, checkpoints inside the server's group commits took up to 6 s, growing as the row
group filled, and no batch was acknowledged meanwhile. zlib (level 1) makes it ~1.6 KB and
a column DuckDB stores without analysing it again. New rows write `snapshot_z` and leave
`snapshot` NULL; rows stored before keep their JSON in `snapshot`, and readers take
whichever the row has (`storage.queries.STORED_SNAPSHOT`).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08 00:30:00
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("snapshot_z", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    """The code before reads `snapshot` only: the compressed snapshots go back to JSON
    there (in Python: DuckDB has no zlib), then the column goes."""
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT fleet, ingest_id, policy, snapshot_z FROM decisions "
            "WHERE snapshot_z IS NOT NULL"
        )
    ).fetchall()
    update = sa.text(
        "UPDATE decisions SET snapshot = :snapshot "
        "WHERE fleet = :fleet AND ingest_id = :ingest_id AND policy = :policy"
    )
    for fleet, ingest_id, policy, packed in rows:
        bind.execute(update, {"snapshot": zlib.decompress(packed).decode(), "fleet": fleet,
                              "ingest_id": ingest_id, "policy": policy})  # fmt: skip
    op.drop_column("decisions", "snapshot_z")
