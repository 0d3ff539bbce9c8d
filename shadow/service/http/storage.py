"""The Parquet archive: a retention run on demand (what `[storage] retention_days` runs
on schedule), while ingest goes on."""

from __future__ import annotations

from datetime import date
from typing import Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from shadow.service.http.state import State
from shadow.storage.archive import day_start

router = APIRouter()


class ArchiveBody(BaseModel):
    #: rows of UTC days before this one move to the archive
    before: date


@router.post("/v1/storage/archive")
async def archive(body: ArchiveBody, state: State) -> dict[str, Any]:
    """Move the archived tables' rows of the days before `before` to Parquet; returns
    the rows and bytes moved per table and the longest time one chunk held the writer."""
    retention = state.runtime.retention
    result = await run_in_threadpool(retention.run, day_start(body.before))
    return {"before": body.before.isoformat(), "root": str(retention.root), **result.as_json()}
