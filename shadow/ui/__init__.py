"""The shadow-comparison web UI: static files served by the service (no build step, no
CDN), drawing everything from the JSON API. See docs/UI.md."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(__file__).parent / "static"
OWN_POLICY = ("/docs", "/redoc", "/docs/oauth2-redirect")
PAGES = ("/", "/compare", "/decisions", "/integrity", "/gate", "/replays", "/sweeps")

#: The page loads only its own scripts, styles and images, and never runs in a frame.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def mount_ui(app: FastAPI) -> None:
    """Serve the single-page app at every page path and its assets under `/static`."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    index = STATIC / "index.html"

    def page() -> FileResponse:
        return FileResponse(index, media_type="text/html", headers={"Cache-Control": "no-cache"})

    for path in PAGES:
        app.add_api_route(path, page, methods=["GET"], include_in_schema=False)

    app.add_middleware(SecurityHeaders)


class SecurityHeaders:
    """Adds `SECURITY_HEADERS` to every response, as plain ASGI: Starlette's
    `@app.middleware("http")` runs each request in a task group of its own and leaves a
    cycle of tasks, cancel scopes and tracebacks for the garbage collector."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        own_policy = scope["path"] in OWN_POLICY  # FastAPI's Swagger and ReDoc load scripts

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if not (own_policy and name == "Content-Security-Policy"):
                        headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, send_with_headers)
