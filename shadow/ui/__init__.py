"""The shadow-comparison web UI: static files served by the service (no build step, no
CDN), drawing everything from the JSON API. See docs/UI.md."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

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

    @app.middleware("http")
    async def security_headers(request: Request, call_next):
        response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            if name == "Content-Security-Policy" and request.url.path in OWN_POLICY:
                continue  # FastAPI's Swagger and ReDoc pages load their own scripts
            response.headers.setdefault(name, value)
        return response
