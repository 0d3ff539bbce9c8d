"""What the gate's I/O needs of a database: a read, a write, nothing of the service.

`collect_evidence` reads through `query`; `record_gate_run` writes through `engine` (one
transaction with its audit-log row). The service's store is one such source (the dry
run); `open_evidence` opens a database file as another (`shadow gate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine, text

from shadow.storage import Database, open_database


class EvidenceSource(Protocol):
    """A database the gate reads its evidence from (and records its runs in)."""

    path: Path
    engine: Engine

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...


@dataclass
class DatabaseEvidence:
    """A database file opened (and migrated) for one gate run."""

    #: as given, since the report names it
    path: Path
    database: Database

    @property
    def engine(self) -> Engine:
        return self.database.engine

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            return [dict(row._mapping) for row in conn.execute(text(sql), params or {})]

    def close(self) -> None:
        self.database.close()


def open_evidence(path: Path) -> DatabaseEvidence:
    """Open the database at `path` (migrating it, like every command that opens one)."""
    return DatabaseEvidence(Path(path), open_database(path))
