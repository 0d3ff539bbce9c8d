"""SQLAlchemy models for replay results (the schema Alembic migrations create).

The models are the schema's documentation and the target for future autogenerate; the
tables themselves are created only by the explicit migrations in ``migrations/versions``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    Sequence,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from shadow.analysis.metrics import COUNT_METRICS
from shadow.analysis.metrics import METRICS as SUMMARY_METRICS

RUN_ID_SEQUENCE = Sequence("replay_runs_id_seq")
"""DuckDB has no SERIAL; run ids come from this sequence (``nextval`` in the INSERT)."""

FLOAT_METRICS: tuple[str, ...] = tuple(m for m in SUMMARY_METRICS if m not in COUNT_METRICS)
METRICS: tuple[str, ...] = FLOAT_METRICS + COUNT_METRICS
"""Every per-policy summary metric (`shadow.analysis.metrics.METRICS`, the floats first);
each is one column of ``replay_policy_summaries``."""

STEP_SERIES: tuple[str, ...] = (
    "start_ms",
    "duration_ms",
    "max_load",
    "min_load",
    "sum_load",
    "active",
)
"""Per-step series columns of ``replay_steps`` (the step index is the array position)."""


class Base(DeclarativeBase):
    """Declarative base; explicit constraint names keep future migrations diffable."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_N_name)s",
            "uq": "uq_%(table_name)s_%(column_0_N_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class ReplayRun(Base):
    """One ``shadow replay`` invocation: its inputs, so any result can be reproduced."""

    __tablename__ = "replay_runs"

    id: Mapped[int] = mapped_column(
        BigInteger,
        RUN_ID_SEQUENCE,
        primary_key=True,
        server_default=text("nextval('replay_runs_id_seq')"),
    )
    created_at: Mapped[datetime] = mapped_column(DateTime, nullable=False)  # naive UTC
    trace: Mapped[str] = mapped_column(Text, nullable=False)
    workers: Mapped[int] = mapped_column(Integer, nullable=False)
    batch: Mapped[int] = mapped_column(Integer, nullable=False)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False)
    a_ms_per_token: Mapped[float] = mapped_column(Double, nullable=False)
    b_ms: Mapped[float] = mapped_column(Double, nullable=False)
    seed: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    config_json: Mapped[str] = mapped_column(Text, nullable=False)
    tool_version: Mapped[str] = mapped_column(String, nullable=False)


class ReplayPolicySummary(Base):
    """Headline metrics of one policy in one run (a few rows per run, written via ORM/Core).

    Metric columns are nullable so a replay that could not compute a metric (e.g. no
    completed request, so no TPOT) still records the rest.
    """

    __tablename__ = "replay_policy_summaries"

    run_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("replay_runs.id"), primary_key=True)
    policy: Mapped[str] = mapped_column(String, primary_key=True)
    imbalance_mean: Mapped[float | None] = mapped_column(Double)
    gap_mean: Mapped[float | None] = mapped_column(Double)
    idle_frac: Mapped[float | None] = mapped_column(Double)
    throughput_tok_s: Mapped[float | None] = mapped_column(Double)
    tpot_p50_ms: Mapped[float | None] = mapped_column(Double)
    tpot_p95_ms: Mapped[float | None] = mapped_column(Double)
    tpot_p99_ms: Mapped[float | None] = mapped_column(Double)
    pool_wait_p95_ms: Mapped[float | None] = mapped_column(Double)
    sched_ms_p50: Mapped[float | None] = mapped_column(Double)
    sched_ms_p99: Mapped[float | None] = mapped_column(Double)
    steps: Mapped[int | None] = mapped_column(BigInteger)
    makespan_s: Mapped[float | None] = mapped_column(Double)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)


# The two bulk tables deliberately carry no PRIMARY KEY / FOREIGN KEY / index in the
# database: in DuckDB each of those builds an ART index checked per row, which made a
# 1.44 M-row append ~4.5x slower and the file ~3x larger (measured). Rows are appended
# clustered by (run_id, policy, step), so DuckDB's per-row-group min/max zonemaps already
# prune scans by run and policy; uniqueness holds by construction (step = array position,
# one insert per run and policy inside one transaction). The ORM still needs an identity,
# so the key is declared at mapper level only.


class ReplayStep(Base):
    """Per-step barrier series of one policy in one run (bulk, appended via Arrow)."""

    __tablename__ = "replay_steps"

    run_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    policy: Mapped[str] = mapped_column(String, nullable=False)
    step: Mapped[int] = mapped_column(Integer, nullable=False)
    start_ms: Mapped[float] = mapped_column(Double, nullable=False)
    duration_ms: Mapped[float] = mapped_column(Double, nullable=False)
    max_load: Mapped[int] = mapped_column(BigInteger, nullable=False)
    min_load: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sum_load: Mapped[int] = mapped_column(BigInteger, nullable=False)
    active: Mapped[int] = mapped_column(Integer, nullable=False)

    __mapper_args__ = {"primary_key": [run_id, policy, step]}  # noqa: RUF012


class ReplayWorkerLoad(Base):
    """Per-step, per-worker load of one policy in one run (bulk, appended via Arrow)."""

    __tablename__ = "replay_worker_loads"

    run_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    policy: Mapped[str] = mapped_column(String, nullable=False)
    step: Mapped[int] = mapped_column(Integer, nullable=False)
    worker: Mapped[int] = mapped_column(Integer, nullable=False)
    load: Mapped[int] = mapped_column(BigInteger, nullable=False)
    active: Mapped[int] = mapped_column(Integer, nullable=False)

    __mapper_args__ = {"primary_key": [run_id, policy, step, worker]}  # noqa: RUF012


# -- the shadow service (migration 0002) --------------------------------------------


class EventRow(Base):
    """Every acknowledged lifecycle event (`worker`, `ready`, `dispatch`, `finish`)."""

    __tablename__ = "events"

    ingest_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    source: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int | None] = mapped_column(BigInteger)
    type: Mapped[str] = mapped_column(Text, nullable=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    request_id: Mapped[str | None] = mapped_column(Text)
    worker: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(BigInteger)
    prompt_hash: Mapped[str | None] = mapped_column(Text)
    max_tokens: Mapped[int | None] = mapped_column(BigInteger)
    policy: Mapped[str | None] = mapped_column(Text)
    router_view: Mapped[str | None] = mapped_column(Text)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    reason: Mapped[str | None] = mapped_column(Text)
    capacity: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str | None] = mapped_column(Text)
    raw_reason: Mapped[str | None] = mapped_column(Text)
    estimated: Mapped[bool | None] = mapped_column(Boolean)
    from_engine: Mapped[bool | None] = mapped_column(Boolean)
    #: a finish that met an earlier finish of its request: that one's ingest id (0009)
    joined_to: Mapped[int | None] = mapped_column(BigInteger)

    __mapper_args__ = {"primary_key": [ingest_id]}  # noqa: RUF012


class ProgressLatest(Base):
    """The latest cumulative progress per request (the high-rate stream, compacted)."""

    __tablename__ = "progress_latest"

    fleet: Mapped[str] = mapped_column(Text, primary_key=True)
    request_id: Mapped[str] = mapped_column(Text, primary_key=True)
    generated: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    ingest_id: Mapped[int] = mapped_column(BigInteger, nullable=False)


class ProgressLogRow(Base):
    """Progress as it arrives, folded into `progress_latest` every few seconds."""

    __tablename__ = "progress_log"

    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    request_id: Mapped[str] = mapped_column(Text, nullable=False)
    generated: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    ingest_id: Mapped[int] = mapped_column(BigInteger, nullable=False)

    __mapper_args__ = {"primary_key": [ingest_id]}  # noqa: RUF012


class EngineStepRow(Base):
    """One decode step of one worker (`engine_step`), the per-step per-worker aggregate."""

    __tablename__ = "engine_steps"

    ingest_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    source: Mapped[str] = mapped_column(Text, nullable=False)
    seq: Mapped[int | None] = mapped_column(BigInteger)
    worker: Mapped[str] = mapped_column(Text, nullable=False)
    step: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    duration_ms: Mapped[float] = mapped_column(Double, nullable=False)
    running: Mapped[int] = mapped_column(Integer, nullable=False)
    kv_tokens: Mapped[int | None] = mapped_column(BigInteger)
    waiting: Mapped[int | None] = mapped_column(Integer)
    tokens: Mapped[int | None] = mapped_column(BigInteger)

    __mapper_args__ = {"primary_key": [ingest_id]}  # noqa: RUF012


class ViolationRow(Base):
    __tablename__ = "violations"

    ingest_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    severity: Mapped[str] = mapped_column(Text, nullable=False)
    worker: Mapped[str | None] = mapped_column(Text)
    request_id: Mapped[str | None] = mapped_column(Text)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    detail: Mapped[str] = mapped_column(Text, nullable=False)

    __mapper_args__ = {"primary_key": [ingest_id, kind]}  # noqa: RUF012


class DecisionRow(Base):
    """One shadow policy's view of one incumbent dispatch (the decision audit)."""

    __tablename__ = "decisions"

    ingest_id: Mapped[int] = mapped_column(BigInteger, nullable=False)
    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    request_id: Mapped[str] = mapped_column(Text, nullable=False)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, nullable=False)
    incumbent_worker: Mapped[str] = mapped_column(Text, nullable=False)
    incumbent_policy: Mapped[str] = mapped_column(Text, nullable=False)
    policy: Mapped[str] = mapped_column(Text, nullable=False)
    choice: Mapped[str | None] = mapped_column(Text)
    agrees: Mapped[bool] = mapped_column(Boolean, nullable=False)
    f_br0_incumbent: Mapped[float] = mapped_column(Double, nullable=False)
    f_br0_choice: Mapped[float | None] = mapped_column(Double)
    f_br0_best: Mapped[float] = mapped_column(Double, nullable=False)
    f_brh_incumbent: Mapped[float] = mapped_column(Double, nullable=False)
    f_brh_choice: Mapped[float | None] = mapped_column(Double)
    f_brh_best: Mapped[float] = mapped_column(Double, nullable=False)
    mirror_jsq_agrees: Mapped[bool] = mapped_column(Boolean, nullable=False)
    router_view_agrees: Mapped[bool | None] = mapped_column(Boolean)
    #: the dispatch's frozen snapshot as JSON, on one of its rows (NULL on the others:
    #: 0014); rows stored since 0015 hold it in `snapshot_z` instead
    snapshot: Mapped[str | None] = mapped_column(Text, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Double)
    #: the snapshot's JSON bytes, zlib-compressed when large (0015:
    #: `stream.stored_snapshot`), on one of its dispatch's rows
    snapshot_z: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)

    __mapper_args__ = {"primary_key": [ingest_id, policy]}  # noqa: RUF012


class WindowRow(Base):
    __tablename__ = "windows"

    fleet: Mapped[str] = mapped_column(Text, primary_key=True)
    window_index: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    t_start: Mapped[float] = mapped_column(Double, nullable=False)
    t_end: Mapped[float] = mapped_column(Double, nullable=False)
    requests: Mapped[int] = mapped_column(BigInteger, nullable=False)
    imputed: Mapped[int] = mapped_column(BigInteger, nullable=False)
    a_ms_per_token: Mapped[float] = mapped_column(Double, nullable=False)
    b_ms: Mapped[float] = mapped_column(Double, nullable=False)
    step_model_fitted: Mapped[bool] = mapped_column(Boolean, nullable=False)
    fidelity_imbalance: Mapped[float | None] = mapped_column(Double)
    fidelity_step: Mapped[float | None] = mapped_column(Double)
    #: the window its continuous runs started from (None: replayed on its own)
    run_start: Mapped[int | None] = mapped_column(BigInteger)
    #: the requests decoding in that start state (0: the runs started from an empty fleet)
    run_start_held: Mapped[int | None] = mapped_column(BigInteger)


class WindowMetricRow(Base):
    __tablename__ = "window_metrics"

    fleet: Mapped[str] = mapped_column(Text, primary_key=True)
    window_index: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy: Mapped[str] = mapped_column(Text, primary_key=True)
    imbalance_mean: Mapped[float | None] = mapped_column(Double)
    gap_mean: Mapped[float | None] = mapped_column(Double)
    step_ms_mean: Mapped[float | None] = mapped_column(Double)
    throughput_tok_s: Mapped[float | None] = mapped_column(Double)
    tpot_p95_ms: Mapped[float | None] = mapped_column(Double)
    pool_wait_p95_ms: Mapped[float | None] = mapped_column(Double)
    steps: Mapped[int | None] = mapped_column(BigInteger)
    #: the seconds the throughput is over (a continuous run's busy time in the window)
    busy_s: Mapped[float | None] = mapped_column(Double)
    #: per-request TPOTs (ms, float32 little-endian) the gate pools for the TPOT P95
    tpot_ms: Mapped[bytes | None] = mapped_column(LargeBinary)


class WindowTrajectoryRow(Base):
    """A window's bucketed per-worker load path for one policy (see ``shadow.stream.trajectory``):
    float32 little-endian arrays, `loads` row-major (points x workers)."""

    __tablename__ = "window_trajectories"

    fleet: Mapped[str] = mapped_column(Text, primary_key=True)
    window_index: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    policy: Mapped[str] = mapped_column(Text, primary_key=True)
    points: Mapped[int] = mapped_column(Integer, nullable=False)
    workers: Mapped[int] = mapped_column(Integer, nullable=False)
    t_ms: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    loads: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    imbalance: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    gap: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    step_ms: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)


class StepModelFitRow(Base):
    __tablename__ = "step_model_fits"

    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    fitted_at: Mapped[float] = mapped_column(Double, nullable=False)
    a_ms_per_token: Mapped[float] = mapped_column(Double, nullable=False)
    b_ms: Mapped[float] = mapped_column(Double, nullable=False)
    r2: Mapped[float | None] = mapped_column(Double)
    n: Mapped[int] = mapped_column(BigInteger, nullable=False)
    t_start: Mapped[float | None] = mapped_column(Double)
    t_end: Mapped[float | None] = mapped_column(Double)
    fallback: Mapped[bool] = mapped_column(Boolean, nullable=False)
    reason: Mapped[str] = mapped_column(Text, nullable=False)

    __mapper_args__ = {"primary_key": [fleet, fitted_at]}  # noqa: RUF012


class IngestState(Base):
    """Checkpoints of the ingest path (`next_ingest_id`, `applied_through`)."""

    __tablename__ = "ingest_state"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, nullable=False)


class EngineSampleRow(Base):
    """One scrape of one engine's `/metrics`, beside what the mirror held at that time."""

    __tablename__ = "engine_samples"

    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    worker: Mapped[str] = mapped_column(Text, nullable=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    running: Mapped[float] = mapped_column(Double, nullable=False)
    waiting: Mapped[float] = mapped_column(Double, nullable=False)
    kv_usage: Mapped[float | None] = mapped_column(Double)
    generation_tokens: Mapped[float | None] = mapped_column(Double)
    mirror_active: Mapped[int] = mapped_column(BigInteger, nullable=False)

    __mapper_args__ = {"primary_key": [fleet, worker, ts]}  # noqa: RUF012


# -- modes, audit log and gate runs (migration 0004) ------------------------------------

GATE_RUN_ID_SEQUENCE = Sequence("gate_runs_id_seq")
"""Gate run ids come from this sequence (DuckDB has no SERIAL)."""


class FleetModeRow(Base):
    """The persisted mode state machine of one fleet (see ``shadow.modes.machine``)."""

    __tablename__ = "fleet_modes"

    fleet: Mapped[str] = mapped_column(Text, primary_key=True)
    mode: Mapped[str] = mapped_column(Text, nullable=False)
    policy: Mapped[str | None] = mapped_column(Text)
    since: Mapped[float] = mapped_column(Double, nullable=False)
    trips_json: Mapped[str] = mapped_column(Text, nullable=False)
    recent_json: Mapped[str | None] = mapped_column(Text)
    healthy_windows: Mapped[int] = mapped_column(BigInteger, nullable=False)
    frozen: Mapped[bool] = mapped_column(Boolean, nullable=False)
    cooldown_until: Mapped[float | None] = mapped_column(Double)
    last_gate_verdict: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[float] = mapped_column(Double, nullable=False)


class AuditLogRow(Base):
    """One append-only, hash-chained audit entry (see ``shadow.modes.auditlog``)."""

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    fleet: Mapped[str | None] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    actor: Mapped[str] = mapped_column(Text, nullable=False)
    reason: Mapped[str | None] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text, nullable=False)
    prev_hash: Mapped[str] = mapped_column(Text, nullable=False)
    hash: Mapped[str] = mapped_column(Text, nullable=False)


class GateRunRow(Base):
    """One promotion-gate verdict for a candidate against a baseline on one fleet."""

    __tablename__ = "gate_runs"

    id: Mapped[int] = mapped_column(
        BigInteger,
        GATE_RUN_ID_SEQUENCE,
        primary_key=True,
        server_default=text("nextval('gate_runs_id_seq')"),
    )
    ts: Mapped[float] = mapped_column(Double, nullable=False)
    fleet: Mapped[str] = mapped_column(Text, nullable=False)
    candidate: Mapped[str] = mapped_column(Text, nullable=False)
    baseline: Mapped[str] = mapped_column(Text, nullable=False)
    verdict: Mapped[str] = mapped_column(Text, nullable=False)
    exit_code: Mapped[int] = mapped_column(Integer, nullable=False)
    report: Mapped[str] = mapped_column(Text, nullable=False)


# -- the Parquet archive (migration 0010) ------------------------------------------------


class ArchiveFileRow(Base):
    """One Parquet file that retention moved out of a live table (`shadow.storage.archive`):
    listed in the transaction that deleted its rows, so readers never count a row twice."""

    __tablename__ = "archive_files"

    path: Mapped[str] = mapped_column(Text, primary_key=True)
    table_name: Mapped[str] = mapped_column(Text, nullable=False)
    day: Mapped[str] = mapped_column(Text, nullable=False)
    rows: Mapped[int] = mapped_column(BigInteger, nullable=False)
    bytes: Mapped[int] = mapped_column(BigInteger, nullable=False)
    ts_min: Mapped[float] = mapped_column(Double, nullable=False)
    ts_max: Mapped[float] = mapped_column(Double, nullable=False)
    archived_at: Mapped[float] = mapped_column(Double, nullable=False)
