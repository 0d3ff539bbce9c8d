"""`GET /healthz` and the Prometheus exposition at `GET /metrics`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from shadow import __version__
from shadow.service.http.state import State

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(state: State) -> Response:
    """Prometheus text exposition of every `shadow_` metric."""
    return Response(generate_latest(state.running.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/healthz")
def healthz(state: State) -> dict[str, Any]:
    pipeline = state.runtime.pipeline
    return {"ok": not pipeline.broken, "version": __version__}
