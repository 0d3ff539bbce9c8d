"""`shadow gate` as a function: evidence in, a table, a sentence, a JSON report, an exit
code out. Kept beside the gate logic so the CLI only parses options."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
from rich.console import Console
from rich.table import Table

from shadow import __version__
from shadow.policies import POLICY_NAMES

ERROR_EXIT = 5
USAGE_EXIT = 2


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


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
) -> int:
    from shadow.gate.collect import collect_evidence
    from shadow.gate.record import record_gate_run
    from shadow.gate.report import explain as explain_metric
    from shadow.gate.thresholds import Thresholds, load_thresholds
    from shadow.gate.verdict import decide

    for name, value in (("--candidate", candidate), ("--baseline", baseline)):
        if value not in POLICY_NAMES:
            err_console.print(f"[red]error:[/red] {name}: unknown policy {value!r}")
            return USAGE_EXIT
    try:
        thresholds = load_thresholds(thresholds_path) if thresholds_path else Thresholds()
    except (OSError, ValueError) as error:
        err_console.print(f"[red]error:[/red] --thresholds: {error}")
        return USAGE_EXIT
    if show_thresholds:
        console.print(thresholds.as_toml(), markup=False)
        return 0
    if not db.exists():
        err_console.print(f"[red]ERROR[/red]: evidence missing: database {db} does not exist")
        return ERROR_EXIT
    from shadow.gate.source import open_evidence

    try:
        store = open_evidence(db)
    except duckdb.Error as error:
        err_console.print(f"[red]ERROR[/red]: evidence unreadable: {db}: {error}")
        return ERROR_EXIT
    try:
        evidence = collect_evidence(
            store, fleet=fleet, candidate=candidate, baseline=baseline, since=since, until=until
        )
        report = decide(evidence, thresholds)
        if explain is not None:
            try:
                console.print(explain_metric(report, explain), markup=False)
            except ValueError as error:
                err_console.print(f"[red]error:[/red] --explain: {error}")
                return USAGE_EXIT
            return 0
        _print(console, report)
        document = report.as_json(__version__)
        document["dry_run"] = dry_run
        if json_out is not None:
            json_out.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
            console.print(f"wrote {json_out}")
        record_gate_run(store, document, dry_run=dry_run)
    finally:
        store.close()
    if dry_run:
        return 0
    if report.verdict == "MARGINAL" and allow_marginal:
        return 0
    return report.exit_code


def _sample_note(evidence) -> str:
    """`, a 25% sample of 4,000` when the audit sampled; nothing when it audited all."""
    share = evidence.audited_share
    if share is None or share >= 1.0:
        return ""
    return f", a {share:.0%} sample of {evidence.dispatches:,}"


def _print(console: Console, report) -> None:
    evidence = report.evidence
    table = Table(
        title=f"Gate: {evidence.candidate} vs {evidence.baseline} on fleet {evidence.fleet} "
        f"({len(evidence.windows)} windows, {evidence.decisions:,} audited dispatches"
        f"{_sample_note(evidence)})"
    )
    for column in ("metric", "role", "n", "incumbent", "candidate", "ratio", "95% CI",
                   "margin", "label", "rule"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for row in report.rows:
        ci = "-" if row.ci_low is None else f"[{_fmt(row.ci_low)}, {_fmt(row.ci_high)}]"
        table.add_row(
            row.metric, row.role, _fmt(row.n), _fmt(row.incumbent), _fmt(row.candidate),
            _fmt(row.ratio), ci, _fmt(row.margin), row.label, row.rule,
        )  # fmt: skip
    console.print(table)
    colour = {"PASS": "green", "FAIL": "red", "MARGINAL": "yellow"}.get(report.verdict, "magenta")
    console.print(f"[bold {colour}]{report.deciding_rule}[/bold {colour}]")
    if evidence.disagreements:
        console.print("Most informative disagreements (largest change of the gap):")
        for d in evidence.disagreements:
            loads = d["snapshot"]["loads"]
            console.print(
                f"  {d['request_id']} ({d['prompt_tokens']} prompt tokens) at {d['ts']:.3f}: "
                f"incumbent -> {d['incumbent_worker']} (F {d['f_br0_incumbent']:.0f}), "
                f"{evidence.candidate} -> {d['choice']} (F {d['f_br0_choice']:.0f}); "
                f"loads {loads}"
            )
