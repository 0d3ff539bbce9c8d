"""The HTTP face of the service: thin handlers that translate between HTTP and the core.

`POST /v1/events` takes NDJSON or a JSON array; everything else reads. OpenAPI at `/docs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures.process import BrokenProcessPool
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from shadow import __version__
from shadow.connectors.poller import MetricsPoller, Target
from shadow.events import parse_body
from shadow.gate.record import last_verdict
from shadow.modes import auditlog
from shadow.modes.machine import (
    FleetMode,
    Mode,
    ModeError,
    freeze,
    observe_window,
    reset,
    resume,
    set_mode,
)
from shadow.modes.store import ModeStore
from shadow.policies.fscore import gap, imbalance
from shadow.service.http import auth, explore, sweeps
from shadow.service.http.explore import PAGE_MAX, SortKey, invalid
from shadow.service.http.explore import clean as _clean
from shadow.service.http.explore import rows_json as _rows
from shadow.service.http.routing import LiveRouter, RouteRequest
from shadow.service.ingest.pipeline import FleetState
from shadow.service.metrics import ServiceCollector, route_latency
from shadow.service.runtime import Runtime
from shadow.service.settings import ServiceSettings
from shadow.service.store import StorageError
from shadow.stream.windows import WINDOW_METRICS
from shadow.ui import mount_ui
from shadow.world.demo import DemoPlan, DemoProcess, abandon_previous_world

WINDOWS_PAGE_MAX = 5000  # a day of 30 s windows is 2,880


def _time_range(
    where: list[str], params: dict[str, Any], since: float | None, until: float | None
) -> None:
    """Add `since <= ts < until` (either end optional) as bound parameters."""
    if since is not None:
        where.append("ts >= :since")
        params["since"] = since
    if until is not None:
        where.append("ts < :until")
        params["until"] = until


def _json_floats(column: Any) -> list[float | None]:
    """A fetched numeric column as JSON values: NULL and non-finite as None."""
    array = np.ma.filled(np.ma.masked_invalid(np.ma.asarray(column, dtype=np.float64)), np.nan)
    return [None if math.isnan(v) else v for v in array.tolist()]


def _page(
    runtime: Runtime,
    table: str,
    where: list[str],
    params: dict[str, Any],
    order: str,
    columns: str = "*",
) -> dict[str, Any]:
    """One page of a table: the filters, columns and order are fixed SQL with bound
    parameters (never user text), the total counts every match."""
    clause = " AND ".join(where)
    store = runtime.store
    total = store.query(f"SELECT count(*) AS n FROM {table} WHERE {clause}", params)[0]["n"]
    rows = store.query(
        f"SELECT {columns} FROM {table} WHERE {clause} ORDER BY {order} "
        "LIMIT :limit OFFSET :offset",
        params,
    )
    return {"total": int(total), "limit": params["limit"], "offset": params["offset"],
            "items": _rows(rows)}  # fmt: skip


class RouteItem(BaseModel):
    request_id: str
    prompt_tokens: int = Field(ge=0)
    prompt_hash: str | None = None


class RouteBody(BaseModel):
    fleet: str = "default"
    requests: list[RouteItem] = Field(min_length=1, max_length=4096)


class ModeAction(BaseModel):
    action: Literal["set", "freeze", "resume", "reset"]
    reason: str = Field(min_length=1)
    mode: Literal["shadow", "live", "fallback", "latched"] | None = None
    policy: str | None = None
    actor: str = "api"


def _mode_json(mode: FleetMode) -> dict[str, Any]:
    return {
        "fleet": mode.fleet,
        "mode": mode.mode.value,
        "policy": mode.policy,
        "since": mode.since,
        "trips": list(mode.trips),
        "healthy_windows": mode.healthy_windows,
        "frozen": mode.frozen,
        "cooldown_until": mode.cooldown_until,
        "last_gate_verdict": mode.last_gate_verdict,
    }


def _judge_window(runtime: Runtime, modes: ModeStore, fleet_state: FleetState, result) -> None:
    """Feed a replayed window to the fleet's mode: trips on K of M bad windows in `live`,
    recovery after R healthy ones in `fallback` (judged with the policy in shadow)."""
    mode = modes.get(fleet_state.fleet)
    if mode.mode not in (Mode.LIVE, Mode.FALLBACK) or not mode.policy:
        return
    incumbent = result.metrics.get(fleet_state.incumbent, {})
    judged = result.metrics.get("observed" if mode.mode == Mode.LIVE else mode.policy, {})
    worse = False
    if incumbent.get("imbalance_mean") and judged.get("imbalance_mean") is not None:
        worse = judged["imbalance_mean"] > incumbent["imbalance_mean"] * 1.05
    latency = runtime.store.query(
        "SELECT quantile_cont(latency_ms, 0.99) AS p99 FROM decisions WHERE fleet = :fleet "
        "AND policy = :policy AND ts >= :t0 AND ts < :t1",
        {"fleet": fleet_state.fleet, "policy": mode.policy, "t0": result.t_start,
         "t1": result.t_end},
    )[0]["p99"]  # fmt: skip
    over = latency is not None and latency > runtime.settings.route_budget_ms
    modes.apply(
        fleet_state.fleet, observe_window, actor="windows", requests=result.requests,
        latency_over_budget=over, imbalance_worse=worse, cfg=runtime.settings.mode_config(),
    )  # fmt: skip


def _service_url(settings: ServiceSettings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return f"http://{host}:{settings.port}"


def create_app(settings: ServiceSettings) -> FastAPI:
    state: dict[str, Any] = {"last_submit": 0.0}
    # One batch parsed and applied at a time. Both are pure Python, so parallel batches
    # only fight over the GIL, and mostly with the commit thread, whose DuckDB calls take
    # the GIL back many times a statement: with a single contender the commits keep up
    # (4 clients at 2,000-event batches: 37,500-38,700 events/s against 30,000-36,500).
    ingest_turn = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await run_in_threadpool(Runtime, settings)
        state["runtime"] = runtime
        modes = ModeStore(runtime.store.engine)
        state["modes"] = modes
        state["router"] = LiveRouter(
            runtime.pipeline, modes, budget_ms=settings.route_budget_ms, stale=_fleet_stale,
            mode_config=settings.mode_config(),
        )  # fmt: skip
        runtime.pipeline.on_window = lambda fleet_state, result: _judge_window(
            runtime, modes, fleet_state, result
        )
        app.state.runtime = runtime
        app.state.router = state["router"]
        registry = CollectorRegistry()
        registry.register(
            ServiceCollector(
                lambda: state["runtime"],
                lambda: state["modes"],
                lambda: state["poller"].status() if state.get("poller") else {},
                lambda: state["auth_denied"],
            )
        )
        state["registry"] = registry
        state["router"].latency = route_latency(registry)
        flusher = asyncio.create_task(_idle_flush())
        demo = None
        poller = None
        try:
            targets = [Target(e.worker, e.url) for e in settings.engines]
            if settings.demo:
                await run_in_threadpool(abandon_previous_world, runtime.pipeline, settings.fleet)
                demo = DemoProcess(
                    DemoPlan(
                        _service_url(settings), settings.demo_workers, settings.demo_batch,
                        settings.demo_time_scale, settings.demo_load, settings.fleet,
                    )
                )  # fmt: skip
                addresses = await run_in_threadpool(demo.start)
                state["demo"] = addresses
                targets += [Target(w, url) for w, url in addresses.workers.items()]
            if targets:
                poller = MetricsPoller(
                    targets,
                    interval_s=settings.poll_interval_s,
                    staleness_s=settings.staleness_s,
                    on_sample=lambda worker, ts, sample: runtime.pipeline.record_engine_sample(
                        settings.fleet, worker, ts, sample
                    ),
                )
                await poller.start()
                state["poller"] = poller
            yield
        finally:
            flusher.cancel()
            if poller is not None:
                await poller.stop()
            if demo is not None:
                await run_in_threadpool(demo.stop)
            await run_in_threadpool(runtime.close)

    def _fleet_stale(fleet: str) -> bool:
        poller: MetricsPoller | None = state.get("poller")
        if poller is None or fleet != settings.fleet:
            return False
        return any(status["stale"] for status in poller.status().values())

    async def _idle_flush() -> None:
        """Apply what the reorder window holds once the stream goes quiet."""
        while True:
            await asyncio.sleep(settings.idle_flush_s / 2)
            runtime: Runtime = state["runtime"]
            quiet = time.monotonic() - state["last_submit"] > settings.idle_flush_s
            if quiet and not runtime.pipeline.broken:
                await run_in_threadpool(_flush, runtime)

    def _flush(runtime: Runtime) -> None:
        runtime.pipeline.drain()
        with runtime.pipeline.lock:
            runtime.pipeline.collect_windows()

    app = FastAPI(
        title="balanceroute-shadow",
        version=__version__,
        description="Shadow-mode evaluation of BalanceRoute against the incumbent router.",
        lifespan=lifespan,
    )

    def runtime() -> Runtime:
        return state["runtime"]

    def _hit(bound: str) -> None:
        runtime().pipeline.bound_hits[bound] += 1

    tokens = settings.token_table()
    state["auth_denied"] = Counter({401: 0, 403: 0})

    app.add_middleware(auth.BearerAuth, tokens=tokens, denied=state["auth_denied"])

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        """FastAPI's 422, with page sizes past their bound counted."""
        if any(e.get("loc", [None])[-1] == "limit" for e in error.errors()):
            _hit("page_size")
        return await request_validation_exception_handler(request, error)

    def fleet_state(fleet: str) -> FleetState:
        found = runtime().pipeline.fleets.get(fleet)
        if found is None:
            raise HTTPException(404, f"unknown fleet {fleet!r}")
        return found

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        """Prometheus text exposition of every `shadow_` metric."""
        return Response(generate_latest(state["registry"]), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        pipeline = runtime().pipeline
        return {"ok": not pipeline.broken, "version": __version__}

    @app.post("/v1/events")
    async def post_events(request: Request) -> JSONResponse:
        """Ingest a batch (NDJSON or a JSON array). Valid events are stored even when
        others in the batch are rejected; each rejection names its position and field."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            _hit("body_bytes")
            raise HTTPException(
                413, f"body of {declared} bytes exceeds max_body_bytes ({settings.max_body_bytes})"
            )
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_body_bytes:
                _hit("body_bytes")
                raise HTTPException(
                    413, f"body exceeds max_body_bytes ({settings.max_body_bytes} bytes)"
                )
        state["last_submit"] = time.monotonic()
        pipeline = runtime().pipeline
        if pipeline.broken:
            raise HTTPException(
                503, f"ingest stopped after {pipeline.broken_reason}; restart the service"
            )

        def work() -> dict[str, Any] | None:
            with ingest_turn:
                events, errors = parse_body(bytes(body), request.headers.get("content-type"))
                if len(events) + len(errors) > settings.max_batch_events:
                    return None
                result, job = pipeline.enqueue(events, errors)
            if job is not None:
                job.wait()  # acknowledged once durable, while the next batch is applied
            return result.as_json()

        try:
            result = await run_in_threadpool(work)
        except StorageError as error:  # nothing of this batch is stored: say why
            raise HTTPException(507 if error.disk_full else 503, str(error)) from None
        except BrokenProcessPool:  # killed from outside (OOM): nothing of this batch stored
            raise HTTPException(
                503, f"ingest stopped: {pipeline.broken_reason}; restart the service"
            ) from None
        if result is None:
            _hit("batch_events")
            raise HTTPException(
                413, f"batch exceeds max_batch_events ({settings.max_batch_events}); split it"
            )
        status = (
            400 if result["rejected"] and not (result["accepted"] or result["duplicates"]) else 200
        )
        return JSONResponse(result, status_code=status)

    @app.post("/v1/flush")
    def flush() -> dict[str, Any]:
        """Apply everything the reorder window holds, close the window of an idle fleet,
        and store the window replays that finished."""
        _flush(runtime())
        runtime().pipeline.close_idle_windows()
        _flush(runtime())
        return {"windows_evaluated": runtime().pipeline.windows_evaluated}

    @app.get("/v1/fleets/{fleet}/requests/{request_id}")
    def request_history(fleet: str, request_id: str) -> dict[str, Any]:
        """Everything stored about one request: lifecycle events and latest progress."""
        store = runtime().store
        params = {"fleet": fleet, "request_id": request_id}
        events = store.query(
            "SELECT type, ts, worker, policy, prompt_tokens, output_tokens, reason, source, seq "
            "FROM events WHERE fleet = :fleet AND request_id = :request_id ORDER BY ts, ingest_id",
            params,
        )
        progress = store.latest_progress(fleet, request_id)
        if not events and not progress:
            raise HTTPException(404, f"no request {request_id!r} in fleet {fleet!r}")
        return {
            "request_id": request_id,
            "events": _rows(events),
            "progress": _rows(progress)[0] if progress else None,
        }

    @app.get("/v1/fleets")
    def fleets() -> list[dict[str, Any]]:
        out = []
        counts = {
            r["fleet"]: r
            for r in runtime().store.query(
                "SELECT fleet, count(*) AS violations, "
                "count(*) FILTER (WHERE severity = 'critical') AS critical "
                "FROM violations GROUP BY fleet"
            )
        }
        gates: dict[str, dict[str, Any]] = {}
        for row in runtime().store.query(
            "SELECT id, ts, fleet, candidate, baseline, verdict, report FROM gate_runs "
            "QUALIFY row_number() OVER (PARTITION BY fleet ORDER BY ts DESC, id DESC) = 1"
        ):
            report = json.loads(row.pop("report"))
            gates[row.pop("fleet")] = {**row, "dry_run": bool(report.get("dry_run")),
                                       "deciding_rule": report.get("deciding_rule")}  # fmt: skip
        windows = {
            r["fleet"]: r["n"]
            for r in runtime().store.query(
                "SELECT fleet, count(*) AS n FROM windows GROUP BY fleet"
            )
        }
        for name, fleet in runtime().pipeline.fleets.items():
            mirror = fleet.mirror
            out.append(
                {
                    "fleet": name,
                    "workers": len(mirror.order),
                    "active": int(sum(len(w.active) for w in mirror.order)),
                    "pool": len(mirror.pool),
                    "incumbent": fleet.incumbent,
                    "last_event_ts": mirror.now,
                    "violations": int(counts.get(name, {}).get("violations", 0)),
                    "critical_violations": int(counts.get(name, {}).get("critical", 0)),
                    "mode": _mode_json(state["modes"].get(name)),
                    "gate": gates.get(name),
                    "telemetry": _freshness(name),
                    "windows": int(windows.get(name, 0)),
                }
            )
        return out

    def _freshness(fleet: str) -> dict[str, Any]:
        poller: MetricsPoller | None = state.get("poller")
        if poller is None or fleet != settings.fleet:
            return {"polling": False, "engines": 0, "stale": 0, "max_age_s": None}
        status = poller.status()
        ages = [s["age_s"] for s in status.values() if _clean(s.get("age_s")) is not None]
        return {"polling": True, "engines": len(status),
                "stale": sum(1 for s in status.values() if s["stale"]),
                "max_age_s": max(ages) if ages else None}  # fmt: skip

    @app.get("/v1/fleets/{fleet}/snapshot")
    def snapshot(fleet: str) -> dict[str, Any]:
        """The mirror now: per worker capacity, state, active requests and KV load."""
        found = fleet_state(fleet)
        mirror = found.mirror
        with runtime().pipeline.lock:
            workers = [
                {
                    "worker": w.worker_id,
                    "capacity": w.capacity,
                    "state": w.state,
                    "active": len(w.active),
                    "kv_tokens": w.load,
                    "steps": w.steps,
                }
                for w in mirror.order
            ]
            loads = mirror.loads()
        return {
            "fleet": fleet,
            "ts": mirror.now,
            "workers": workers,
            "pool": len(mirror.pool),
            "imbalance": imbalance(loads) if len(loads) else None,
            "gap": gap(loads) if len(loads) else None,
            "engine_steps": found.engine_steps,
            "state_mismatches": found.state_mismatches,
            "late_events": found.late_events,
        }

    @app.get("/v1/fleets/{fleet}/decisions")
    def decisions(
        fleet: str,
        disagreements_only: bool = False,
        policy: str | None = None,
        worker: str | None = None,
        min_regret: float | None = None,
        since: float | None = None,
        until: float | None = None,
        sort: SortKey = "ts",
        order: Literal["asc", "desc"] = "desc",
        snapshot: bool = True,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """The decision audit (one row per dispatch and policy), filtered, sorted and
        paginated. `regret` is the BR-0 F-score the incumbent's choice left on the table."""
        where = ["fleet = :fleet"]
        params: dict[str, Any] = {"fleet": fleet, "limit": limit, "offset": offset}
        if disagreements_only:
            where.append("NOT agrees")
        if policy is not None:
            where.append("policy = :policy")
            params["policy"] = policy
        if worker is not None:
            where.append("(incumbent_worker = :worker OR choice = :worker)")
            params["worker"] = worker
        if min_regret is not None:
            where.append("f_br0_best - f_br0_incumbent >= :min_regret")
            params["min_regret"] = min_regret
        _time_range(where, params, since, until)
        column = "f_br0_best - f_br0_incumbent" if sort == "regret" else sort
        direction = "ASC" if order == "asc" else "DESC"
        page = _page(
            runtime(), "decisions", where, params,
            f"{column} {direction} NULLS LAST, ingest_id {direction}, policy",
            ("*" if snapshot else "* EXCLUDE (snapshot)")
            + ", f_br0_best - f_br0_incumbent AS regret",
        )  # fmt: skip
        if snapshot:
            for row in page["items"]:
                row["snapshot"] = json.loads(row["snapshot"])
        return page

    @app.get("/v1/fleets/{fleet}/violations")
    def violations(
        fleet: str,
        kind: str | None = None,
        severity: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Invariant violations, newest first, by kind, severity and time."""
        where = ["fleet = :fleet"]
        params: dict[str, Any] = {"fleet": fleet, "limit": limit, "offset": offset}
        _time_range(where, params, since, until)
        if kind is not None:
            where.append("kind = :kind")
            params["kind"] = kind
        if severity is not None:
            where.append("severity = :severity")
            params["severity"] = severity
        return _page(runtime(), "violations", where, params, "ts DESC, ingest_id DESC")

    @app.get("/v1/fleets/{fleet}/windows")
    def windows(
        fleet: str,
        policies: bool = True,
        metrics: str | None = None,
        limit: Annotated[int, Query(ge=1, le=WINDOWS_PAGE_MAX)] = 100,
        offset: Annotated[int, Query(ge=0)] = 0,
    ) -> dict[str, Any]:
        """Evaluated windows with per-policy (and observed) metrics, oldest first
        (`policies=false`: the window rows alone; `metrics=imbalance_mean,...`: only those
        metrics per policy, e.g. one chart over a day of windows)."""
        wanted = list(WINDOW_METRICS)
        if metrics:
            wanted = [m.strip() for m in metrics.split(",") if m.strip()]
            unknown = [m for m in wanted if m not in WINDOW_METRICS]
            if unknown:
                raise invalid(["query", "metrics"], f"unknown metric {unknown[0]!r}; "
                              f"choose from {', '.join(WINDOW_METRICS)}")  # fmt: skip
        store = runtime().store
        params = {"fleet": fleet, "limit": limit, "offset": offset}
        total = store.query("SELECT count(*) AS n FROM windows WHERE fleet = :fleet", params)
        rows = _rows(
            store.query(
                "SELECT * FROM windows WHERE fleet = :fleet ORDER BY window_index "
                "LIMIT :limit OFFSET :offset",
                params,
            )
        )
        if rows and policies:
            indices = [r["window_index"] for r in rows]
            columns = store.columns(
                f"SELECT window_index, policy, {', '.join(wanted)} FROM window_metrics "
                "WHERE fleet = $fleet AND window_index BETWEEN $low AND $high",
                {"fleet": fleet, "low": min(indices), "high": max(indices)},
            )
            values = {m: _json_floats(columns[m]) for m in wanted}
            by_window: dict[int, dict[str, Any]] = {}
            for i, (index, policy) in enumerate(
                zip(columns["window_index"].tolist(), columns["policy"].tolist(), strict=True)
            ):
                by_window.setdefault(index, {})[policy] = {m: values[m][i] for m in wanted}
            for row in rows:
                row["policies"] = by_window.get(row["window_index"], {})
        return {"total": int(total[0]["n"]), "limit": limit, "offset": offset, "items": rows}

    @app.get("/v1/fleets/{fleet}/telemetry")
    def telemetry(fleet: str) -> dict[str, Any]:
        """Engine scrapes: per worker the last sample, its age, staleness and failures,
        and what the mirror held when the sample was compared."""
        poller: MetricsPoller | None = state.get("poller")
        found = runtime().pipeline.fleets.get(fleet)
        compared = found.last_sample if found is not None else {}
        engines = {}
        for worker, status in (poller.status() if poller is not None else {}).items():
            sample = status.get("sample")
            engines[worker] = {
                "stale": status["stale"],
                "age_s": _clean(status.get("age_s")),
                "failures": status.get("failures", 0),
                "last_error": status.get("last_error"),
                "running": None if sample is None else sample["running"],
                "waiting": None if sample is None else sample["waiting"],
                "kv_usage": None if sample is None else sample["kv_usage"],
                "mirror_active_at_sample": compared.get(worker, (None, None, None))[2],
            }
        return {"fleet": fleet, "polling": poller is not None, "engines": engines}

    @app.get("/v1/demo")
    def demo_addresses() -> dict[str, Any]:
        """Where the demo world listens (router, tap, workers), if one runs."""
        addresses = state.get("demo")
        if addresses is None:
            raise HTTPException(404, "no demo world in this service")
        return {"router": addresses.router, "tap": addresses.tap, "workers": addresses.workers}

    @app.post("/v1/route")
    def route(body: RouteBody) -> dict[str, Any]:
        """Where to send ready requests: by the promoted policy in `live`, by Round-Robin in
        `fallback`/`latched`; in `shadow` the incumbent decides and the answer says so."""
        requests = [
            RouteRequest(r.request_id, r.prompt_tokens, r.prompt_hash) for r in body.requests
        ]
        return state["router"].route(body.fleet, requests).as_json()

    @app.get("/v1/fleets/{fleet}/mode")
    def get_mode(fleet: str) -> dict[str, Any]:
        return _mode_json(state["modes"].get(fleet))

    @app.post("/v1/fleets/{fleet}/mode")
    def change_mode(fleet: str, body: ModeAction) -> dict[str, Any]:
        """Operator actions (`set`, `freeze`, `resume`, `reset`), each with a reason;
        promoting after a FAIL verdict is refused (409)."""
        modes: ModeStore = state["modes"]
        action = {"set": set_mode, "freeze": freeze, "resume": resume, "reset": reset}[body.action]
        args: list[Any] = [body.reason]
        kwargs: dict[str, Any] = {}
        if body.action == "set":
            if body.mode is None:
                raise invalid(["body", "mode"], "action 'set' needs a mode")
            args = [body.mode, body.reason, body.policy]
            kwargs["last_gate_verdict"] = last_verdict(
                runtime().store.engine, fleet, body.policy or modes.get(fleet).policy
            )
        if body.action == "set":
            kwargs["cfg"] = (
                settings.mode_config() if "cfg" in set_mode.__code__.co_varnames else None
            )
            kwargs = {k: v for k, v in kwargs.items() if v is not None}
        try:
            modes.apply(fleet, action, *args, actor=body.actor, **kwargs)
        except ModeError as error:
            raise HTTPException(409, str(error)) from None
        except ValueError as error:
            raise invalid(["body"], str(error)) from None
        return _mode_json(modes.get(fleet))

    @app.get("/v1/audit/verify")
    def audit_verify() -> dict[str, Any]:
        """Recompute the audit log's hash chain."""
        result = auditlog.verify(runtime().store.engine)
        return {"ok": result.ok, "rows": result.rows, "first_bad_seq": result.first_bad_seq,
                "problem": result.problem}  # fmt: skip

    @app.get("/v1/fleets/{fleet}/stepmodel")
    def stepmodel(fleet: str) -> dict[str, Any]:
        """The latest step-model fit (`T = a * max L + b`), or the defaults if none yet."""
        rows = runtime().store.query(
            "SELECT * FROM step_model_fits WHERE fleet = :fleet ORDER BY fitted_at DESC LIMIT 1",
            {"fleet": fleet},
        )
        if rows:
            return _rows(rows)[0]
        return {
            "fleet": fleet,
            "a_ms_per_token": settings.step_model.a_ms_per_token,
            "b_ms": settings.step_model.b_ms,
            "fallback": True,
            "reason": "no fit yet: configured defaults",
            "n": 0,
        }

    explore.register(app, runtime, lambda fleet: fleet_state(fleet).incumbent)
    sweeps.register(app, runtime)
    mount_ui(app)
    return app
