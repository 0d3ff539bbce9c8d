"""One typed settings object for `shadow serve` and `shadow ingest`: defaults, then a
TOML file, then `SHADOW_*` environment variables (flat names, e.g. `SHADOW_DB`)."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from shadow.modes.machine import ModeConfig
from shadow.policies import POLICY_NAMES, BalanceRouteConfig
from shadow.replay.workload import StepModel
from shadow.service.http.auth import MIN_TOKEN_LENGTH, ROLES, Role, TokenTable, is_loopback
from shadow.service.ingest.pipeline import Limits, PipelineConfig
from shadow.stream.audit import DEFAULT_SHADOW_POLICIES, AuditConfig
from shadow.stream.invariants import InvariantConfig
from shadow.stream.windows import WindowConfig


class EngineTarget(BaseModel):
    """One decode engine whose Prometheus `/metrics` the service scrapes."""

    model_config = ConfigDict(extra="forbid")

    worker: str
    url: str


class TokenSpec(BaseModel):
    """One bearer token: a name (for logs and errors, never the secret) and its roles."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=64)
    token: SecretStr
    roles: list[Role] = Field(min_length=1)

    @field_validator("token")
    @classmethod
    def _long_enough(cls, token: SecretStr) -> SecretStr:
        if len(token.get_secret_value()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"a token must be at least {MIN_TOKEN_LENGTH} characters")
        return token


class ServiceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    db: Path = Path("shadow.duckdb")
    host: str = "127.0.0.1"
    port: int = Field(8321, ge=0, le=65535)
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    max_batch_events: int = Field(500_000, ge=1)
    max_reorder_events: int = Field(1_000_000, ge=1000)
    max_fleets: int = Field(64, ge=1)
    max_workers_per_fleet: int = Field(1024, ge=1)
    max_active_per_fleet: int = Field(200_000, ge=1)
    finished_ttl_s: float = Field(300.0, gt=0)
    max_audit_backlog: int = Field(64, ge=1)
    duckdb_memory_mb: int = Field(512, ge=64)
    reorder_window_s: float = Field(2.0, ge=0)
    idle_flush_s: float = Field(0.5, gt=0)
    audit: bool = True
    audit_policies: list[str] = Field(default_factory=lambda: list(DEFAULT_SHADOW_POLICIES))
    workers_processes: bool = True
    windows: bool = True
    window_s: float = Field(30.0, gt=0)
    window_max_lag_s: float = Field(600.0, gt=0)
    window_policies: list[str] = Field(
        default_factory=lambda: ["jsq", "random", "br0", "brh-survival", "brh-oracle"]
    )
    incumbent: str = "jsq"
    ghost_ttl_s: float = Field(120.0, gt=0)
    drift_samples: int = Field(3, ge=1)
    step_a_ms_per_token: float = Field(1.2e-4, ge=0)
    step_b_ms: float = Field(20.0, ge=0)
    br_horizon: int = Field(80, ge=0)
    br_alpha: float = Field(1.0, ge=0)
    br_beta: float = Field(43.0, ge=0)
    br_gamma: float = Field(0.86, gt=0, le=1)
    fleet: str = "default"
    engines: list[EngineTarget] = Field(default_factory=list)
    poll_interval_s: float = Field(0.5, gt=0)
    staleness_s: float = Field(3.0, gt=0)
    scrape_drift_tolerance: int = Field(2, ge=0)
    route_budget_ms: float = Field(5.0, gt=0)
    mode_trip_k: int = Field(3, ge=1)
    mode_trip_m: int = Field(5, ge=1)
    mode_min_requests: int = Field(20, ge=0)
    mode_recovery_windows: int = Field(12, ge=1)
    mode_cooldown_base_s: float = Field(300.0, ge=0)
    mode_cooldown_max_s: float = Field(3600.0, ge=0)
    mode_latch_trips: int = Field(3, ge=1)
    demo: bool = False
    demo_workers: int = Field(4, ge=1, le=64)
    demo_batch: int = Field(16, ge=1)
    demo_time_scale: float = Field(0.3, gt=0)
    demo_load: float = Field(0.9, gt=0)
    tokens: list[TokenSpec] = Field(default_factory=list)
    tokens_file: Path | None = None

    def token_table(self) -> TokenTable:
        return TokenTable((t.name, t.token.get_secret_value(), t.roles) for t in self.tokens)

    def check(self) -> None:
        if not self.tokens and not is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host} without tokens: add tokens to the config "
                "file or tokens_file, or set SHADOW_TOKENS_INGEST and SHADOW_TOKENS_OPERATOR "
                "(see docs/RELIABILITY.md); or listen on 127.0.0.1"
            )
        unknown = [
            p for p in [*self.audit_policies, *self.window_policies, self.incumbent]
            if p not in POLICY_NAMES
        ]  # fmt: skip
        if unknown:
            raise ValueError(
                f"unknown policy {', '.join(unknown)}; choose from {', '.join(POLICY_NAMES)}"
            )

    def mode_config(self) -> ModeConfig:
        return ModeConfig(
            trip_k=self.mode_trip_k,
            trip_m=self.mode_trip_m,
            min_requests_per_window=self.mode_min_requests,
            recovery_windows=self.mode_recovery_windows,
            cooldown_base_s=self.mode_cooldown_base_s,
            cooldown_max_s=self.mode_cooldown_max_s,
            latch_trips=self.mode_latch_trips,
        )

    def pipeline(self) -> PipelineConfig:
        route = BalanceRouteConfig(
            horizon=self.br_horizon, alpha=self.br_alpha, beta=self.br_beta, gamma=self.br_gamma
        )
        return PipelineConfig(
            limits=Limits(
                max_reorder_events=self.max_reorder_events,
                max_fleets=self.max_fleets,
                max_workers_per_fleet=self.max_workers_per_fleet,
                max_active_per_fleet=self.max_active_per_fleet,
                finished_ttl_s=self.finished_ttl_s,
                max_audit_backlog=self.max_audit_backlog,
            ),
            reorder_window_s=self.reorder_window_s,
            audit_enabled=self.audit,
            windows_enabled=self.windows,
            default_step_model=StepModel(self.step_a_ms_per_token, self.step_b_ms),
            audit=AuditConfig(tuple(self.audit_policies), route),
            invariants=InvariantConfig(
                ghost_ttl_s=self.ghost_ttl_s, drift_samples=self.drift_samples
            ),
            windows=WindowConfig(
                length_s=self.window_s,
                max_lag_s=self.window_max_lag_s,
                policies=tuple(self.window_policies),
                incumbent=self.incumbent,
                balance_route=route,
            ),
        )


def _env_tokens() -> list[dict[str, Any]]:
    out = []
    for role in ROLES:
        raw = os.environ.get(f"SHADOW_TOKENS_{role.upper()}", "")
        for i, token in enumerate(t.strip() for t in raw.split(",")):
            if token:
                out.append({"name": f"env-{role}-{i + 1}", "token": token, "roles": [role]})
    return out


def _file_tokens(path: Any) -> list[dict[str, Any]]:
    """`[[tokens]]` from a separate file (kept apart so secrets can be root-only)."""
    if path is None:
        return []
    try:
        return list(tomllib.loads(Path(path).read_text()).get("tokens", []))
    except FileNotFoundError:
        raise ValueError(f"tokens_file {path} does not exist") from None
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"tokens_file {path}: {error}") from None


def load_settings(path: Path | None = None, **overrides: Any) -> ServiceSettings:
    """Defaults < TOML file < environment < explicit overrides (CLI options)."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            values.update(tomllib.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise ValueError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"config file {path}: {error}") from None
    for name in ServiceSettings.model_fields:
        env = os.environ.get(f"SHADOW_{name.upper()}")
        if env is not None and name not in ("engines", "tokens"):
            values[name] = env.split(",") if name.endswith("_policies") else env
    values.update({k: v for k, v in overrides.items() if v is not None})
    values["tokens"] = [*values.get("tokens", []), *_file_tokens(values.get("tokens_file")),
                        *_env_tokens()]  # fmt: skip
    try:
        settings = ServiceSettings(**values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(f"invalid settings: {problems}") from None
    settings.check()
    return settings
