"""The HTTP face of the service: one router per resource, each handler translating
between HTTP and a function over the typed app state (`state.AppState`).

`POST /v1/events` takes NDJSON or a JSON array; everything else reads. OpenAPI at `/docs`.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from shadow import __version__
from shadow.service.http import (
    auth,
    decisions,
    demo,
    fleets,
    gate,
    health,
    ingest,
    modes,
    replays,
    storage,
    sweeps,
    windows,
)
from shadow.service.http.companion import Companion
from shadow.service.http.lifespan import lifespan
from shadow.service.http.state import AppState
from shadow.service.settings import ServiceSettings
from shadow.ui import mount_ui

#: every resource's router, in the order their paths are documented
ROUTERS = (
    health, ingest, fleets, decisions, windows, demo, modes, gate, replays, sweeps, storage,
)  # fmt: skip


def create_app(settings: ServiceSettings, companion: Companion | None = None) -> FastAPI:
    """The service app. `companion`: something to start beside the service and stop with
    it (`shadow serve --demo` passes the emulated world), whose addresses `/v1/demo`
    answers and whose engines the service scrapes."""
    state = AppState(settings, companion)
    app = FastAPI(
        title="balanceroute-shadow",
        version=__version__,
        description="Shadow-mode evaluation of BalanceRoute against the incumbent router.",
        lifespan=lifespan(state),
    )
    app.state.shadow = state
    app.add_middleware(auth.BearerAuth, tokens=settings.token_table(), denied=state.auth_denied)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, with page sizes past their bound counted."""
        if any(e.get("loc", [None])[-1] == "limit" for e in error.errors()):
            state.hit("page_size")
        return await request_validation_exception_handler(request, error)

    for resource in ROUTERS:
        app.include_router(resource.router)
    mount_ui(app)
    return app
