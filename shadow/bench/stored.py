"""What a benchmark's database holds once its pass is flushed, read one way for every
benchmark that checks "every acknowledged event stored once" (`bench fleet`, `bench load`),
so that the check cannot drift between them."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from shadow.service.store import LATEST_PROGRESS

#: rows in `events` and `engine_steps` beyond one per (fleet, source, seq): an event
#: stored twice, whichever table holds it
_DUPLICATES = (
    "SELECT (SELECT count(*) FROM events) - (SELECT count(DISTINCT (fleet, source, seq)) "
    "FROM events) + (SELECT count(*) FROM engine_steps) - (SELECT count(DISTINCT (fleet, "
    "source, seq)) FROM engine_steps)"
)


@dataclass(frozen=True)
class StoredEvents:
    """Stored rows by event kind (`worker` events left out, engine steps under
    `engine_step`), the rows stored twice, the latest-progress rows and the decisions."""

    by_kind: dict[str, int]
    duplicates: int
    progress_requests: int
    decisions: int

    def missing(
        self, acknowledged: dict[str, int], *, skip: tuple[str, ...] = ()
    ) -> dict[str, int]:
        """Each kind whose stored count differs from the acknowledged one, by how many
        fewer were stored (negative: more were); `skip` kinds are not compared."""
        return {
            kind: n - self.by_kind.get(kind, 0)
            for kind, n in acknowledged.items()
            if kind not in skip and n != self.by_kind.get(kind, 0)
        }


def stored_events(con: duckdb.DuckDBPyConnection) -> StoredEvents:
    """Count what a flushed service database holds (`con` may be read-only)."""
    by_kind = {
        str(kind): int(n)
        for kind, n in con.execute(
            "SELECT type, count(*) FROM events WHERE type <> 'worker' GROUP BY type"
        ).fetchall()
    }
    by_kind["engine_step"] = _count(con, "SELECT count(*) FROM engine_steps")
    return StoredEvents(
        by_kind=by_kind,
        duplicates=_count(con, _DUPLICATES),
        progress_requests=_count(con, f"SELECT count(*) FROM {LATEST_PROGRESS}"),
        decisions=_count(con, "SELECT count(*) FROM decisions"),
    )


def _count(con: duckdb.DuckDBPyConnection, query: str) -> int:
    row = con.execute(query).fetchone()
    return int(row[0]) if row else 0
