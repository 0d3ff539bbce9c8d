"""The gate report's JSON schema, for OpenAPI: what `GET /v1/fleets/{fleet}/gate` and the
other gate endpoints answer, and what `shadow gate --json` writes (schema 1,
`shadow.gate.report.GateReport.as_json`, plus the recorded run's `id` and `ts`).

Documentation only: the endpoints return the document as the gate wrote it (a model would
turn an integer count into a float and change the bytes `--url` must share with `--db`);
tests/test_gate_service.py validates real answers against this schema. Objects allow
more fields than listed, so adding one to the report is not a breaking change."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE", "MARGINAL", "ERROR"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class GateRow(_Open):
    """One rule: what was measured, against which margin, and the outcome."""

    metric: str
    role: str = Field(description="HARD, PRIMARY, OBJECTIVE, GUARD, NOISE or EVIDENCE")
    n: int
    incumbent: float | None
    candidate: float | None
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    margin: str = Field(description='the rule in words, e.g. ">= 0.99"')
    label: str = Field(description='"pass", "fail", "straddles", "missing", "dry run", ...')
    rule: str = Field(description="the evaluation with its numbers")
    dry_run: bool = Field(description="the rule is reported but never decides")


class GateBootstrap(_Open):
    point: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    dropped: int


class GateEvidence(_Open):
    fleet: str
    candidate: str
    baseline: str
    since: float | None
    until: float | None
    windows: int
    decisions: int
    critical_violations: int
    candidate_errors: int
    decision_latency_p99_ms: float | None
    step_ms_mean: float | None
    calibration_auc: float | None


class GateReportDocument(_Open):
    """The gate's report (schema 1) as one run recorded it."""

    schema_: int = Field(alias="schema", description="the report's schema version (1)")
    verdict: Verdict
    exit_code: int = Field(description="PASS 0, FAIL 1, INCONCLUSIVE 3, MARGINAL 4, ERROR 5")
    deciding_rule: str = Field(description="the one sentence that explains the verdict")
    rows: list[GateRow]
    bootstrap: dict[str, GateBootstrap]
    evidence: GateEvidence
    thresholds: dict[str, Any]
    evidence_ids: dict[str, Any]
    tool_version: str
    config_hash: str = Field(description="sha256 of what configured the run")
    disagreements: list[dict[str, Any]]
    dry_run: bool
    id: int = Field(description="the recorded gate run (GET /v1/gate/runs/{id})")
    ts: float = Field(description="when it was recorded (Unix seconds)")


class GateExplanation(BaseModel):
    metric: str
    text: str = Field(description="the rule evaluation and, for interval rules, the bootstrap")


#: the `responses=` of an endpoint that answers a report (with `status` its code)
def report_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {status: {"model": GateReportDocument, "description": "the gate's report"}
            for status in statuses}  # fmt: skip
