"""Read queries over the service's database, shared by the HTTP API and the gate.

Every query is fixed SQL with bound parameters; user text never reaches SQL (sort
columns and table names come from whitelists in the callers). `reader` is anything with
the store's two reads: `query` (rows as dicts, `:name` parameters) and `columns` (numpy
columns, `$name` parameters).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Reader(Protocol):
    """The two reads of `shadow.service.store.ServiceStore` these queries use."""

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]: ...

    def columns(self, sql: str, params: dict[str, Any] | None = None) -> dict[str, np.ndarray]: ...


def time_range(
    column: str, since: float | None, until: float | None
) -> tuple[list[str], dict[str, Any]]:
    """The conditions `since <= column < until` (either end optional) and their bound
    parameters (`:since`, `:until`): the one time-range filter of every read."""
    conditions: list[str] = []
    params: dict[str, Any] = {}
    if since is not None:
        conditions.append(f"{column} >= :since")
        params["since"] = since
    if until is not None:
        conditions.append(f"{column} < :until")
        params["until"] = until
    return conditions, params
