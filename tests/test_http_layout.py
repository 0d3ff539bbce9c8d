"""The HTTP layer's shape: every documented path and method stays, and the production
service does not import the emulated world (the demo reaches it as a companion)."""

import subprocess
import sys

from shadow.service.http.app import create_app
from shadow.service.settings import ServiceSettings

PATHS = {
    "/healthz": ["get"],
    "/v1/audit/log": ["get"],
    "/v1/audit/verify": ["get"],
    "/v1/demo": ["get"],
    "/v1/events": ["post"],
    "/v1/fleets": ["get"],
    "/v1/fleets/{fleet}/compare": ["get"],
    "/v1/fleets/{fleet}/decisions": ["get"],
    "/v1/fleets/{fleet}/decisions/{ingest_id}": ["get"],
    "/v1/fleets/{fleet}/gate": ["get", "post"],
    "/v1/fleets/{fleet}/gate/dry-run": ["post"],
    "/v1/fleets/{fleet}/gate/explain": ["get"],
    "/v1/fleets/{fleet}/gate/flagger": ["post"],
    "/v1/fleets/{fleet}/gate/runs": ["get"],
    "/v1/fleets/{fleet}/mode": ["get", "post"],
    "/v1/fleets/{fleet}/requests/{request_id}": ["get"],
    "/v1/fleets/{fleet}/snapshot": ["get"],
    "/v1/fleets/{fleet}/stepmodel": ["get"],
    "/v1/fleets/{fleet}/summary": ["get"],
    "/v1/fleets/{fleet}/telemetry": ["get"],
    "/v1/fleets/{fleet}/violations": ["get"],
    "/v1/fleets/{fleet}/violations/timeline": ["get"],
    "/v1/fleets/{fleet}/windows": ["get"],
    "/v1/flush": ["post"],
    "/v1/gate/runs/{run_id}": ["get"],
    "/v1/replays": ["get"],
    "/v1/replays/{run_id}": ["get"],
    "/v1/route": ["post"],
    "/v1/storage/archive": ["post"],
    "/v1/sweeps": ["get"],
    "/v1/sweeps/{sweep}/heatmap": ["get"],
}


def test_openapi_paths_and_methods_stay() -> None:
    paths = create_app(ServiceSettings()).openapi()["paths"]
    assert {path: sorted(methods) for path, methods in paths.items()} == PATHS


def test_the_service_does_not_import_the_world() -> None:
    code = (
        "import sys; import shadow.service.http.app; "
        "print(sorted(m for m in sys.modules if m.startswith('shadow.world')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
