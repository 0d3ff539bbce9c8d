"""One typed settings object for `shadow serve` and `shadow ingest`: defaults, then a TOML
file, then `SHADOW_*` environment variables, then explicit overrides (CLI options).

The core's own config dataclasses are the sections (`[modes]` is `ModeConfig`, `[limits]`
`Limits`, ...), so every default and bound is written once, in its dataclass (bounds as
`ge`/`gt`/`le`/`lt` in a field's `metadata`, cross-field rules in `__post_init__`). A
section holds its dataclass's own fields; a field that is itself a config dataclass (the
audit's and the windows' `balance_route`, the ingest path's nested configs) is a section
of its own, joined in by `pipeline()`. Environment: `SHADOW_<NAME>` for a top-level name,
`SHADOW_<SECTION>__<FIELD>` for a section's (`SHADOW_MODES__TRIP_K`). The flat names of
before (`window_s`, `SHADOW_MODE_TRIP_K`, ...) still work, with one deprecation warning
naming the new spelling.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    SecretStr,
    ValidationError,
    create_model,
    field_validator,
)
from pydantic_core import core_schema

from shadow.modes.machine import ModeConfig
from shadow.policies import BalanceRouteConfig, policy_names
from shadow.replay.workload import StepModel
from shadow.service.http.auth import MIN_TOKEN_LENGTH, ROLES, Role, TokenTable, is_loopback
from shadow.service.ingest.config import Limits, PipelineConfig
from shadow.service.plugins import import_policy_modules
from shadow.service.workers import WORKERS_NICE
from shadow.storage.archive import RetentionConfig
from shadow.stream.audit import AuditConfig
from shadow.stream.invariants import InvariantConfig
from shadow.stream.windows import WindowConfig

log = logging.getLogger(__name__)

#: the section names and the core config dataclass each one is
SECTIONS: dict[str, type] = {
    "ingest": PipelineConfig,
    "limits": Limits,
    "audit": AuditConfig,
    "windows": WindowConfig,
    "invariants": InvariantConfig,
    "balance_route": BalanceRouteConfig,
    "step_model": StepModel,
    "modes": ModeConfig,
    "storage": RetentionConfig,
}

#: the flat names of before -> (section, field); `audit` and `windows` given a table are
#: the sections, given a value the switches they always were
FLAT_NAMES: dict[str, tuple[str, str]] = {
    "reorder_window_s": ("ingest", "reorder_window_s"),
    "audit": ("ingest", "audit_enabled"),
    "windows": ("ingest", "windows_enabled"),
    "max_reorder_events": ("limits", "max_reorder_events"),
    "max_fleets": ("limits", "max_fleets"),
    "max_workers_per_fleet": ("limits", "max_workers_per_fleet"),
    "max_active_per_fleet": ("limits", "max_active_per_fleet"),
    "finished_ttl_s": ("limits", "finished_ttl_s"),
    "max_audit_backlog": ("limits", "max_audit_backlog"),
    "audit_policies": ("audit", "policies"),
    "window_s": ("windows", "length_s"),
    "window_max_lag_s": ("windows", "max_lag_s"),
    "window_policies": ("windows", "policies"),
    "incumbent": ("windows", "incumbent"),
    "ghost_ttl_s": ("invariants", "ghost_ttl_s"),
    "drift_samples": ("invariants", "drift_samples"),
    "scrape_drift_tolerance": ("invariants", "scrape_drift_tolerance"),
    "step_a_ms_per_token": ("step_model", "a_ms_per_token"),
    "step_b_ms": ("step_model", "b_ms"),
    "br_horizon": ("balance_route", "horizon"),
    "br_alpha": ("balance_route", "alpha"),
    "br_beta": ("balance_route", "beta"),
    "br_gamma": ("balance_route", "gamma"),
    "mode_trip_k": ("modes", "trip_k"),
    "mode_trip_m": ("modes", "trip_m"),
    "mode_min_requests": ("modes", "min_requests_per_window"),
    "mode_recovery_windows": ("modes", "recovery_windows"),
    "mode_cooldown_base_s": ("modes", "cooldown_base_s"),
    "mode_cooldown_max_s": ("modes", "cooldown_max_s"),
    "mode_latch_trips": ("modes", "latch_trips"),
}

_BOUNDS = ("ge", "gt", "le", "lt")


def _section_model(config: type) -> type[BaseModel]:
    """A pydantic model of `config`'s own fields, with the dataclass's defaults and bounds;
    fields that are config dataclasses themselves are left to their own sections."""
    hints = typing.get_type_hints(config)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        if dataclasses.is_dataclass(hints[f.name]):
            continue
        bounds = {k: v for k, v in f.metadata.items() if k in _BOUNDS}
        if f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints[f.name], Field(default_factory=f.default_factory, **bounds))
        else:  # a field without a default is a required key of its section
            default = ... if f.default is dataclasses.MISSING else f.default
            fields[f.name] = (hints[f.name], Field(default, **bounds))
    return create_model(
        f"{config.__name__}Section", __config__=ConfigDict(extra="forbid"), **fields
    )


SECTION_MODELS: dict[str, type[BaseModel]] = {
    name: _section_model(config) for name, config in SECTIONS.items()
}


class _AsSection:
    """Validates a section's table through its model, then builds the dataclass (whose
    `__post_init__` checks the rules across fields); an instance passes as it is."""

    def __get_pydantic_core_schema__(
        self, source: type, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        model = next(m for name, m in SECTION_MODELS.items() if SECTIONS[name] is source)

        def build(value: Any, validate: core_schema.ValidatorFunctionWrapHandler) -> Any:
            if isinstance(value, source):
                return value
            section = validate(value)
            return source(**{name: getattr(section, name) for name in type(section).model_fields})

        return core_schema.no_info_wrap_validator_function(build, handler.generate_schema(model))


Config = TypeVar("Config")
Section = Annotated[Config, _AsSection()]


class EngineTarget(BaseModel):
    """One decode engine whose Prometheus `/metrics` the service scrapes.

    `engine` is its DP rank label on a page that serves several engines (vLLM with
    `--data-parallel-size`: one URL, `engine="0"`, `engine="1"`, ...); entries sharing a
    URL are scraped once per tick. Without it, a page must serve one engine or an engine
    labelled like `worker`. `engine = 1` in TOML is read as the label "1".
    """

    model_config = ConfigDict(extra="forbid")

    worker: str
    url: str
    engine: str | None = Field(None, min_length=1, max_length=64)

    @field_validator("engine", mode="before")
    @classmethod
    def _rank_as_label(cls, engine: object) -> object:
        if isinstance(engine, int) and not isinstance(engine, bool):
            return str(engine)
        return engine


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
    duckdb_memory_mb: int = Field(512, ge=64)
    idle_flush_s: float = Field(0.5, gt=0)
    workers_processes: bool = True
    #: how far the worker processes (audit, counterfactual replays) yield the cores to
    #: ingest when both are busy (a niceness added to theirs: 0 shares them equally)
    workers_nice: int = Field(WORKERS_NICE, ge=0, le=19)
    fleet: str = "default"
    engines: list[EngineTarget] = Field(default_factory=list)
    poll_interval_s: float = Field(0.5, gt=0)
    staleness_s: float = Field(3.0, gt=0)
    route_budget_ms: float = Field(5.0, gt=0)
    demo: bool = False
    demo_workers: int = Field(4, ge=1, le=64)
    demo_batch: int = Field(16, ge=1)
    demo_time_scale: float = Field(0.3, gt=0)
    demo_load: float = Field(0.9, gt=0)
    #: the demo's traffic stops after this many seconds (the fleet then drains: a check
    #: against a full replay of what it sent); None loops the trace for as long as it runs
    demo_traffic_s: float | None = Field(None, gt=0)
    #: what `--demo` runs: "emulator" (the default: no extra needed) or "vllm" (real vLLM
    #: servers of a tiny model, the tap and the plugin; needs the [vllm] extra)
    demo_world: Literal["emulator", "vllm"] = "emulator"
    tokens: list[TokenSpec] = Field(default_factory=list)
    tokens_file: Path | None = None
    #: modules imported (in the service and in its worker processes) for the policies they
    #: register with `@register_policy`: plug-ins, or a test's own policies
    policy_modules: list[str] = Field(default_factory=list)
    ingest: Section[PipelineConfig] = Field(default_factory=PipelineConfig)
    limits: Section[Limits] = Field(default_factory=Limits)
    audit: Section[AuditConfig] = Field(default_factory=AuditConfig)
    windows: Section[WindowConfig] = Field(default_factory=WindowConfig)
    invariants: Section[InvariantConfig] = Field(default_factory=InvariantConfig)
    balance_route: Section[BalanceRouteConfig] = Field(default_factory=BalanceRouteConfig)
    step_model: Section[StepModel] = Field(default_factory=StepModel)
    modes: Section[ModeConfig] = Field(default_factory=ModeConfig)
    storage: Section[RetentionConfig] = Field(default_factory=RetentionConfig)

    def token_table(self) -> TokenTable:
        return TokenTable((t.name, t.token.get_secret_value(), t.roles) for t in self.tokens)

    def check(self) -> None:
        if not self.tokens and not is_loopback(self.host):
            raise ValueError(
                f"refusing to listen on {self.host} without tokens: add tokens to the config "
                "file or tokens_file, or set SHADOW_TOKENS_INGEST and SHADOW_TOKENS_OPERATOR "
                "(see docs/RELIABILITY.md); or listen on 127.0.0.1"
            )
        import_policy_modules(self.policy_modules)
        windows = self.windows
        known = policy_names()
        unknown = [
            p for p in [*self.audit.policies, *windows.policies, windows.incumbent]
            if p not in known
        ]  # fmt: skip
        if unknown:
            raise ValueError(f"unknown policy {', '.join(unknown)}; choose from {', '.join(known)}")

    def mode_config(self) -> ModeConfig:
        return self.modes

    def pipeline(self) -> PipelineConfig:
        """The ingest path's config: `[ingest]` with the sections it nests, and the one
        `[balance_route]` that the audit and the windows share."""
        route = self.balance_route
        return dataclasses.replace(
            self.ingest,
            limits=self.limits,
            invariants=self.invariants,
            default_step_model=self.step_model,
            audit=dataclasses.replace(self.audit, balance_route=route),
            windows=dataclasses.replace(self.windows, balance_route=route),
        )

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> ServiceSettings:
        """Pydantic's copy, where `update` may also name a section's field by its flat name
        of before (`window_s`); a name that is neither is refused, not silently kept."""
        if not update:
            return super().model_copy(deep=deep)
        changes: dict[str, Any] = {}
        for key, value in update.items():
            if _is_flat(key, value):
                section, name = FLAT_NAMES[key]
                current = changes.get(section, getattr(self, section))
                changes[section] = dataclasses.replace(current, **{name: value})
            elif key in type(self).model_fields:
                changes[key] = value
            else:
                raise ValueError(f"unknown setting {key!r}")
        return super().model_copy(update=changes, deep=deep)


def _is_flat(key: str, value: Any) -> bool:
    """A flat name of before (`audit = false` is one; `[audit]`, a table, is not)."""
    if key in SECTIONS:
        return key in FLAT_NAMES and not (
            isinstance(value, Mapping) or dataclasses.is_dataclass(value)
        )
    return key in FLAT_NAMES


def _nest(values: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """One source's values with flat names moved into their sections, and the flat names
    it used."""
    out: dict[str, Any] = {}
    flat: list[str] = []
    for key, value in values.items():
        if _is_flat(key, value):
            section, name = FLAT_NAMES[key]
            table = out.setdefault(section, {})
            if isinstance(table, dict):  # the section's own spelling wins (a whole one too)
                table.setdefault(name, value)
            flat.append(key)
        elif key in SECTIONS and isinstance(value, Mapping):
            table = out.get(key)
            out[key] = {**table, **value} if isinstance(table, dict) else dict(value)
        else:
            out[key] = value
    return out, flat


def _merge(base: dict[str, Any], layer: Mapping[str, Any]) -> None:
    """Lay `layer` over `base`: a section's table field by field, anything else whole."""
    for key, value in layer.items():
        below = base.get(key)
        if key in SECTIONS and isinstance(value, dict) and isinstance(below, dict):
            base[key] = {**below, **value}
        else:
            base[key] = value


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (list, tuple)


def _env_values() -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """`SHADOW_*` variables, nested; and each flat one used, with its new spelling."""
    values: dict[str, Any] = {}
    renamed: list[tuple[str, str]] = []

    def read(variable: str, annotation: Any) -> Any:
        raw = os.environ.get(variable)
        return raw.split(",") if raw is not None and _is_list(annotation) else raw

    for name, info in ServiceSettings.model_fields.items():
        if name not in SECTIONS and name not in ("engines", "tokens"):
            value = read(f"SHADOW_{name.upper()}", info.annotation)
            if value is not None:
                values[name] = value
    for flat, (section, name) in FLAT_NAMES.items():
        annotation = SECTION_MODELS[section].model_fields[name].annotation
        value = read(f"SHADOW_{flat.upper()}", annotation)
        if value is not None:
            values.setdefault(section, {}).setdefault(name, value)
            renamed.append((f"SHADOW_{flat.upper()}", f"SHADOW_{section}__{name}".upper()))
    for section, model in SECTION_MODELS.items():
        for name, info in model.model_fields.items():
            value = read(f"SHADOW_{section}__{name}".upper(), info.annotation)
            if value is not None:
                values.setdefault(section, {})[name] = value
    return values, renamed


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
    """Defaults < TOML file < environment < explicit overrides (CLI options; flat names of
    before are accepted there without a warning, as the programmatic spelling)."""
    values: dict[str, Any] = {}
    renamed: list[tuple[str, str]] = []
    if path is not None:
        try:
            from_file = tomllib.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"config file {path}: {error}") from None
        nested, flat = _nest(from_file)
        _merge(values, nested)
        renamed += [(name, "[{}] {}".format(*FLAT_NAMES[name])) for name in flat]
    from_env, env_renamed = _env_values()
    _merge(values, from_env)
    renamed += env_renamed
    _merge(values, _nest({k: v for k, v in overrides.items() if v is not None})[0])
    values["tokens"] = [*values.get("tokens", []), *_file_tokens(values.get("tokens_file")),
                        *_env_tokens()]  # fmt: skip
    if renamed:
        log.warning(
            "deprecated settings names (still read; use the new spelling): %s",
            ", ".join(f"{old} -> {new}" for old, new in renamed),
        )
    try:
        settings = ServiceSettings(**values)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(f"invalid settings: {problems}") from None
    settings.check()
    return settings
