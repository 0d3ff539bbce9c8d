"""Durable storage of replay results in DuckDB (SQLAlchemy models + Alembic migrations).

``open_database(path)`` upgrades the file to the newest migration and returns a
:class:`Database`; bulk per-step series are appended through DuckDB's Arrow interface.
"""

from .database import Database, head_revision, migrations_dir, open_database, upgrade
from .models import (
    METRICS,
    STEP_SERIES,
    Base,
    ReplayPolicySummary,
    ReplayRun,
    ReplayStep,
    ReplayWorkerLoad,
)

__all__ = [
    "METRICS",
    "STEP_SERIES",
    "Base",
    "Database",
    "ReplayPolicySummary",
    "ReplayRun",
    "ReplayStep",
    "ReplayWorkerLoad",
    "head_revision",
    "migrations_dir",
    "open_database",
    "upgrade",
]
