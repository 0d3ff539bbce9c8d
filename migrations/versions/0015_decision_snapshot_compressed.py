"""A dispatch's frozen snapshot is stored as bytes, compressed when large, in
`decisions.snapshot_z` (BLOB).

At G = 256 the snapshot is ~7.8 KB of JSON a dispatch, ~95% of the decisions table, and
DuckDB rewrites recent row groups at its checkpoints, which run inside the server's group
commits: at 550 dispatches a second they took up to 6 s, and no batch was acknowledged
meanwhile. zlib (level 1) makes it ~1.6 KB. New rows write `snapshot_z`, the JSON bytes,
compressed when over 1 KiB (`stream.stored_snapshot`: a small fleet's
snapshot gains little), and leave `snapshot` NULL; rows stored before keep their JSON in
`snapshot`, and readers take whichever the row has (`storage.queries.STORED_SNAPSHOT`,
`stream.stored_snapshot.unpack`).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-07 23:30:00
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

#: the first byte of a zlib stream, which JSON never starts with (as `stream.stored_snapshot`:
#: a migration keeps its own constants, since the code it was written with moves on)
ZLIB_HEADER = b"\x78"


def upgrade() -> None:
    op.add_column("decisions", sa.Column("snapshot_z", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    """The code before reads `snapshot` only: the snapshots in `snapshot_z` go back to
    JSON text there (decompressed in Python: DuckDB has no zlib), then the column goes."""
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
    for fleet, ingest_id, policy, stored in rows:
        packed = bytes(stored)
        text = (zlib.decompress(packed) if packed[:1] == ZLIB_HEADER else packed).decode()
        bind.execute(update, {"snapshot": text, "fleet": fleet, "ingest_id": ingest_id,
                              "policy": policy})  # fmt: skip
    op.drop_column("decisions", "snapshot_z")
