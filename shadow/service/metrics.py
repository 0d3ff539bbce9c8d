"""Every `shadow_` metric the service exports on `/metrics`, declared in one place.

Names follow Prometheus conventions: base units (`_seconds`, `_tokens`), `_total` for
counters, labels few and bounded (fleet, policy, worker, kind): never a request id. Most
values are read from the live state when Prometheus scrapes, so the ingest path only
increments plain integers.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shadow.modes import Mode, ModeStore
from shadow.policies import POLICY_NAMES
from shadow.predict import SurvivalPredictor, calibrate
from shadow.service.footprint import resident_bytes
from shadow.service.runtime import Runtime
from shadow.storage.archive import TABLE_NAMES, archive_totals
from shadow.storage.queries import source
from shadow.stream.invariants import KINDS

WINDOW_GAUGES = (
    ("imbalance_mean", "shadow_window_imbalance_tokens",
     "Mean per-step imbalance (max - min KV load) in the latest evaluated window.", 1.0),
    ("gap_mean", "shadow_window_gap_tokens",
     "Mean per-step barrier gap I(k) in the latest evaluated window.", 1.0),
    ("throughput_tok_s", "shadow_window_throughput_tokens_per_second",
     "Output tokens per second in the latest evaluated window.", 1.0),
    ("tpot_p95_ms", "shadow_window_tpot_p95_seconds",
     "95th percentile time per output token in the latest evaluated window.", 0.001),
    ("step_ms_mean", "shadow_window_step_seconds",
     "Mean decode step time in the latest evaluated window.", 0.001),
    ("pool_wait_p95_ms", "shadow_window_pool_wait_p95_seconds",
     "95th percentile wait in the ready pool in the latest evaluated window.", 0.001),
)  # fmt: skip
CALIBRATION_EVERY_S = 60.0
CALIBRATION_REQUESTS = 2000


def route_latency(registry: CollectorRegistry) -> Histogram:
    histogram = Histogram(
        "shadow_route_decision_seconds",
        "Time the live policy took to answer POST /v1/route.",
        ["policy"],
        buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1),
        registry=registry,
    )
    for policy in POLICY_NAMES:  # every policy that can be promoted, from zero
        histogram.labels(policy=policy)
    return histogram


class ServiceCollector(Collector):
    """Reads the runtime at scrape time."""

    def __init__(
        self,
        runtime: Callable[[], Runtime],
        modes: Callable[[], ModeStore],
        telemetry: Callable[[], dict[str, dict[str, Any]]],
        auth_denied: Callable[[], dict[int, int]] = dict,
        ingest_disconnects: Callable[[], int] = int,
    ) -> None:
        self._runtime = runtime
        self._modes = modes
        self._telemetry = telemetry
        self._auth_denied = auth_denied
        self._ingest_disconnects = ingest_disconnects
        self._calibration: dict[str, tuple[float, float | None]] = {}

    def collect(self) -> Iterator[Any]:
        runtime = self._runtime()
        pipeline = runtime.pipeline
        events = CounterMetricFamily(
            "shadow_events", "Events received, by fleet, type and outcome.",
            labels=["fleet", "type", "outcome"],
        )  # fmt: skip
        for (fleet, kind, outcome), count in sorted(pipeline.counts.items()):
            events.add_metric([fleet, kind, outcome], count)
        yield events
        yield CounterMetricFamily(
            "shadow_events_rejected", "Events rejected as malformed or past a bound.",
            value=pipeline.rejected,
        )  # fmt: skip
        bounds = CounterMetricFamily(
            "shadow_bound_hits", "Times a configured bound was hit (answered with a clear "
            "error or, for the reorder buffer, an early apply).", labels=["bound"],
        )  # fmt: skip
        for bound, count in sorted(pipeline.bound_hits.items()):
            bounds.add_metric([bound], count)
        yield bounds
        yield CounterMetricFamily(
            "shadow_commit_transactions", "DuckDB transactions that made ingested batches "
            "durable (batches that queue up share one).", value=pipeline.committer.transactions,
        )  # fmt: skip
        yield CounterMetricFamily(
            "shadow_commit_batches", "Batches committed (acknowledged only after).",
            value=pipeline.committer.jobs,
        )  # fmt: skip
        yield CounterMetricFamily(
            "shadow_commit_seconds", "Time spent in those transactions (its rate near 1: "
            "commits limit the ingest rate).", value=pipeline.committer.busy_s,
        )  # fmt: skip
        yield from self._footprint(runtime)
        denied = CounterMetricFamily(
            "shadow_auth_denied", "Requests refused: 401 no or unknown token, 403 missing role.",
            labels=["status"],
        )  # fmt: skip
        for status, count in sorted(self._auth_denied().items()):
            denied.add_metric([str(status)], count)
        yield denied
        yield CounterMetricFamily(
            "shadow_ingest_disconnects", "Event batches whose sender disconnected before the "
            "body arrived whole (none of such a batch is stored).",
            value=self._ingest_disconnects(),
        )  # fmt: skip
        kv = GaugeMetricFamily(
            "shadow_mirror_kv_tokens", "KV tokens per worker in the mirror.",
            labels=["fleet", "worker"],
        )  # fmt: skip
        active = GaugeMetricFamily(
            "shadow_mirror_active_requests", "Active requests per worker in the mirror.",
            labels=["fleet", "worker"],
        )  # fmt: skip
        pool = GaugeMetricFamily(
            "shadow_pool_requests", "Requests waiting in the ready pool.", labels=["fleet"]
        )
        held = GaugeMetricFamily(
            "shadow_held_requests", "Requests the service holds state for, by what holds "
            "them: `live` (running or waiting in the mirror), `finished` (remembered "
            "`finished_ttl_s` for late events), `windows` (until every window they are in "
            "is evaluated). Its memory grows with these, not with time.",
            labels=["fleet", "holder"],
        )  # fmt: skip
        imbalance = GaugeMetricFamily(
            "shadow_observed_imbalance_tokens", "max - min KV load in the mirror now.",
            labels=["fleet"],
        )  # fmt: skip
        gap = GaugeMetricFamily(
            "shadow_observed_gap_tokens", "Barrier gap I(k) in the mirror now.", labels=["fleet"]
        )
        mismatch = CounterMetricFamily(
            "shadow_mirror_state_mismatches",
            "Engine steps where the mirror's load or active count differed from the engine's.",
            labels=["fleet"],
        )
        estimates = CounterMetricFamily(
            "shadow_token_estimates", "Requests finished with the tap's estimated count (a "
            "lower bound from chunks: no usage, no engine count yet).", labels=["fleet"],
        )  # fmt: skip
        corrections = CounterMetricFamily(
            "shadow_token_corrections", "Estimated counts an exact count (the engine's, via "
            "the stat-logger plugin) later replaced.", labels=["fleet"],
        )  # fmt: skip
        unjoined = CounterMetricFamily(
            "shadow_engine_finishes_unjoined", "Engine finishes (from_engine) for requests "
            "the shadow never saw (served without passing the tap): no violation.",
            labels=["fleet"],
        )  # fmt: skip
        reasons = CounterMetricFamily(
            "shadow_finish_reasons", "Finishes applied, by reason (`other`: a reason the "
            "shadow does not know, kept as sent; `recomputed`: back to the pool).",
            labels=["fleet", "reason"],
        )  # fmt: skip
        late = CounterMetricFamily(
            "shadow_late_events", "Events applied after later ones of their fleet (they came "
            "past the reorder window), by source (0 for each sender that is on time): a "
            "sender that lags. By type in the fleet's snapshot.",
            labels=["fleet", "source"],
        )  # fmt: skip
        with pipeline.lock:
            for name, state in sorted(pipeline.fleets.items()):
                by_source = Counter(dict.fromkeys(pipeline.sources(name), 0))
                for (source, _), count in state.late_by_source.items():
                    by_source[source] += count
                for source, count in sorted(by_source.items()):
                    late.add_metric([name, source], count)
                loads = [w.load for w in state.mirror.order]
                for worker in state.mirror.order:
                    kv.add_metric([name, worker.worker_id], worker.load)
                    active.add_metric([name, worker.worker_id], len(worker.active))
                pool.add_metric([name], len(state.mirror.pool))
                for holder, count in state.held_requests().items():
                    held.add_metric([name, holder], count)
                if loads:
                    imbalance.add_metric([name], max(loads) - min(loads))
                    gap.add_metric([name], len(loads) * max(loads) - sum(loads))
                mismatch.add_metric([name], state.state_mismatches)
                join = state.core.join
                estimates.add_metric([name], join.estimates)
                corrections.add_metric([name], join.corrections)
                unjoined.add_metric([name], join.unjoined)
                for reason, count in sorted(join.reasons.items()):
                    reasons.add_metric([name, reason], count)
        yield from (kv, active, pool, held, imbalance, gap, mismatch)
        yield from (estimates, corrections, unjoined, reasons, late)
        yield from self._windows(runtime)
        yield self._predictor(runtime)
        yield from self._audit(runtime)
        yield from self._archive(runtime)
        yield from self._modes_and_telemetry(runtime)

    def _windows(self, runtime: Runtime) -> Iterator[Any]:
        latest = runtime.store.query(
            "SELECT m.*, w.fidelity_imbalance, w.fidelity_step, w.a_ms_per_token, w.b_ms "
            "FROM window_metrics m JOIN windows w USING (fleet, window_index) WHERE "
            "(m.fleet, m.window_index) IN (SELECT fleet, max(window_index) FROM windows "
            "GROUP BY fleet) ORDER BY m.fleet, m.policy"
        )
        families = {
            column: GaugeMetricFamily(name, text, labels=["fleet", "policy"])
            for column, name, text, _ in WINDOW_GAUGES
        }
        ratio = GaugeMetricFamily(
            "shadow_window_ratio",
            "Latest window: a shadow policy's metric over the incumbent's replay.",
            labels=["fleet", "policy", "metric"],
        )
        fidelity = GaugeMetricFamily(
            "shadow_replay_fidelity_ratio",
            "Latest window: the incumbent's replay over what was observed.",
            labels=["fleet", "metric"],
        )
        step_a = GaugeMetricFamily(
            "shadow_step_model_seconds_per_token", "Step model a (per KV token of the max).",
            labels=["fleet"],
        )  # fmt: skip
        step_b = GaugeMetricFamily(
            "shadow_step_model_fixed_seconds", "Step model b (fixed part of a step).",
            labels=["fleet"],
        )  # fmt: skip
        by_fleet: dict[str, dict[str, dict[str, Any]]] = {}
        for row in latest:
            by_fleet.setdefault(row["fleet"], {})[row["policy"]] = row
        for fleet, policies in by_fleet.items():
            any_row = next(iter(policies.values()))
            step_a.add_metric([fleet], any_row["a_ms_per_token"] / 1000.0)
            step_b.add_metric([fleet], any_row["b_ms"] / 1000.0)
            for metric, key in (("imbalance", "fidelity_imbalance"), ("step", "fidelity_step")):
                if any_row[key] is not None:
                    fidelity.add_metric([fleet, metric], any_row[key])
            incumbent = policies.get(self._runtime().settings.windows.incumbent, {})
            for policy, row in policies.items():
                for column, _, _, scale in WINDOW_GAUGES:
                    if row[column] is not None:
                        families[column].add_metric([fleet, policy], row[column] * scale)
                for column, label in (("imbalance_mean", "imbalance"),
                                      ("throughput_tok_s", "throughput"),
                                      ("tpot_p95_ms", "tpot_p95")):  # fmt: skip
                    if row[column] is not None and incumbent.get(column):
                        ratio.add_metric([fleet, policy, label], row[column] / incumbent[column])
        yield from families.values()
        yield from (ratio, fidelity, step_a, step_b)

    def _footprint(self, runtime: Runtime) -> Iterator[GaugeMetricFamily]:
        resident = GaugeMetricFamily(
            "shadow_resident_memory_bytes", "Resident memory of the service's processes "
            "(Linux): the server and its worker processes, by role.", labels=["process"],
        )  # fmt: skip
        processes = [("server", os.getpid())] + [
            (role, pid) for role, pids in runtime.worker_pids().items() for pid in pids
        ]
        for role, pid in processes:
            size = resident_bytes(pid)
            if size is not None:
                resident.add_metric([role], size)
        yield resident
        duck = GaugeMetricFamily(
            "shadow_duckdb_memory_bytes", "DuckDB's memory by tag (duckdb_memory()); its "
            "buffer pool is bounded by duckdb_memory_mb.", labels=["tag"],
        )  # fmt: skip
        for tag, size in sorted(runtime.store.memory_bytes().items()):
            duck.add_metric([tag], size)
        yield duck

    def _predictor(self, runtime: Runtime) -> GaugeMetricFamily:
        """AUC of "finishes within H" for a Survival predictor on each fleet's recent
        completions; recomputed at most every minute (it replays thousands of ages)."""
        family = GaugeMetricFamily(
            "shadow_predictor_calibration_auc",
            "Survival predictor: AUC of finishing within the horizon, recent completions.",
            labels=["fleet"],
        )
        now = time.monotonic()
        horizon = runtime.settings.balance_route.horizon
        for fleet, state in list(runtime.pipeline.fleets.items()):
            cached = self._calibration.get(fleet)
            if cached is None or now - cached[0] > CALIBRATION_EVERY_S:
                lengths = np.array(
                    state.tracker.completed_lengths()[-CALIBRATION_REQUESTS:], dtype=np.int64
                )
                auc = None
                if lengths.size >= 10:
                    predictor = SurvivalPredictor()
                    predictor.observe_many(lengths)
                    auc = calibrate(predictor, lengths, horizon=horizon).auc
                self._calibration[fleet] = cached = (now, None if auc != auc else auc)
            if cached[1] is not None:
                family.add_metric([fleet], cached[1])
        return family

    def _audit(self, runtime: Runtime) -> Iterator[Any]:
        rows = runtime.store.query(
            "SELECT fleet, policy, avg(agrees::int) AS agree, avg(f_br0_best - f_br0_incumbent) "
            f"AS regret, count(*) AS n FROM {source(runtime.store, 'decisions')} "
            "GROUP BY fleet, policy ORDER BY 1, 2"
        )
        agreement = GaugeMetricFamily(
            "shadow_decision_agreement_ratio",
            "Share of dispatches where the shadow policy chose the incumbent's worker.",
            labels=["fleet", "policy"],
        )
        regret = GaugeMetricFamily(
            "shadow_decision_regret_tokens",
            "Mean gap change (BR-0 F-score) the best choice had over the incumbent's.",
            labels=["fleet", "policy"],
        )
        audited = CounterMetricFamily(
            "shadow_decisions", "Dispatches audited, per shadow policy.", labels=["fleet", "policy"]
        )
        for row in rows:
            agreement.add_metric([row["fleet"], row["policy"]], row["agree"] or 0.0)
            regret.add_metric([row["fleet"], row["policy"]], row["regret"] or 0.0)
            audited.add_metric([row["fleet"], row["policy"]], row["n"])
        yield from (agreement, regret, audited)
        yield GaugeMetricFamily(
            "shadow_audit_backlog_batches", "Batches handed to the audit worker whose "
            "decisions are not stored yet (growing: the audit cannot keep up).",
            value=runtime.pipeline.audit_backlog,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "shadow_audit_lag_seconds", "Seconds of fleet time (event time) the decision "
            "audit is behind the applied stream; 0 when it has caught up.",
            value=runtime.pipeline.audit_lag_s,
        )  # fmt: skip
        skipped = CounterMetricFamily(
            "shadow_audit_skipped", "Dispatches the decision audit skipped: with "
            "audit_sampling on, it audits an even sample while it falls behind.",
            labels=["fleet"],
        )  # fmt: skip
        stride = GaugeMetricFamily(
            "shadow_audit_sample_stride", "One dispatch audited in every this many (1: "
            "every dispatch).", labels=["fleet"],
        )  # fmt: skip
        with runtime.pipeline.lock:
            for name, state in sorted(runtime.pipeline.fleets.items()):
                skipped.add_metric([name], state.sampler.skipped)
                stride.add_metric([name], state.sampler.stride)
        yield from (skipped, stride)
        violations = CounterMetricFamily(
            "shadow_invariant_violations", "Invariant violations, each counted once.",
            labels=["fleet", "kind", "severity"],
        )  # fmt: skip
        counted = {
            (row["fleet"], row["kind"]): row["n"]
            for row in runtime.store.query(
                f"SELECT fleet, kind, count(*) AS n FROM {source(runtime.store, 'violations')} "
                "GROUP BY 1, 2"
            )
        }
        fleets = sorted(set(runtime.pipeline.fleets) | {f for f, _ in counted})
        for fleet in fleets:  # every kind, from zero: "none" is a value, not a gap
            for kind, (severity, _) in sorted(KINDS.items()):
                violations.add_metric([fleet, kind, severity], counted.get((fleet, kind), 0))
        yield violations

    def _archive(self, runtime: Runtime) -> Iterator[Any]:
        """What retention moved to Parquet (from the manifest: kept across restarts)."""
        rows = CounterMetricFamily(
            "shadow_archived_rows", "Rows moved from DuckDB to the Parquet archive.",
            labels=["table"],
        )  # fmt: skip
        size = CounterMetricFamily(
            "shadow_archived_bytes", "Bytes of Parquet files in the archive.", labels=["table"]
        )
        totals = archive_totals(runtime.store)
        for table in TABLE_NAMES:
            count, written = totals.get(table, (0, 0))
            rows.add_metric([table], count)
            size.add_metric([table], written)
        retention = runtime.retention
        yield from (rows, size)
        runs = CounterMetricFamily(
            "shadow_archive_runs", "Retention runs, by outcome.", labels=["outcome"]
        )
        runs.add_metric(["ok"], retention.runs)
        runs.add_metric(["failed"], retention.failures)
        yield runs

    def _modes_and_telemetry(self, runtime: Runtime) -> Iterator[Any]:
        mode = GaugeMetricFamily(
            "shadow_mode", "1 for the fleet's current mode.", labels=["fleet", "mode"]
        )
        trips = GaugeMetricFamily(
            "shadow_fallback_trips", "Fallback trips in the last 24 hours.", labels=["fleet"]
        )
        now = time.time()
        fleets = set(runtime.pipeline.fleets) | {m.fleet for m in self._modes().all()}
        for fleet in sorted(fleets):
            state = self._modes().get(fleet)
            for value in Mode:
                mode.add_metric([fleet, value.value], 1.0 if state.mode == value else 0.0)
            trips.add_metric([fleet], len(state.trips_within(now)))
        yield from (mode, trips)
        staleness = GaugeMetricFamily(
            "shadow_telemetry_age_seconds", "Age of the last good scrape of each engine.",
            labels=["fleet", "worker"],
        )  # fmt: skip
        stale = GaugeMetricFamily(
            "shadow_telemetry_stale", "1 when an engine's metrics are older than the limit.",
            labels=["fleet", "worker"],
        )  # fmt: skip
        fleet = runtime.settings.fleet
        for worker, status in sorted(self._telemetry().items()):
            if status.get("age_s") is not None:
                staleness.add_metric([fleet, worker], status["age_s"])
            stale.add_metric([fleet, worker], 1.0 if status["stale"] else 0.0)
        yield from (staleness, stale)
