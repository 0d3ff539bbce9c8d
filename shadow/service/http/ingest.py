"""`POST /v1/events` (NDJSON or a JSON array) and `POST /v1/flush`."""

from __future__ import annotations

import logging
import time
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from shadow.events import parse_body
from shadow.service.http.state import State
from shadow.service.runtime import Runtime
from shadow.service.store import StorageError

router = APIRouter()
log = logging.getLogger("uvicorn.error")  # the service's log: warnings and up reach stderr


def flush_reorder_window(runtime: Runtime, idle: bool = False) -> None:
    """Apply what the reorder window holds and collect the window replays that finished.
    `idle`: the stream went quiet, which a stall looks like too, so each fleet is applied
    only as far as its live sources got (`Pipeline.drain`)."""
    runtime.pipeline.drain(wait_for_sources=idle)
    with runtime.pipeline.lock:
        runtime.pipeline.collect_windows()


async def _read_body(request: Request, state: State) -> bytes:
    """The body, refused (413) as soon as it is known to exceed `max_body_bytes`."""
    limit = state.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        state.hit("body_bytes")
        raise HTTPException(413, f"body of {declared} bytes exceeds max_body_bytes ({limit})")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            state.hit("body_bytes")
            raise HTTPException(413, f"body exceeds max_body_bytes ({limit} bytes)")
    return bytes(body)


@router.post("/v1/events")
async def post_events(request: Request, state: State) -> JSONResponse:
    """Ingest a batch (NDJSON or a JSON array). Valid events are stored even when
    others in the batch are rejected; each rejection names its position and field."""
    try:
        body = await _read_body(request, state)
    except ClientDisconnect:  # a tap stopped or gave up mid-batch: normal, and nothing stored
        state.ingest_disconnects += 1
        log.warning(
            "a sender disconnected before its batch (%s bytes) arrived whole; none of it "
            "was stored",
            request.headers.get("content-length", "chunked, unknown"),
        )
        return Response(status_code=400)  # never read: the sender is gone
    state.last_submit = time.monotonic()
    settings = state.settings
    pipeline = state.runtime.pipeline
    if pipeline.broken:
        raise HTTPException(
            503, f"ingest stopped after {pipeline.broken_reason}; restart the service"
        )

    def work() -> dict[str, Any] | None:
        with state.ingest_turn:
            events, errors = parse_body(body, request.headers.get("content-type"))
            if len(events) + len(errors) > settings.max_batch_events:
                return None
            result, job = pipeline.enqueue(events, errors)
        if job is not None:
            job.wait()  # acknowledged once durable, while the next batch is applied
        return result.as_json()

    try:
        result = await run_in_threadpool(work)
    except StorageError as error:  # nothing of this batch is stored: say why
        raise HTTPException(507 if error.disk_full else 503, str(error)) from None
    except BrokenProcessPool:  # killed from outside (OOM): nothing of this batch stored
        raise HTTPException(
            503, f"ingest stopped: {pipeline.broken_reason}; restart the service"
        ) from None
    if result is None:
        state.hit("batch_events")
        raise HTTPException(
            413, f"batch exceeds max_batch_events ({settings.max_batch_events}); split it"
        )
    status = 400 if result["rejected"] and not (result["accepted"] or result["duplicates"]) else 200
    return JSONResponse(result, status_code=status)


@router.post("/v1/flush")
def flush(state: State, final: bool = False) -> dict[str, Any]:
    """Apply everything the reorder window holds, close the window of an idle fleet,
    and store the window replays that finished. `final=true`: the traffic has stopped
    for good, so an idle fleet's last window drains the continuous runs (a full
    replay's end: its last requests and makespan are part of what it measures)."""
    runtime = state.runtime
    flush_reorder_window(runtime)
    runtime.pipeline.close_idle_windows(final=final)
    flush_reorder_window(runtime)
    return {"windows_evaluated": runtime.pipeline.windows_evaluated}
