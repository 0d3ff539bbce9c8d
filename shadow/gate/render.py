"""The gate's report for where it is read: plain text for a CI log, markdown for a job
summary, JUnit XML for a CI test widget. Each is drawn from the JSON document (`--json`),
not from the in-memory report, so `shadow gate --url` (which only has the document the
service answered) prints exactly what `shadow gate --db` prints.

Nothing here wraps: a CI log is not a terminal, and a line cut at 80 columns splits words
("criti / cal_v / iolat / ions"). Tables are sized to their content instead."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from typing import Any

#: the columns of every tabular layout, in order (the Rich table uses them too)
COLUMNS = ("metric", "role", "n", "incumbent", "candidate", "ratio", "95% CI", "margin",
           "label", "rule")  # fmt: skip
#: a row's label that makes its JUnit test case a failure / a pass; any other is "skipped"
FAILED_LABEL = "fail"
PASSED_LABEL = "pass"
FORMATS = ("text", "markdown", "json", "junit")


def _fmt(value: object, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def row_cells(row: dict[str, Any]) -> list[str]:
    """One report row as the strings of `COLUMNS` (one line each)."""
    ci = "-" if row["ci_low"] is None else f"[{_fmt(row['ci_low'])}, {_fmt(row['ci_high'])}]"
    cells = [row["metric"], row["role"], _fmt(row["n"]), _fmt(row["incumbent"]),
             _fmt(row["candidate"]), _fmt(row["ratio"]), ci, _fmt(row["margin"]), row["label"],
             row["rule"]]  # fmt: skip
    return [_one_line(cell) for cell in cells]


def sample_note(share: float | None, dispatches: int | None) -> str:
    """`, a 25% sample of 4,000` when the audit sampled; nothing when it audited all."""
    if share is None or dispatches is None or share >= 1.0:
        return ""
    return f", a {share:.0%} sample of {dispatches:,}"


def title(document: dict[str, Any]) -> str:
    """The headline: who is judged against whom, on how much evidence."""
    ev = document["evidence"]
    note = sample_note(ev.get("audited_share"), ev.get("dispatches"))
    return (
        f"Gate: {ev['candidate']} vs {ev['baseline']} on fleet {ev['fleet']} "
        f"({ev['windows']} windows, {ev['decisions']:,} audited dispatches{note})"
    )


def disagreement_lines(document: dict[str, Any]) -> list[str]:
    """The most informative disagreements, one line each (none: no lines)."""
    found = document.get("disagreements") or []
    if not found:
        return []
    candidate = document["evidence"]["candidate"]
    lines = ["Most informative disagreements (largest change of the gap):"]
    for d in found:
        lines.append(
            f"  {d['request_id']} ({d['prompt_tokens']} prompt tokens) at {d['ts']:.3f}: "
            f"incumbent -> {d['incumbent_worker']} (F {d['f_br0_incumbent']:.0f}), "
            f"{candidate} -> {d['choice']} (F {d['f_br0_choice']:.0f}); "
            f"loads {d['snapshot']['loads']}"
        )
    return lines


def as_text(document: dict[str, Any]) -> str:
    """The plain layout: a title, a table sized to its content (one metric a line), the
    disagreements, and the deciding rule as the last line."""
    rows = [list(COLUMNS)] + [row_cells(row) for row in document["rows"]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [title(document)]
    for row in rows:
        # the last column (the rule) is not padded: no trailing blanks
        padded = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    lines += disagreement_lines(document)
    lines.append(_one_line(document["deciding_rule"]))
    return "\n".join(lines) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|")


def as_markdown(document: dict[str, Any]) -> str:
    """GitHub-flavoured markdown for `$GITHUB_STEP_SUMMARY`: a heading with the verdict, a
    table, the deciding rule."""
    lines = [f"### {_md_cell(title(document))}: **{document['verdict']}**", ""]
    lines.append("| " + " | ".join(COLUMNS) + " |")
    lines.append("|" + "|".join(" --- " for _ in COLUMNS) + "|")
    for row in document["rows"]:
        lines.append("| " + " | ".join(_md_cell(cell) for cell in row_cells(row)) + " |")
    lines.append("")
    extra = disagreement_lines(document)
    if extra:
        lines += [extra[0], ""] + [f"- {_md_cell(line.strip())}" for line in extra[1:]] + [""]
    lines.append(f"**{_md_cell(_one_line(document['deciding_rule']))}**")
    return "\n".join(lines) + "\n"


def as_junit(document: dict[str, Any]) -> str:
    """JUnit XML: one test case per rule (report row), a FAIL rule as a `<failure>`, a rule
    that neither passed nor failed (straddles, missing, dry run...) as `<skipped>`; the
    verdict and the deciding rule as suite properties and its output."""
    ev = document["evidence"]
    rows = document["rows"]
    failures = sum(row["label"] == FAILED_LABEL for row in rows)
    skipped = sum(row["label"] not in (FAILED_LABEL, PASSED_LABEL) for row in rows)
    counts = {"tests": str(len(rows)), "failures": str(failures), "errors": "0",
              "skipped": str(skipped), "time": "0"}  # fmt: skip
    suites = ElementTree.Element("testsuites", {"name": "shadow gate", **counts})
    suite = ElementTree.SubElement(
        suites,
        "testsuite",
        {"name": f"gate {ev['candidate']} vs {ev['baseline']} on fleet {ev['fleet']}", **counts},
    )
    properties = ElementTree.SubElement(suite, "properties")
    for name in ("verdict", "exit_code", "deciding_rule", "config_hash", "tool_version"):
        ElementTree.SubElement(properties, "property", {"name": name, "value": str(document[name])})
    for row in rows:
        names = {"classname": f"shadow.gate.{row['role']}", "name": row["metric"], "time": "0"}
        case = ElementTree.SubElement(suite, "testcase", names)
        message = f"{row['label']}: {_one_line(row['rule'])} (margin {row['margin']})"
        if row["label"] == FAILED_LABEL:
            failure = ElementTree.SubElement(case, "failure", {"message": message, "type": "FAIL"})
            failure.text = message
        elif row["label"] != PASSED_LABEL:
            ElementTree.SubElement(case, "skipped", {"message": message})
    out = ElementTree.SubElement(suite, "system-out")
    out.text = _one_line(document["deciding_rule"])
    ElementTree.indent(suites)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        + ElementTree.tostring(suites, encoding="unicode")
        + "\n"
    )
