"""What the README demo shows against the truth of its own traffic (`shadow bench demo`).

The demo (`shadow serve --demo`, a real process on a scratch database) sends its traffic
for a while (`demo_traffic_s`), its fleet drains, its last window is closed as the
evidence's last (`POST /v1/flush?final=true`: the continuous runs drain in it, as a full
replay runs until the fleet is empty); its comparison table (`GET /v1/fleets/{fleet}/
summary`: BR-0 and BR-H against the incumbent's replay, estimated from the continuous
counterfactual windows) is read, and the service stopped. The truth is the demo's own
recorded arrivals (each request's ready time, prompt tokens and true output tokens, from
the events in the database), over the evaluated windows' span, replayed end to end
offline under each policy with the fleet (G, B) and the one step model the continuous
runs stepped under (the windows' stored a and b; the runs keep the model they started
with), through `shadow replay`'s path (`analysis.replay_run.replay_policy`), deciding each arrival
on arrival as the demo's router does. Each ratio is judged with the bias test's tolerance
(`bias.within_tolerance`) and its interval's coverage.

Two more numbers say where a difference comes from: the same arrivals replayed as the
windows ran them (`as_the_windows_ran`: fed window by window, drained in the last), which
is what the table estimated; and the truth under the service's refits of the step model
(first, median, last), which says how far the truth itself would move under a model off
by a fraction of a percent (on the demo's 4 x 16 fleet, further than the tolerance: why
the runs keep one).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from shadow.analysis.replay_run import replay_policy
from shadow.bench.bias import interval_covers, within_tolerance
from shadow.gate.source import open_evidence
from shadow.policies import NO_KEY, make_policy, prompt_key_id
from shadow.replay.engine import FleetReplay
from shadow.replay.workload import StepModel, Workload
from shadow.workloads.traces import write_trace
from shadow.world.process import ServerProcess

#: the policies the demo's table is read for (README: "BR-0 and BR-H against the incumbent")
POLICIES = ("br0", "brh-survival")
#: `[windows] step_model_restart` for the check's demo. The emulator's steps are timed by
#: the wall clock, so on a loaded host its refits wander a few percent (measured with two
#: busy loops beside it: 7 restarts in 200 s at the default 1%, fixed part 60.5-64.1 ms;
#: the project's CI restarted them 3 times). The check needs one run, whose one model is
#: the truth's: the table and the truth step under the same model whichever fit it is.
CHECK_STEP_MODEL_RESTART = 0.25
#: summary ratio -> the replay summary's metric it estimates
RATIOS = {"throughput": "throughput_tok_s", "tpot_p95": "tpot_p95_ms",
          "imbalance": "imbalance_mean"}  # fmt: skip


class DemoCheckError(RuntimeError):
    """The demo's run cannot be compared with a replay (no window, restarted runs, no
    drain): a reason, not a failed ratio."""


@dataclass(frozen=True)
class DemoCell:
    metric: str
    policy: str
    shown: float | None
    ci_low: float | None
    ci_high: float | None
    #: `shadow replay` of the recorded arrivals under the runs' step model, drained
    truth: float
    #: the truth's range over that model and the service's refits (first, median, last)
    truth_low: float
    truth_high: float
    #: imbalance only: the arrivals replayed as the windows ran them (fed window by
    #: window, drained in the last); None for the other metrics
    as_windows_ran: float | None = None

    @property
    def within(self) -> bool:
        return within_tolerance(self.shown, self.truth)

    @property
    def covered(self) -> bool:
        return interval_covers(self.ci_low, self.ci_high, self.truth)


@dataclass(frozen=True)
class Recording:
    """What the counterfactuals were fed, read back from the stopped demo's database."""

    #: the evaluated windows' arrivals, ready times from the first window's start
    workload: Workload
    workers: int
    batch: int
    #: per evaluated window: its end (s from the first window's start), the step model
    #: its continuous runs stepped under
    windows: tuple[tuple[float, StepModel], ...]
    #: arrivals in the windows' span without a finish when the demo stopped (left out)
    unfinished: int
    #: the service's refits of the step model over the windows' span, in order
    fits: tuple[StepModel, ...] = ()
    #: the windows' run starts (one: the runs went on from the first window to the last)
    run_starts: tuple[int, ...] = ()


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


def run_demo(
    db: Path, seconds: float, fleet: str = "default", drain_timeout_s: float = 120.0
) -> dict[str, Any]:
    """`shadow serve --demo` on `db` with `seconds` of traffic (`demo_traffic_s`); once its
    fleet has drained, the last window closed as the evidence's last (`POST /v1/flush
    ?final=true`: the continuous runs drain in it, as a full replay does) and stored;
    then its summary table."""
    # environment settings, not a config file: with one, the demo's 10 s windows go
    env = {
        "SHADOW_DEMO_TRAFFIC_S": repr(float(seconds)),
        "SHADOW_WINDOWS__STEP_MODEL_RESTART": repr(CHECK_STEP_MODEL_RESTART),
    }
    server = ServerProcess(db, demo=True, env=env).start()
    try:
        time.sleep(seconds)
        with httpx.Client(base_url=server.url, timeout=120.0) as client:
            last = _drained(client, fleet, drain_timeout_s)
            client.post("/v1/flush", params={"final": "true"}).raise_for_status()
            deadline = time.monotonic() + drain_timeout_s
            while True:
                response = client.get(f"/v1/fleets/{fleet}/summary")
                response.raise_for_status()
                summary = response.json()
                if summary.get("t_end") is not None and summary["t_end"] >= last:
                    return summary
                if time.monotonic() > deadline:
                    raise DemoCheckError(f"the demo's last window (to {last}) was not stored")
                time.sleep(0.5)
                client.post("/v1/flush").raise_for_status()  # stores finished windows
    finally:
        server.stop()


def _drained(client: httpx.Client, fleet: str, timeout_s: float) -> float:
    """Wait until the fleet holds nothing (no request running or waiting, twice a second
    apart); the time of its last event."""
    deadline, previous = time.monotonic() + timeout_s, False
    while time.monotonic() < deadline:
        client.post("/v1/flush").raise_for_status()  # apply what the reorder buffer holds
        snap = client.get(f"/v1/fleets/{fleet}/snapshot").json()
        empty = not snap["pool"] and not any(w["active"] for w in snap["workers"])
        if empty and previous:
            return float(snap["ts"])
        previous = empty
        time.sleep(1.0)
    raise DemoCheckError(f"the demo fleet did not drain within {timeout_s:g} s")


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
            "SELECT t_end, a_ms_per_token AS a, b_ms AS b, run_start FROM windows "
            "WHERE fleet = :fleet AND t_start >= :t0 AND t_start < :t1 ORDER BY window_index",
            {"fleet": fleet, "t0": t0, "t1": t1},
        )
        fits = store.query(
            "SELECT a_ms_per_token AS a, b_ms AS b FROM step_model_fits WHERE fleet = :fleet "
            "AND NOT fallback AND fitted_at >= :t0 ORDER BY fitted_at",
            {"fleet": fleet, "t0": t0},
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
    return Recording(
        workload, int(shape["g"]), int(shape["b"]), steps, len(rows) - len(done),
        tuple(StepModel(f["a"], f["b"]) for f in fits),
        tuple(sorted({int(w["run_start"]) for w in windows if w["run_start"] is not None})),
    )  # fmt: skip


def truth(recording: Recording, policy: str, model: StepModel) -> dict[str, float]:
    """`shadow replay`'s summary of the recorded arrivals under `policy` and `model`."""
    r = recording
    return replay_policy(
        r.workload, policy, workers=r.workers, batch=r.batch, step_model=model,
        decide_on_arrival=True,
    ).metrics  # fmt: skip


def as_the_windows_ran(recording: Recording, policy: str) -> float:
    """The mean imbalance over the steps of the recorded arrivals replayed as the
    continuous runs replayed them: fed window by window, each window under the step model
    its runs used, drained in the last window (the evidence's last)."""
    r = recording
    arrivals = r.workload
    ready_ms = arrivals.ready_s * 1000.0
    fleet = FleetReplay(
        make_policy(policy), workers=r.workers, batch=r.batch, step_model=r.windows[0][1],
        decide_on_arrival=True,
    )  # fmt: skip
    added, loads = 0, []
    for i, (end_s, model) in enumerate(r.windows):
        fleet.model = model
        end_ms = math.inf if i == len(r.windows) - 1 else end_s * 1000.0
        known = int(np.searchsorted(ready_ms, end_ms, side="left"))
        if known > added:
            fleet.add_requests(
                ready_ms[added:known], arrivals.prompt_tokens[added:known],
                arrivals.output_tokens[added:known], arrivals.prompt_keys[added:known],
            )  # fmt: skip
            added = known
        fleet.advance(end_ms)
        block = fleet.take_steps()
        loads.append(block.worker_load)
    load = np.concatenate(loads)
    return float((load.max(axis=1) - load.min(axis=1)).mean())


def check(db: Path, seconds: float = 180.0, fleet: str = "default") -> DemoCheck:
    """Run the demo, read its table, and replay its recorded arrivals for the truth."""
    db.unlink(missing_ok=True)
    summary = run_demo(db, seconds, fleet)
    return compare(db, summary, seconds, fleet)


def compare(db: Path, summary: dict[str, Any], seconds: float, fleet: str = "default") -> DemoCheck:
    """The demo's table against the offline replays of what it recorded."""
    if not summary.get("windows"):
        raise DemoCheckError(f"the demo evaluated no window in {seconds:g} s")
    recording = recorded(db, summary, fleet)
    incumbent = summary["incumbent"]
    used = {model for _, model in recording.windows}
    if len(used) != 1 or len(recording.run_starts) != 1:
        raise DemoCheckError(
            f"the demo's continuous runs started {len(recording.run_starts)} times under "
            f"{len(used)} step models (refits: fixed part "
            f"{_span(m.b_ms for m in recording.fits)} ms): no single replay is their truth"
        )
    fits = list(recording.fits) or [recording.windows[-1][1]]
    median = StepModel(
        float(np.median([m.a_ms_per_token for m in fits])),
        float(np.median([m.b_ms for m in fits])),
    )
    # the truth: the one model the runs stepped under; the service's first, median and
    # last refits say how far the truth would move under another of them
    models = (recording.windows[-1][1], fits[0], median, fits[-1])
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


def _span(values) -> str:
    """`low-high` of some numbers, for a message."""
    values = list(values)
    return f"{min(values):.2f}-{max(values):.2f}" if values else "none"


def export_trace(recording: Recording, path: Path) -> None:
    """The recorded arrivals as a trace `shadow replay` reads (jsonl or csv by extension)."""
    write_trace(recording.workload, path)


def table(result: DemoCheck) -> str:
    """Plain text, one ratio per line (a CI log reads it)."""

    def fmt(value: float | None) -> str:
        return "-" if value is None or math.isnan(value) else f"{value:.4f}"

    r, m = result.recording, result.step_model
    fixed = [model.b_ms for model in r.fits] or [m.b_ms]
    lines = [
        f"demo after {result.seconds:g} s: {len(r.windows)} windows, {len(r.workload)} "
        f"recorded requests ({r.unfinished} unfinished, left out), G = {r.workers}, "
        f"B = {r.batch}, incumbent {result.incumbent}; truth: `shadow replay` under the runs' "
        f"step model {m.a_ms_per_token:.3g} ms/token x max L + {m.b_ms:.3f} ms "
        f"({len(r.fits)} refits, fixed part {min(fixed):.3f}-{max(fixed):.3f} ms)",
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
