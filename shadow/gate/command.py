"""`shadow gate` as a function: a request in, a report printed where it is read, an exit
code out. The report comes from a database file (`--db`: evidence collected, judged and
recorded here) or from a running service (`--url`: the service does the same on its live
evidence); either way it is the same JSON document, printed by the same code. Kept beside
the gate logic so the CLI only parses options."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import duckdb
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shadow import __version__
from shadow.gate.render import (
    COLUMNS,
    as_junit,
    as_markdown,
    as_text,
    disagreement_lines,
    row_cells,
    title,
)
from shadow.gate.thresholds import Thresholds
from shadow.policies import policy_names

ERROR_EXIT = 5
USAGE_EXIT = 2
#: what the service adds to a report it answers (the recorded run); not part of the
#: report, whose bytes depend on the evidence and the configuration only
RUN_KEYS = ("id", "ts")


@dataclass(frozen=True)
class GateRequest:
    """What one gate run judges, and whether it is recorded as a dry run."""

    fleet: str
    candidate: str
    baseline: str
    since: float | None
    until: float | None
    thresholds: Thresholds
    dry_run: bool
    #: the calibration horizon H; None: BalanceRoute's default H (a service: its own H)
    horizon: int | None = None


class GateUnavailable(Exception):
    """The report could not be had: the exit code (ERROR 5, usage 2) and the reason."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.message = message


class GateService(Protocol):
    """A running service that runs the gate (`--url`; the CLI's HTTP client)."""

    def report(self, request: GateRequest) -> dict[str, Any]:
        """The recorded run's report (with the service's `id` and `ts`)."""
        ...

    def explain(self, request: GateRequest, metric: str) -> str:
        """`--explain METRIC` computed by the service."""
        ...


def json_text(document: dict[str, Any]) -> str:
    """The `--json` bytes: sorted keys, two-space indent, a final newline."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def gate_command(
    console: Console,
    err_console: Console,
    *,
    db: Path,
    fleet: str,
    candidate: str,
    baseline: str,
    since: float | None,
    until: float | None,
    thresholds_path: Path | None,
    show_thresholds: bool,
    json_out: Path | None,
    dry_run: bool,
    allow_marginal: bool,
    explain: str | None,
    output_format: str | None = None,
    service: GateService | None = None,
    horizon: int | None = None,
) -> int:
    """Run the gate and print it; the exit code of GATE.md. `output_format` None: the table
    on a terminal, the plain text layout elsewhere; `service`: ask it instead of `db`."""
    from shadow.gate.thresholds import load_thresholds

    if horizon is not None and horizon < 0:
        return _error(err_console, USAGE_EXIT, f"--horizon: must be >= 0, got {horizon}")
    known = policy_names()  # now: a test or plug-in module may have registered more
    for name, value in (("--candidate", candidate), ("--baseline", baseline)):
        if value not in known:
            return _error(err_console, USAGE_EXIT, f"{name}: unknown policy {value!r}")
    try:
        thresholds = load_thresholds(thresholds_path) if thresholds_path else Thresholds()
    except (OSError, ValueError) as error:
        return _error(err_console, USAGE_EXIT, f"--thresholds: {error}")
    if show_thresholds:
        console.out(thresholds.as_toml(), highlight=False, end="")
        return 0
    request = GateRequest(fleet, candidate, baseline, since, until, thresholds, dry_run, horizon)
    try:
        if explain is not None:
            text = (
                service.explain(request, explain)
                if service is not None
                else _local_explain(db, request, explain)
            )
            console.out(text, highlight=False)
            return 0
        if service is not None:
            answered = service.report(request)
            run_id = answered.get("id")
            document = {k: v for k, v in answered.items() if k not in RUN_KEYS}
        else:
            document, run_id = _local_report(db, request)
    except GateUnavailable as error:
        return _error(err_console, error.exit_code, error.message)
    _print(console, document, output_format)
    if json_out is not None:
        json_out.write_text(json_text(document))
        err_console.print(f"wrote {escape(str(json_out))}", soft_wrap=True)
    if run_id is not None:
        err_console.print(f"recorded as gate run {run_id}", soft_wrap=True, highlight=False)
    if dry_run:
        return 0
    if document["verdict"] == "MARGINAL" and allow_marginal:
        return 0
    return int(document["exit_code"])


def _error(err_console: Console, code: int, message: str) -> int:
    """One whole line on stderr (never wrapped: a CI log is not a terminal)."""
    label = "[red]ERROR[/red]" if code == ERROR_EXIT else "[red]error:[/red]"
    err_console.print(f"{label} {escape(message)}", soft_wrap=True, highlight=False)
    return code


def _open(db: Path):
    from shadow.gate.source import open_evidence

    if not db.exists():
        raise GateUnavailable(ERROR_EXIT, f"evidence missing: database {db} does not exist")
    try:
        return open_evidence(db)
    except duckdb.Error as error:
        raise GateUnavailable(ERROR_EXIT, f"evidence unreadable: {db}: {error}") from None


def _local_explain(db: Path, request: GateRequest, metric: str) -> str:
    from shadow.gate.report import explain as explain_metric

    store = _open(db)
    try:
        report = run_gate(store, request)
    finally:
        store.close()
    try:
        return explain_metric(report, metric)
    except ValueError as error:
        raise GateUnavailable(USAGE_EXIT, f"--explain: {error}") from None


def _local_report(db: Path, request: GateRequest) -> tuple[dict[str, Any], int]:
    store = _open(db)
    try:
        return judge_and_record(store, request)
    finally:
        store.close()


def run_gate(store, request: GateRequest):
    """Collect the evidence of `request` from `store` and judge it (nothing recorded)."""
    from shadow.gate.collect import collect_evidence
    from shadow.gate.verdict import decide

    evidence = collect_evidence(
        store, fleet=request.fleet, candidate=request.candidate, baseline=request.baseline,
        since=request.since, until=request.until,
        horizon=request.horizon,
    )  # fmt: skip
    return decide(evidence, request.thresholds)


def judge_and_record(store, request: GateRequest) -> tuple[dict[str, Any], int]:
    """One gate run on `store`: judged, recorded (gate_runs, audit log, the fleet's mode
    unless a dry run); the report document and the run id. The service's gate endpoint
    and `shadow gate --db` both run exactly this."""
    from shadow.gate.record import record_gate_run

    document = run_gate(store, request).as_json(__version__)
    document["dry_run"] = request.dry_run
    run_id = record_gate_run(store, document, dry_run=request.dry_run)
    return document, run_id


def _print(console: Console, document: dict[str, Any], output_format: str | None) -> None:
    if output_format is None and console.is_terminal:
        _print_table(console, document)
        return
    render = {"text": as_text, "markdown": as_markdown, "json": json_text, "junit": as_junit}
    console.out(render[output_format or "text"](document), highlight=False, end="")


def _print_table(console: Console, document: dict[str, Any]) -> None:
    """Today's Rich table, for a terminal (which wraps to its own width)."""
    table = Table(title=title(document))
    for column in COLUMNS:
        table.add_column(column, overflow="fold")
    for row in document["rows"]:
        table.add_row(*row_cells(row))
    console.print(table)
    verdict = document["verdict"]
    colour = {"PASS": "green", "FAIL": "red", "MARGINAL": "yellow"}.get(verdict, "magenta")
    for line in disagreement_lines(document):
        console.print(line, markup=False, highlight=False)
    console.print(f"[bold {colour}]{escape(document['deciding_rule'])}[/bold {colour}]")
