"""`shadow gate`: the promotion gate, its verdict as the exit code, on a database file
(`--db`) or a running service (`--url`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from shadow.cli.client import ServiceClient, ServiceError, TokenFileOption
from shadow.cli.shared import DEFAULT_DB, UrlOption, console, err_console, fail
from shadow.gate.command import GateRequest, GateUnavailable


class ReportFormat(StrEnum):
    text = "text"
    markdown = "markdown"
    json = "json"
    junit = "junit"


@dataclass(frozen=True)
class ServiceGate:
    """The gate run by the service (`--url`): `--dry-run` is a GET (role `read`), a
    recorded run a POST (role `operator`)."""

    client: ServiceClient

    def _params(self, request: GateRequest) -> dict[str, Any]:
        overrides = _overrides(request)
        return {"candidate": request.candidate, "baseline": request.baseline,
                "since": request.since, "until": request.until, "horizon": request.horizon,
                "thresholds": json.dumps(overrides) if overrides else None}  # fmt: skip

    def report(self, request: GateRequest) -> dict[str, Any]:
        path = f"/v1/fleets/{request.fleet}/gate"
        try:
            if request.dry_run:
                return self.client.get_json(path, **self._params(request))
            body = {**self._params(request), "thresholds": _overrides(request) or None,
                    "dry_run": False}  # fmt: skip
            return self.client.post_json(path, body)
        except ServiceError as error:
            raise GateUnavailable(error.exit_code, error.message) from None

    def explain(self, request: GateRequest, metric: str) -> str:
        path = f"/v1/fleets/{request.fleet}/gate/explain"
        try:
            return self.client.get_json(path, metric=metric, **self._params(request))["text"]
        except ServiceError as error:
            raise GateUnavailable(error.exit_code, error.message) from None


def _overrides(request: GateRequest) -> dict[str, Any]:
    """The thresholds that differ from the defaults (the service starts from the same)."""
    from shadow.gate.thresholds import Thresholds

    defaults = Thresholds().as_dict()
    return {k: v for k, v in request.thresholds.as_dict().items() if defaults[k] != v}


def gate(
    db: Annotated[Path, typer.Option(help="The service's DuckDB file.")] = DEFAULT_DB,
    url: UrlOption = None,
    token_file: TokenFileOption = None,
    fleet: Annotated[str, typer.Option(help="Fleet to judge.")] = "default",
    candidate: Annotated[str, typer.Option(help="Policy to promote.")] = "brh-survival",
    baseline: Annotated[str, typer.Option(help="The incumbent.")] = "jsq-pool",
    since: Annotated[float | None, typer.Option(help="Evidence from this time (s).")] = None,
    until: Annotated[float | None, typer.Option(help="Evidence before this time (s).")] = None,
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file of thresholds.")
    ] = None,
    show_thresholds: Annotated[
        bool, typer.Option(help="Print the thresholds in force (TOML) and exit.")
    ] = False,
    output_format: Annotated[
        ReportFormat | None,
        typer.Option(
            "--format",
            help="text, markdown ($GITHUB_STEP_SUMMARY), json or junit (one test case per "
            "rule). Default: a table on a terminal, text elsewhere.",
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        Path | None, typer.Option("--json", help="Also write the JSON report (--format json).")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Print everything, exit 0.")] = False,
    allow_marginal: Annotated[bool, typer.Option(help="MARGINAL exits 0.")] = False,
    explain: Annotated[
        str | None, typer.Option(help="Show the bootstrap and rule evaluation of one metric.")
    ] = None,
    horizon: Annotated[
        int | None,
        typer.Option(
            help="H the calibration is scored at: the service's [balance_route] "
            "horizon (default: its default, 80)."
        ),
    ] = None,
) -> None:
    """The promotion gate: PASS 0, FAIL 1, usage 2, INCONCLUSIVE 3, MARGINAL 4, ERROR 5."""
    from shadow.gate.command import gate_command

    service = None
    if url is not None:
        try:
            service = ServiceGate(ServiceClient.connect(url, token_file))
        except ServiceError as error:
            raise fail(error.message, code=error.exit_code) from None
    code = gate_command(
        console, err_console, db=db, fleet=fleet, candidate=candidate, baseline=baseline,
        since=since, until=until, thresholds_path=thresholds, show_thresholds=show_thresholds,
        json_out=json_out, dry_run=dry_run, allow_marginal=allow_marginal, explain=explain,
        output_format=output_format.value if output_format else None, service=service,
        horizon=horizon,
    )  # fmt: skip
    raise typer.Exit(code)
