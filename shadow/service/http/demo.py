"""`GET /v1/demo`: where the companion world listens (router, tap, workers), if one runs."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from shadow.service.http.state import State

router = APIRouter()


@router.get("/v1/demo")
def demo_addresses(state: State) -> dict[str, Any]:
    """Where the demo world listens (router, tap, workers), if one runs."""
    addresses = state.started.companion if state.started is not None else None
    if addresses is None:
        raise HTTPException(404, "no demo world in this service")
    return {"router": addresses.router, "tap": addresses.tap, "workers": addresses.workers}
