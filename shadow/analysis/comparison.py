"""The paper-style comparison table over a set of evaluated windows.

Every shadow policy's per-window metrics against the incumbent's replay on the same
windows, and its ratios with 95% intervals computed as the gate computes them
(`shadow.gate.statistics.estimate_ratio`, on the windows the gate keeps: past the
warm-up, paired, a moving-block bootstrap over continuous windows): throughput is tokens
over busy time, imbalance the mean over steps, TPOT P95 the P95 over the per-request
TPOTs pooled across windows. So the table shows what the gate decides on, and what a full
replay of the same arrivals measures.

A page draws fewer resamples than the gate (`RESAMPLES`, 1,000, against the gate's
10,000): the 2.5th and 97.5th percentiles of 1,000 draws move by a few hundredths of the
interval's width between seeds, below what the table prints, at a tenth of the cost. The
point ratios are the gate's exactly. The cost is the pooled TPOT percentile (a rank
search over the requests of the windows drawn, per resample), so it grows with traffic:
measured with seven policies (2 shared cores), an hour of 30 s windows (120) at 300
requests per window takes about 0.15 s, a day (2,880) about 1 s at 50 requests per
window and 2 s at 300: a page over a day waits for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from shadow.gate.statistics import BootstrapResult, estimate_ratio
from shadow.gate.thresholds import Thresholds
from shadow.gate.verdict import past_warmup
from shadow.stream.window_metrics import decode_tpot_array
from shadow.stream.windows import OBSERVED, WINDOW_METRICS

#: ratio name -> window metric it compares
RATIOS = {"imbalance": "imbalance_mean", "throughput": "throughput_tok_s",
          "tpot_p95": "tpot_p95_ms"}  # fmt: skip
#: bootstrap resamples of a page (the gate draws `Thresholds.bootstrap_resamples`)
RESAMPLES = 1000


def _mean(values: np.ndarray) -> float | None:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


def _interval(result: BootstrapResult) -> dict[str, Any]:
    def value(x: float) -> float | None:
        return float(x) if np.isfinite(x) else None

    return {"point": value(result.point), "ci_low": value(result.ci_low),
            "ci_high": value(result.ci_high), "n": result.n}  # fmt: skip


def summary_table(
    columns: Mapping[str, np.ndarray],
    incumbent: str,
    *,
    resamples: int = RESAMPLES,
    thresholds: Thresholds | None = None,
) -> dict[str, Any]:
    """`columns`: window_metrics as arrays (`window_index`, `policy`, the WINDOW_METRICS;
    missing values NaN or masked; optionally `tpot_ms`, the stored per-request TPOTs, and
    the window's `run_start`, `run_start_held`). Returns `{"windows": n, "rows": [...]}`
    with `observed` first, then the incumbent, then the other policies by name; each
    row's metrics are means over all `n` windows, its ratios the gate's estimate
    (`thresholds`: its warm-up, block, confidence and seed) with `resamples` draws."""
    t = thresholds if thresholds is not None else Thresholds()
    index = np.asarray(columns["window_index"], dtype=np.int64)
    policies = np.asarray(columns["policy"]).astype(str)
    windows = np.unique(index)
    n = int(windows.shape[0])
    position = np.searchsorted(windows, index)
    run_start = _per_window(columns.get("run_start"), position, n)
    held = _per_window(columns.get("run_start_held"), position, n)
    evidence = np.array(
        [
            past_warmup(int(w), _opt_int(s), _opt_int(h), t.warmup_windows)
            for w, s, h in zip(windows.tolist(), run_start, held, strict=True)
        ],
        dtype=bool,
    )
    block = t.bootstrap_block_windows if np.isfinite(run_start).any() else 1
    blobs = columns.get("tpot_ms")
    table: dict[str, dict[str, np.ndarray]] = {}
    present: dict[str, np.ndarray] = {}
    tpots: dict[str, list[np.ndarray | None]] = {}
    for policy in np.unique(policies).tolist():
        mask = policies == policy
        table[policy] = {}
        for m in WINDOW_METRICS:
            values = np.full(n, np.nan)
            values[position[mask]] = _floats(columns[m])[mask]
            table[policy][m] = values
        present[policy] = np.zeros(n, dtype=bool)
        present[policy][position[mask]] = True
        tpots[policy] = [None] * n
        if blobs is not None:
            for i in np.flatnonzero(mask).tolist():
                tpots[policy][int(position[i])] = decode_tpot_array(_blob(blobs[i]))
    ratios: dict[tuple[str, str], dict[str, Any]] = {}
    if incumbent in table:
        for policy in table:
            if policy in (incumbent, OBSERVED):
                continue
            used = np.flatnonzero(evidence & present[policy] & present[incumbent])
            inc = {m: v[used] for m, v in table[incumbent].items()}
            cand = {m: v[used] for m, v in table[policy].items()}
            inc_tpot = [tpots[incumbent][i] for i in used.tolist()]
            cand_tpot = [tpots[policy][i] for i in used.tolist()]
            for name, key in RATIOS.items():
                if not used.size:
                    ratios[(policy, name)] = {"point": None, "ci_low": None,
                                              "ci_high": None, "n": 0}  # fmt: skip
                    continue
                found = estimate_ratio(
                    key, inc, cand, inc_tpot, cand_tpot, resamples=resamples,
                    confidence=t.confidence, seed=t.seed, block=block,
                )  # fmt: skip
                ratios[(policy, name)] = _interval(found)
    order = sorted(table, key=lambda p: (p != OBSERVED, p != incumbent, p))
    out = []
    for policy in order:
        row: dict[str, Any] = {"policy": policy}
        for m in WINDOW_METRICS:
            row[m] = _mean(table[policy][m])
        steps = table[policy]["steps"]
        row["steps"] = int(np.nansum(steps)) if np.isfinite(steps).any() else None
        row["ratios"] = {name: ratios.get((policy, name)) for name in RATIOS}
        out.append(row)
    return {"windows": n, "evidence_windows": int(evidence.sum()), "rows": out}


def _per_window(values: Any, position: np.ndarray, n: int) -> np.ndarray:
    """A window-level column repeated on each policy's row, as one value per window."""
    out = np.full(n, np.nan)
    if values is not None:
        out[position] = _floats(values)
    return out


def _opt_int(value: float) -> int | None:
    return None if not np.isfinite(value) else int(value)


def _blob(value: Any) -> bytes | None:
    if value is None or value is np.ma.masked:
        return None
    return bytes(value)


def _floats(values: Any) -> np.ndarray:
    """A fetched column as float64 with NULLs (masked or None) as NaN."""
    if isinstance(values, np.ma.MaskedArray):
        return values.astype(np.float64).filled(np.nan)
    array = np.asarray(values)
    if array.dtype == object:
        return np.array([np.nan if v is None else float(v) for v in array], dtype=np.float64)
    return array.astype(np.float64)


def rows_to_columns(rows: Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Row dicts (tests, small inputs) as the columns `summary_table` takes."""
    rows = list(rows)
    names = ("window_index", "policy", *WINDOW_METRICS)
    return {
        name: np.array([r.get(name) for r in rows], dtype=object if name == "policy" else float)
        if name != "window_index"
        else np.array([r["window_index"] for r in rows], dtype=np.int64)
        for name in names
    }
