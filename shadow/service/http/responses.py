"""How the API writes values and errors: JSON has no NaN or infinity (they become null),
and a refused query parameter is a 422 shaped like FastAPI's own."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
from fastapi import HTTPException

#: the largest page of a paginated list
PAGE_MAX = 1000


def clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def rows_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: clean(v) for k, v in row.items()} for row in rows]


def json_floats(column: Any) -> list[float | None]:
    """A fetched numeric column as JSON values: NULL and non-finite as None."""
    array = np.ma.filled(np.ma.masked_invalid(np.ma.asarray(column, dtype=np.float64)), np.nan)
    return [None if math.isnan(v) else v for v in array.tolist()]


def rounded(values: np.ndarray, digits: int = 2) -> list[float | None]:
    return [None if not math.isfinite(v) else round(float(v), digits) for v in values]


def iso(value: Any) -> Any:
    return value.isoformat() + "Z" if isinstance(value, datetime) else value


def invalid(loc: list[str | int], message: str) -> HTTPException:
    """A 422 shaped like FastAPI's own validation errors (the documented schema)."""
    return HTTPException(422, [{"loc": loc, "msg": message, "type": "value_error"}])
