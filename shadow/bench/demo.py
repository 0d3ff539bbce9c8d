"""What the README demo shows against the truth of its own traffic (`shadow bench demo`).

The demo (`shadow serve --demo`, a real process on a scratch database) runs for a while;
its comparison table (`GET /v1/fleets/{fleet}/summary`: BR-0 and BR-H against the
incumbent's replay, estimated from the continuous counterfactual windows) is read, and
the service stopped. The truth is the demo's own recorded arrivals (each request's ready
time, prompt tokens and true output tokens, from the events in the database), over the
evaluated windows' span, replayed end to end offline under each policy with the fleet
(G, B) and the step model the service's counterfactuals used, through `shadow replay`'s
path (`replay.run.replay_policy`), deciding each arrival on arrival as the demo's router
does (and as the service replays windows whose arrivals land mid-step). Each ratio is
judged with the bias test's tolerance (`bias.within_tolerance`) and its interval's
coverage.

Two more numbers say where a difference comes from. The windows refit the step model as
engine steps come in, and a live stream has no last window to drain the runs; the same
arrivals replayed under the windows' own step models, window by window and undrained
(`as_the_windows_ran`), is what the table estimated (its imbalance ratio equals the
table's). And the truth under each step model the windows fitted (first, median, last)
says how far the truth itself moves with a step model that is off by a fraction of a
percent: on the demo's 4 x 16 fleet after 3 minutes, further than the tolerance.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from shadow.bench.bias import within_tolerance
from shadow.gate.source import open_evidence
from shadow.policies import NO_KEY, make_policy, prompt_key_id
from shadow.replay.engine import FleetReplay
from shadow.replay.run import replay_policy
from shadow.replay.workload import StepModel, Workload
from shadow.workloads.traces import write_trace
from shadow.world.process import ServerProcess

#: the policies the demo's table is read for (README: "BR-0 and BR-H against the incumbent")
POLICIES = ("br0", "brh-survival")
#: summary ratio -> the replay summary's metric it estimates
RATIOS = {"throughput": "throughput_tok_s", "tpot_p95": "tpot_p95_ms",
          "imbalance": "imbalance_mean"}  # fmt: skip


@dataclass(frozen=True)
class DemoCell:
    metric: str
    policy: str
    shown: float | None
    ci_low: float | None
    ci_high: float | None
    #: `shadow replay` of the recorded arrivals under the last fitted step model, drained
    truth: float
    #: the truth's range over the step models the windows fitted (first, median, last)
    truth_low: float
    truth_high: float
    #: imbalance only: the arrivals replayed as the windows ran them (their step models,
    #: undrained); None for the other metrics
    as_windows_ran: float | None = None

    @property
    def within(self) -> bool:
        return within_tolerance(self.shown, self.truth)

    @property
    def covered(self) -> bool:
        if self.ci_low is None or self.ci_high is None:
            return False
        return self.ci_low <= self.truth <= self.ci_high


@dataclass(frozen=True)
class Recording:
    """What the counterfactuals were fed, read back from the stopped demo's database."""

    #: the evaluated windows' arrivals, ready times from the first window's start
    workload: Workload
    workers: int
    batch: int
    #: per evaluated window: its end (s from the first window's start), its step model
    windows: tuple[tuple[float, StepModel], ...]
    #: arrivals in the windows' span without a finish when the demo stopped (left out)
    unfinished: int


@dataclass(frozen=True)
class DemoCheck:
    seconds: float
    incumbent: str
    recording: Recording
    cells: tuple[DemoCell, ...]

    @property
    def step_model(self) -> StepModel:
        return self.recording.windows[-1][1]

    def as_dict(self) -> dict[str, Any]:
        r = self.recording
        return {
            "seconds": self.seconds,
            "incumbent": self.incumbent,
            "workers": r.workers,
            "batch": r.batch,
            "windows": len(r.windows),
            "requests": len(r.workload),
            "unfinished": r.unfinished,
            "step_model": asdict(self.step_model),
            "cells": [{**asdict(c), "within": c.within, "covered": c.covered} for c in self.cells],
        }


def run_demo(db: Path, seconds: float, fleet: str = "default") -> dict[str, Any]:
    """`shadow serve --demo` on `db` for `seconds` of its traffic; its summary table."""
    server = ServerProcess(db, demo=True).start()
    try:
        time.sleep(seconds)
        response = httpx.get(f"{server.url}/v1/fleets/{fleet}/summary", timeout=120.0)
        response.raise_for_status()
        return response.json()
    finally:
        server.stop()


def recorded(db: Path, summary: dict[str, Any], fleet: str = "default") -> Recording:
    """The arrivals of the windows `summary` covers (each request's ready time, prompt
    tokens and true output tokens), the fleet's G and B, and the windows' step models."""
    t0, t1 = summary["t_start"], summary["t_end"]
    store = open_evidence(db)
    try:
        rows = store.query(
            "SELECT r.ts AS ts, r.prompt_tokens AS prompt, r.prompt_hash AS h, "
            "f.output_tokens AS output FROM events r LEFT JOIN events f ON "
            "f.fleet = r.fleet AND f.request_id = r.request_id AND f.type = 'finish' "
            "AND f.joined_to IS NULL WHERE r.fleet = :fleet AND r.type = 'ready' "
            "AND r.ts >= :t0 AND r.ts < :t1 ORDER BY r.ts, r.ingest_id",
            {"fleet": fleet, "t0": t0, "t1": t1},
        )
        shape = store.query(
            "SELECT count(DISTINCT worker) AS g, max(capacity) AS b FROM events "
            "WHERE fleet = :fleet AND type = 'worker'",
            {"fleet": fleet},
        )[0]
        windows = store.query(
            "SELECT t_end, a_ms_per_token AS a, b_ms AS b FROM windows WHERE fleet = :fleet "
            "AND t_start >= :t0 AND t_start < :t1 ORDER BY window_index",
            {"fleet": fleet, "t0": t0, "t1": t1},
        )
    finally:
        store.close()
    done = [r for r in rows if r["output"] is not None and r["output"] >= 1]
    workload = Workload.from_arrays(
        "demo-recorded",
        np.array([r["ts"] - t0 for r in done]),
        np.array([r["prompt"] for r in done]),
        np.array([r["output"] for r in done]),
        np.array([prompt_key_id(r["h"]) if r["h"] else int(NO_KEY) for r in done]),
    )
    steps = tuple((w["t_end"] - t0, StepModel(w["a"], w["b"])) for w in windows)
    return Recording(workload, int(shape["g"]), int(shape["b"]), steps, len(rows) - len(done))


def truth(recording: Recording, policy: str, model: StepModel) -> dict[str, float]:
    """`shadow replay`'s summary of the recorded arrivals under `policy` and `model`."""
    r = recording
    return replay_policy(
        r.workload, policy, workers=r.workers, batch=r.batch, step_model=model,
        decide_on_arrival=True,
    ).metrics  # fmt: skip


def as_the_windows_ran(recording: Recording, policy: str) -> float:
    """The mean imbalance over the steps that start inside the windows, of the recorded
    arrivals replayed as the continuous runs replayed them: fed window by window, each
    window under its own step model, not drained past the last window's end."""
    r = recording
    arrivals = r.workload
    ready_ms = arrivals.ready_s * 1000.0
    fleet = FleetReplay(
        make_policy(policy), workers=r.workers, batch=r.batch, step_model=r.windows[0][1],
        decide_on_arrival=True,
    )  # fmt: skip
    added, starts, loads = 0, [], []
    for end_s, model in r.windows:
        fleet.model = model
        end_ms = end_s * 1000.0
        known = int(np.searchsorted(ready_ms, end_ms, side="left"))
        if known > added:
            fleet.add_requests(
                ready_ms[added:known], arrivals.prompt_tokens[added:known],
                arrivals.output_tokens[added:known], arrivals.prompt_keys[added:known],
            )  # fmt: skip
            added = known
        fleet.advance(end_ms)
        block = fleet.take_steps()
        starts.append(block.start_ms)
        loads.append(block.worker_load)
    start, load = np.concatenate(starts), np.concatenate(loads)
    inside = load[start < r.windows[-1][0] * 1000.0]
    return float((inside.max(axis=1) - inside.min(axis=1)).mean())


def check(db: Path, seconds: float = 180.0, fleet: str = "default") -> DemoCheck:
    """Run the demo, read its table, and replay its recorded arrivals for the truth."""
    db.unlink(missing_ok=True)
    summary = run_demo(db, seconds, fleet)
    return compare(db, summary, seconds, fleet)


def compare(db: Path, summary: dict[str, Any], seconds: float, fleet: str = "default") -> DemoCheck:
    """The demo's table against the offline replays of what it recorded."""
    if not summary.get("windows"):
        raise RuntimeError(f"the demo evaluated no window in {seconds:g} s")
    recording = recorded(db, summary, fleet)
    incumbent = summary["incumbent"]
    fits = [model for _, model in recording.windows]
    median = StepModel(
        float(np.median([m.a_ms_per_token for m in fits])),
        float(np.median([m.b_ms for m in fits])),
    )
    # the last fit is the one the runs ended on; first and median bound the truth's spread
    models = (fits[-1], fits[0], median)
    names = (incumbent, *POLICIES)
    truths = [{name: truth(recording, name, model) for name in names} for model in models]
    windows_ran = {name: as_the_windows_ran(recording, name) for name in names}
    rows = {row["policy"]: row for row in summary["rows"]}
    cells = []
    for name, key in RATIOS.items():
        for policy in POLICIES:
            shown = (rows.get(policy, {}).get("ratios") or {}).get(name) or {}
            ratios = [t[policy][key] / t[incumbent][key] for t in truths]
            ran = windows_ran[policy] / windows_ran[incumbent] if name == "imbalance" else None
            cells.append(
                DemoCell(name, policy, shown.get("point"), shown.get("ci_low"),
                         shown.get("ci_high"), ratios[0], min(ratios), max(ratios), ran)
            )  # fmt: skip
    return DemoCheck(seconds, incumbent, recording, tuple(cells))


def export_trace(recording: Recording, path: Path) -> None:
    """The recorded arrivals as a trace `shadow replay` reads (jsonl or csv by extension)."""
    write_trace(recording.workload, path)


def table(result: DemoCheck) -> str:
    """Plain text, one ratio per line (a CI log reads it)."""

    def fmt(value: float | None) -> str:
        return "-" if value is None or math.isnan(value) else f"{value:.4f}"

    r, m = result.recording, result.step_model
    fixed = [model.b_ms for _, model in r.windows]
    lines = [
        f"demo after {result.seconds:g} s: {len(r.windows)} windows, {len(r.workload)} "
        f"recorded requests ({r.unfinished} unfinished, left out), G = {r.workers}, "
        f"B = {r.batch}, incumbent {result.incumbent}; truth: `shadow replay` under the last "
        f"fitted step model {m.a_ms_per_token:.3g} ms/token x max L + {m.b_ms:.3f} ms "
        f"(the windows' fixed part {min(fixed):.3f}-{max(fixed):.3f} ms)",
        f"{'metric':<11} {'policy':<13} {'demo shows':>10} {'interval':>19} "
        f"{'offline truth':>13}  within?  covered?  {'truth over fits':>17}  as windows ran",
    ]
    for c in result.cells:
        lines.append(
            f"{c.metric:<11} {c.policy:<13} {fmt(c.shown):>10} "
            f"{'[' + fmt(c.ci_low) + ', ' + fmt(c.ci_high) + ']':>19} {fmt(c.truth):>13}  "
            f"{'yes' if c.within else 'NO':<7}  {'yes' if c.covered else 'NO':<8}  "
            f"{fmt(c.truth_low) + '-' + fmt(c.truth_high):>17}  {fmt(c.as_windows_ran)}"
        )
    within = sum(c.within for c in result.cells)
    covered = sum(c.covered for c in result.cells)
    lines.append(f"within tolerance {within}/{len(result.cells)}, covered "
                 f"{covered}/{len(result.cells)}")  # fmt: skip
    return "\n".join(lines)
