"""The four dashboards as Grafana JSON: build, render to the committed text, export,
and read back (panels, PromQL) for the tests."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dashboard_model

from shadow.dashboards import decisions, integrity, overview, per_worker

#: filename stem -> builder; the stems are the files in dashboards/.
BUILDERS = {
    "shadow-overview": overview.build,
    "shadow-per-worker": per_worker.build,
    "shadow-decisions": decisions.build,
    "shadow-integrity": integrity.build,
}


def _to_json(model: dashboard_model.Dashboard) -> dict[str, Any]:
    """Number the panels (Grafana needs unique ids) and encode the model as plain JSON."""
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.loads(json.dumps(model, cls=JSONEncoder))


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard as a Grafana JSON model, keyed by its file name (`<uid>.json`)."""
    return {f"{name}.json": _to_json(build().build()) for name, build in BUILDERS.items()}


def render(dashboard_json: dict[str, Any]) -> str:
    """The committed text of a dashboard: sorted keys, indent 2, trailing newline."""
    return json.dumps(dashboard_json, indent=2, sort_keys=True) + "\n"


def export(directory: Path) -> list[Path]:
    """Write every dashboard to `directory` (created if missing); the same bytes every run."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, model in sorted(build_dashboards().items()):
        path = directory / filename
        path.write_text(render(model))
        written.append(path)
    return written


def iter_panels(dashboard_json: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard_json.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def promql_expressions(dashboard_json: dict[str, Any]) -> list[str]:
    """Every target's PromQL expression, in panel order (variable queries excluded)."""
    return [
        target["expr"]
        for panel in iter_panels(dashboard_json)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]
