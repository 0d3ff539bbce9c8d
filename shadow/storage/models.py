"""SQLAlchemy models for replay results (the schema Alembic migrations create).

The models are the schema's documentation and the target for future autogenerate; the
tables themselves are created only by the explicit migrations in ``migrations/versions``.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    DateTime,
    Double,
    ForeignKey,
    Integer,
    MetaData,
    Sequence,
    String,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

RUN_ID_SEQUENCE = Sequence("replay_runs_id_seq")
"""DuckDB has no SERIAL; run ids come from this sequence (``nextval`` in the INSERT)."""

FLOAT_METRICS: tuple[str, ...] = (
    "imbalance_mean",
    "gap_mean",
    "idle_frac",
    "throughput_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "tpot_p99_ms",
    "pool_wait_p95_ms",
    "sched_ms_p50",
    "sched_ms_p99",
    "makespan_s",
)
COUNT_METRICS: tuple[str, ...] = ("steps", "output_tokens")
METRICS: tuple[str, ...] = FLOAT_METRICS + COUNT_METRICS
"""Every per-policy summary metric; each is one column of ``replay_policy_summaries``."""

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
