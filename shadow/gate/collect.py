"""Reads the gate's evidence for one fleet and time range out of the service's database.

Paired windows (the candidate's and the incumbent's replay of the same window, and the
A/A replay), the decision audit (how many dispatches, the candidate's decision latency P99
over the rounds it ran, its invalid decisions and the rounds that raised or timed out),
critical invariant violations, the candidate predictor's calibration on the fleet's
completed requests (prequential, at the configured H), and the disagreements that say most.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shadow.gate.evidence import Evidence, WindowPair
from shadow.gate.source import EvidenceSource
from shadow.policies import NO_KEY, BalanceRouteConfig, make_policy, prompt_key_id
from shadow.predict import OraclePredictor, Predictor, prequential_calibrate
from shadow.storage.queries import STORED_SNAPSHOT, source, time_range, with_snapshots
from shadow.stream.window_metrics import decode_tpot
from shadow.stream.windows import AA

#: the candidate's own errors: a choice of a full worker, a round that raised or timed out
CANDIDATE_ERRORS = ("invalid_shadow_decision", "shadow_decision_error")
WINDOW_FIELDS = ("imbalance_mean", "throughput_tok_s", "tpot_p95_ms", "gap_mean",
                 "step_ms_mean", "steps", "busy_s")  # fmt: skip


def _range(column: str, since: float | None, until: float | None) -> tuple[str, dict]:
    """The shared time-range filter as a suffix of a `WHERE` (each condition after AND)."""
    conditions, params = time_range(column, since, until)
    return "".join(f" AND {c}" for c in conditions), params


def _metrics(row: dict[str, Any] | None) -> dict[str, float] | None:
    if row is None:
        return None
    return {k: float(row[k]) if row[k] is not None else float("nan") for k in WINDOW_FIELDS}


def collect_evidence(
    store: EvidenceSource,
    *,
    fleet: str,
    candidate: str,
    baseline: str,
    since: float | None = None,
    until: float | None = None,
    horizon: int | None = None,
    disagreements: int = 5,
) -> Evidence:
    window_clause, window_params = _range("t_start", since, until)
    params = {"fleet": fleet, **window_params}
    windows = store.query(
        f"SELECT * FROM windows WHERE fleet = :fleet{window_clause} ORDER BY window_index",
        params,
    )
    metrics: dict[int, dict[str, dict[str, Any]]] = {}
    if windows:
        low, high = windows[0]["window_index"], windows[-1]["window_index"]
        for row in store.query(
            "SELECT * FROM window_metrics WHERE fleet = :fleet AND window_index BETWEEN :low "
            "AND :high AND policy IN (:candidate, :baseline, :aa)",
            {"fleet": fleet, "low": low, "high": high, "candidate": candidate,
             "baseline": baseline, "aa": AA},
        ):  # fmt: skip
            metrics.setdefault(row["window_index"], {})[row["policy"]] = row
    pairs = []
    for window in windows:
        found = metrics.get(window["window_index"], {})
        if candidate not in found or baseline not in found:
            continue
        pairs.append(
            WindowPair(
                window["window_index"],
                int(window["requests"]),
                _metrics(found[baseline]),
                _metrics(found[candidate]),
                _metrics(found.get(AA)),
                window["fidelity_imbalance"],
                window["fidelity_step"],
                window.get("run_start"),
                window.get("run_start_held"),
                decode_tpot(found[baseline].get("tpot_ms")),
                decode_tpot(found[candidate].get("tpot_ms")),
                decode_tpot(found[AA].get("tpot_ms")) if AA in found else None,
            )
        )

    ts_clause, ts_params = _range("ts", since, until)
    base = {"fleet": fleet, **ts_params}
    decisions = source(store, "decisions", since, until)
    violations = source(store, "violations", since, until)
    events = source(store, "events", since, until)
    audited = store.query(
        f"SELECT count(DISTINCT ingest_id) AS n, min(ingest_id) AS low, max(ingest_id) AS high "
        f"FROM {decisions} WHERE fleet = :fleet{ts_clause}",
        base,
    )[0]
    dispatches = store.query(
        f"SELECT count(DISTINCT request_id) AS n FROM {events} WHERE fleet = :fleet "
        f"AND type = 'dispatch'{ts_clause}",
        base,
    )[0]["n"]
    latency = store.query(
        f"SELECT count(*) AS n, quantile_cont(latency_ms, 0.99) AS p99 FROM {decisions} "
        f"WHERE fleet = :fleet AND policy = :candidate AND latency_ms IS NOT NULL{ts_clause}",
        {**base, "candidate": candidate},
    )[0]
    own = ", ".join(f"'{kind}'" for kind in CANDIDATE_ERRORS)
    critical = store.query(
        f"SELECT count(*) AS n FROM {violations} WHERE fleet = :fleet AND severity = 'critical' "
        f"AND kind NOT IN ({own}){ts_clause}",
        base,
    )[0]["n"]
    errors = store.query(
        f"SELECT count(*) AS n FROM {violations} WHERE fleet = :fleet "
        f"AND kind IN ({own}) AND (detail LIKE :chose OR detail LIKE :failed){ts_clause}",
        {**base, "chose": f"{candidate} chose %", "failed": f"{candidate} failed deciding %"},
    )[0]["n"]
    step_values = [
        float(r["step_ms_mean"])
        for r in store.query(
            f"SELECT m.step_ms_mean FROM window_metrics m JOIN windows w USING (fleet, "
            f"window_index) WHERE m.fleet = :fleet AND m.policy = 'observed'{window_clause}",
            params,
        )
        if r["step_ms_mean"] is not None
    ]
    return Evidence(
        fleet=fleet,
        candidate=candidate,
        baseline=baseline,
        since=since,
        until=until,
        windows=tuple(pairs),
        decisions=int(audited["n"] or 0),
        dispatches=int(dispatches or 0),
        critical_violations=int(critical),
        candidate_errors=int(errors),
        decision_latency_p99_ms=None if not latency["n"] else float(latency["p99"]),
        step_ms_mean=float(np.mean(step_values)) if step_values else None,
        calibration_auc=_calibration(store, fleet, candidate, since, until, horizon),
        evidence_ids={
            "windows": [p.window_index for p in pairs],
            "decision_ingest_ids": [audited["low"], audited["high"]],
            "database": str(store.path),
        },
        disagreements=tuple(
            _disagreements(store, decisions, fleet, candidate, ts_clause, base, disagreements)
        ),
    )


def candidate_predictor(candidate: str) -> Predictor | None:
    """A fresh copy of the predictor the candidate routes with (None: it predicts nothing,
    or knows the truth, as the oracle does)."""
    predictor = getattr(make_policy(candidate), "predictor", None)
    if not isinstance(predictor, Predictor) or isinstance(predictor, OraclePredictor):
        return None
    return predictor


def _calibration(
    store: EvidenceSource,
    fleet: str,
    candidate: str,
    since: float | None,
    until: float | None,
    horizon: int | None,
) -> float | None:
    """AUC of "finishes within H" for the candidate's predictor on the fleet's completed
    requests in finish order, each scored before the predictor learns it (prequential),
    at `horizon` (None: the configured BalanceRoute default H)."""
    predictor = candidate_predictor(candidate)
    if predictor is None:
        return None
    if horizon is None:
        horizon = BalanceRouteConfig().horizon
    clause, params = _range("f.ts", since, until)
    finishes = source(store, "events", since, until, "f")
    readies = source(store, "events", alias="r")  # a ready may precede the range
    rows = store.query(
        f"SELECT f.output_tokens AS o, r.prompt_hash AS h FROM {finishes} LEFT JOIN {readies} "
        f"ON r.fleet = f.fleet AND r.request_id = f.request_id AND r.type = 'ready' "
        f"WHERE f.fleet = :fleet AND f.type = 'finish' AND f.joined_to IS NULL "
        f"AND f.reason IN ('stop', 'length') "
        f"AND f.output_tokens >= 1{clause} ORDER BY f.ts, f.ingest_id",
        {"fleet": fleet, **params},
    )
    if len(rows) < 10:
        return None
    outputs = np.array([r["o"] for r in rows], dtype=np.int64)
    keys = np.array(
        [prompt_key_id(r["h"]) if r["h"] is not None else int(NO_KEY) for r in rows],
        dtype=np.int64,
    )
    score = prequential_calibrate(predictor, outputs, keys, horizon=horizon).auc
    return None if np.isnan(score) else float(score)


def _disagreements(
    store: EvidenceSource,
    decisions: str,
    fleet: str,
    candidate: str,
    clause: str,
    params: dict,
    limit: int,
) -> list[dict[str, Any]]:
    """The candidate's disagreements that would have changed the gap the most (a request
    its round held back has no choice to compare)."""
    rows = store.query(
        f"SELECT ingest_id, ts, request_id, prompt_tokens, incumbent_worker, choice, "
        f"f_br0_incumbent, f_br0_choice, f_brh_incumbent, f_brh_choice, "
        f"{STORED_SNAPSHOT} AS snapshot "
        f"FROM {decisions} WHERE fleet = :fleet AND policy = :candidate AND NOT agrees "
        f"AND choice IS NOT NULL"
        f"{clause} ORDER BY (f_br0_choice - f_br0_incumbent) DESC, ingest_id LIMIT :limit",
        {**params, "candidate": candidate, "limit": limit},
    )
    with_snapshots(store, decisions, fleet, rows)
    return rows
