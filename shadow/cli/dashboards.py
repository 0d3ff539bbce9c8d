"""`shadow dashboards`: export the Grafana dashboards built from code, or provision them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.shared import command_group, console, fail

dashboards_app = command_group(
    "Grafana dashboards: export the JSON built from code, or provision a Grafana."
)


@dashboards_app.command("export")
def dashboards_export(
    directory: Annotated[
        Path, typer.Argument(help="Where to write the dashboard JSON files.")
    ] = Path("dashboards"),
) -> None:
    """Write every dashboard as `<uid>.json` (the same bytes on every run)."""
    from shadow import dashboards

    for path in dashboards.export(directory):
        console.print(f"wrote {path}")


@dashboards_app.command("provision")
def dashboards_provision(
    url: Annotated[str, typer.Option(help="Grafana base URL, e.g. http://grafana:3000.")],
    token: Annotated[
        str, typer.Option(help="Service account token (Editor or Admin).", envvar="GRAFANA_TOKEN")
    ],
    folder: Annotated[str, typer.Option(help="Folder title (created if missing).")] = (
        "balanceroute-shadow"
    ),
    datasource_url: Annotated[
        str | None,
        typer.Option(help="Prometheus URL: create or update the shadow-prometheus datasource."),
    ] = None,
) -> None:
    """Create or overwrite the dashboards in a Grafana folder; safe to rerun."""
    from shadow import dashboards

    try:
        summary = dashboards.provision(url, token, folder=folder, datasource_url=datasource_url)
    except dashboards.ProvisionError as error:
        raise fail(str(error)) from None
    found = summary["folder"]
    console.print(f"folder {found['title']!r} (uid {found['uid']}): {found['action']}")
    if summary["datasource"] is not None:
        source = summary["datasource"]
        console.print(f"datasource {source['name']} -> {source['url']}: {source['action']}")
    for board in summary["dashboards"]:
        console.print(
            f"dashboard {board['title']!r} (uid {board['uid']}, version {board['version']}): "
            f"{board['action']}"
        )
