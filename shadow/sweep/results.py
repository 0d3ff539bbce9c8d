"""What a sweep says: per-parameter sensitivity tables and the heatmap over two parameters.

Input is the list of cells as plain rows (`{"params": {...}, "metrics": {...}}`). Seeds
are replicates: a *configuration* is a cell's parameters without its seed, and its metrics
are the mean over its seeds. Parameters a policy does not read are None in its cells; such
a cell stands for every value of that parameter (a `jsq` cell lies on every `beta` column).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shadow.sweep.grid import PARAMS

THROUGHPUT = "throughput_tok_s"
TPOT = "tpot_p95_ms"


def _num(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) else value


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))


def configurations(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Cells grouped over seeds: `{"params" (seed dropped), "seeds", "metrics" (means),
    "spread" (max - min throughput over the seeds)}`, in first-seen order."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        params = {k: v for k, v in row["params"].items() if k != "seed"}
        groups.setdefault(json.dumps(params, sort_keys=True), []).append(row)
    out = []
    for members in groups.values():
        metrics = {
            name: _mean([_num(m["metrics"].get(name)) for m in members])
            for name in members[0]["metrics"]
        }
        tput = [t for m in members if (t := _num(m["metrics"].get(THROUGHPUT))) is not None]
        out.append(
            {
                "params": {k: v for k, v in members[0]["params"].items() if k != "seed"},
                "seeds": sorted(m["params"].get("seed") for m in members),
                "metrics": metrics,
                "spread": (max(tput) - min(tput)) if len(tput) > 1 else 0.0,
            }
        )
    return out


def _best(configs: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """Highest throughput; ties to the lower TPOT P95."""
    ranked = [c for c in configs if c["metrics"].get(THROUGHPUT) is not None]
    if not ranked:
        return None
    return max(
        ranked, key=lambda c: (c["metrics"][THROUGHPUT], -(c["metrics"].get(TPOT) or math.inf))
    )


def _range(configs: Sequence[Mapping[str, Any]], metric: str) -> tuple[float, float] | None:
    values = [v for c in configs if (v := c["metrics"].get(metric)) is not None]
    return (min(values), max(values)) if values else None


def _varied(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for name in PARAMS:
        if name in ("seed", "policy"):
            continue
        if len({json.dumps(c["params"].get(name)) for c in configs}) > 1:
            out.append(name)
    return out


def fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _alone_effect(configs: Sequence[Mapping[str, Any]], name: str) -> float:
    """The largest throughput change from varying `name` alone (others held fixed)."""
    groups: dict[str, list[float]] = {}
    for c in configs:
        if c["params"].get(name) is None:
            continue
        others = {k: v for k, v in c["params"].items() if k != name}
        value = c["metrics"].get(THROUGHPUT)
        if value is not None:
            groups.setdefault(json.dumps(others, sort_keys=True), []).append(value)
    spans = [max(v) - min(v) for v in groups.values() if len(v) > 1]
    return max(spans) if spans else 0.0


def _policy_summary(policy: str, configs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    varied = _varied(configs)
    best = _best(configs)
    tput, tpot = _range(configs, THROUGHPUT), _range(configs, TPOT)
    seeds = sorted({s for c in configs for s in c["seeds"]})
    spread = max((c["spread"] for c in configs), default=0.0)
    sentence = f"{policy}: {len(configs)} configuration{'s' if len(configs) != 1 else ''}"
    if len(seeds) > 1:
        sentence += f" (means of {len(seeds)} seeds)"
    if tput is not None:
        sentence += f"; throughput {tput[0]:,.0f} to {tput[1]:,.0f} tok/s"
    if tpot is not None:
        sentence += f", TPOT P95 {tpot[0]:.1f} to {tpot[1]:.1f} ms"
    if len(seeds) > 1:
        sentence += f"; the same configuration varies by up to {spread:,.0f} tok/s across seeds"
    params = []
    for name in varied:
        values = sorted(
            {c["params"][name] for c in configs if c["params"].get(name) is not None},
            key=_sort_key,
        )
        rows = []
        for value in values:
            subset = [c for c in configs if c["params"].get(name) in (value, None)]
            top = _best(subset)
            sub_tput, sub_tpot = _range(subset, THROUGHPUT), _range(subset, TPOT)
            rows.append(
                {
                    "value": value,
                    "configs": len(subset),
                    "best_throughput_tok_s": None if top is None else top["metrics"][THROUGHPUT],
                    "best_tpot_p95_ms": None if top is None else top["metrics"].get(TPOT),
                    "best_at": None
                    if top is None
                    else {k: top["params"][k] for k in varied if k != name},
                    "throughput_min": None if sub_tput is None else sub_tput[0],
                    "throughput_max": None if sub_tput is None else sub_tput[1],
                    "tpot_p95_min": None if sub_tpot is None else sub_tpot[0],
                    "tpot_p95_max": None if sub_tpot is None else sub_tpot[1],
                }
            )
        effect = _alone_effect(configs, name)
        listed = ", ".join(fmt_value(v) for v in values)
        text = f"across {name} in [{listed}]"
        if tput is not None:
            text += f", throughput stays within {tput[0]:,.0f} to {tput[1]:,.0f} tok/s"
        if tpot is not None:
            text += f" (TPOT P95 {tpot[0]:.1f} to {tpot[1]:.1f} ms)"
        base = best["metrics"][THROUGHPUT] if best is not None else None
        share = f" ({effect / base:.1%})" if base else ""
        text += f"; {name} alone moves it by at most {effect:,.0f} tok/s{share}"
        if best is not None:
            text += (
                f"; best at {name} = {fmt_value(best['params'][name])} "
                f"({best['metrics'][THROUGHPUT]:,.0f} tok/s)"
            )
        params.append({"param": name, "rows": rows, "alone_effect": effect, "sentence": text})
    return {
        "policy": policy,
        "configs": len(configs),
        "seeds": seeds,
        "varied": varied,
        "best": None
        if best is None
        else {"params": {k: best["params"][k] for k in varied}, "metrics": best["metrics"]},
        "throughput_range": tput,
        "tpot_p95_range": tpot,
        "seed_spread_max": spread,
        "sentence": sentence,
        "params": params,
    }


def summarize_sweep(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per policy (in first-seen order): its configurations' ranges, the best one, and per
    varied parameter a row per value (best cell there and the range over the others)."""
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for config in configurations(rows):
        by_policy.setdefault(str(config["params"]["policy"]), []).append(config)
    return [_policy_summary(policy, configs) for policy, configs in by_policy.items()]


def heatmap(
    rows: Sequence[Mapping[str, Any]],
    x: str,
    y: str,
    metric: str,
    filters: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`metric` over the grid of `x` by `y`: `z[j][i]` is the mean over the cells at
    (`x = values[i]`, `y = values[j]`) matching `filters`, over seeds and every other
    parameter; None where no cell lies."""
    if x == y:
        raise ValueError("x and y must be two different parameters")
    selected = [
        r for r in rows if all(r["params"].get(k) in (v, None) for k, v in (filters or {}).items())
    ]

    def axis(name: str) -> list[Any]:
        # The sweep's values, not only the selection's: the axes stay put when a filter
        # picks a policy that ignores them (its cells then fill every column).
        values = {r["params"].get(name) for r in rows} - {None}
        return sorted(values, key=_sort_key)

    xs, ys = axis(x), axis(y)
    z: list[list[float | None]] = []
    for yv in ys:
        line: list[float | None] = []
        for xv in xs:
            values = [
                _num(r["metrics"].get(metric))
                for r in selected
                if r["params"].get(x) in (xv, None) and r["params"].get(y) in (yv, None)
            ]
            mean = _mean(values)
            line.append(None if mean is None else round(mean, 4))
        z.append(line)
    return {
        "x": {"name": x, "values": xs},
        "y": {"name": y, "values": ys},
        "metric": metric,
        "z": z,
        "cells": len(selected),
        "filters": dict(filters or {}),
    }


def _span(low: float | None, high: float | None, fmt: str) -> str:
    if low is None or high is None:
        return "-"
    return f"{fmt.format(low)}..{fmt.format(high)}"


PARAM_HEADINGS = ("configs", "best tok/s", "its TPOT P95", "best at", "tok/s range",
                  "TPOT P95 range")  # fmt: skip


def param_table_rows(param: Mapping[str, Any]) -> list[list[str]]:
    """One parameter's table (after a value column): see `PARAM_HEADINGS`."""
    out = []
    for row in param["rows"]:
        best, tpot = row["best_throughput_tok_s"], row["best_tpot_p95_ms"]
        at = ", ".join(f"{k} = {fmt_value(v)}" for k, v in (row["best_at"] or {}).items())
        out.append(
            [
                fmt_value(row["value"]),
                str(row["configs"]),
                "-" if best is None else f"{best:,.0f}",
                "-" if tpot is None else f"{tpot:.1f}",
                at or "-",
                _span(row["throughput_min"], row["throughput_max"], "{:,.0f}"),
                _span(row["tpot_p95_min"], row["tpot_p95_max"], "{:.1f}"),
            ]
        )
    return out


POLICY_HEADINGS = ("policy", "configs", "seeds", "best tok/s", "its TPOT P95", "best at",
                   "tok/s range", "TPOT P95 range", "seed spread tok/s")  # fmt: skip


def policy_table_rows(summaries: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """One row per policy: see `POLICY_HEADINGS`."""
    out = []
    for s in summaries:
        best = s["best"]
        tput = best["metrics"].get(THROUGHPUT) if best else None
        tpot = best["metrics"].get(TPOT) if best else None
        at = ", ".join(f"{k} = {fmt_value(v)}" for k, v in (best or {}).get("params", {}).items())
        low_t, high_t = s["throughput_range"] or (None, None)
        low_p, high_p = s["tpot_p95_range"] or (None, None)
        out.append(
            [
                s["policy"],
                str(s["configs"]),
                str(len(s["seeds"])),
                "-" if tput is None else f"{tput:,.0f}",
                "-" if tpot is None else f"{tpot:.1f}",
                at or "-",
                _span(low_t, high_t, "{:,.0f}"),
                _span(low_p, high_p, "{:.1f}"),
                f"{s['seed_spread_max']:,.0f}" if len(s["seeds"]) > 1 else "-",
            ]
        )
    return out
