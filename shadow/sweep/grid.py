"""What a sweep varies: the parameters a cell may set, the grid they span, and cell keys.

A grid names values per parameter (`[grid]` in TOML, or `--param name=v1,v2`) and single
values (`[fixed]`); the sweep is their cartesian product. Parameters a policy does not read
(`beta` for `jsq`, `alpha`/`beta`/`gamma` for BR-H at `H = 0`) are set to None in its cells,
so cells that differ only there are one cell, replayed once.

A cell's key hashes the trace it replays (its requests, not its file name) with its
canonical parameters, so a cell stored by any earlier sweep is found and not replayed again.
Pure: plain data in and out.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shadow.policies import POLICY_NAMES
from shadow.policies.balanceroute_config import MAX_CANDIDATES
from shadow.replay.workload import Workload

#: Bump when the meaning of a stored cell changes, so old cells are not reused.
KEY_VERSION = 1


class GridError(ValueError):
    """A grid or parameter the sweep cannot run, with the parameter named."""


@dataclass(frozen=True)
class Param:
    """One parameter a cell may vary. `scope`: `all` policies, `br` (BR-0 and BR-H),
    `brh` (BR-H), `brh-horizon` (BR-H with `H > 0`: `H = 0` forces `alpha = 1, beta = G`)."""

    name: str
    kind: type
    default: Any
    help: str
    scope: str = "all"
    low: float | None = None
    high: float | None = None
    low_open: bool = False

    def check(self, value: Any) -> Any:
        """The canonical value (int or float or str), or a `GridError` naming the parameter."""
        if self.kind is str:
            if not isinstance(value, str) or value not in POLICY_NAMES:
                raise GridError(
                    f"{self.name}: unknown policy {value!r}; choose from {', '.join(POLICY_NAMES)}"
                )
            return value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GridError(f"{self.name}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise GridError(f"{self.name}: expected a finite number, got {value!r}")
        if self.kind is int:
            if float(value) != int(value):
                raise GridError(f"{self.name}: expected an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
        too_low = self.low is not None and (
            value <= self.low if self.low_open else value < self.low
        )
        if too_low or (self.high is not None and value > self.high):
            raise GridError(f"{self.name}: {value!r} is out of range ({self.range_text()})")
        return value

    def range_text(self) -> str:
        low = "" if self.low is None else f"{'>' if self.low_open else '>='} {self.low:g}"
        high = "" if self.high is None else f"<= {self.high:g}"
        return " and ".join(part for part in (low, high) if part) or "any"

    def parse(self, text: str) -> Any:
        """A value written on the command line."""
        text = text.strip()
        if self.kind is str:
            return self.check(text)
        try:
            number = float(text)
        except ValueError:
            raise GridError(f"{self.name}: {text!r} is not a number") from None
        if self.kind is int and number.is_integer():
            return self.check(int(number))
        return self.check(number)


_BR = "br"
_BRH = "brh"
_BRH_HORIZON = "brh-horizon"

#: Every parameter a cell may set, in the order cells print them.
PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("policy", str, "brh-survival", "routing policy", scope="all"),
        Param("horizon", int, 80, "BR-H horizon H (steps)", scope=_BRH, low=0),
        Param("alpha", float, 1.0, "BR-H fill reward", scope=_BRH_HORIZON, low=0),
        Param("beta", float, 43.0, "BR-H overflow weight", scope=_BRH_HORIZON, low=0),
        Param(
            "gamma", float, 0.86, "BR-H discount", scope=_BRH_HORIZON, low=0, low_open=True, high=1
        ),
        Param("s_greedy", int, 7, "free slots above which Stage 1 is greedy", scope=_BR, low=0),
        Param("r_max", int, 4, "Stage 2 candidates", scope=_BR, low=1, high=MAX_CANDIDATES),
        Param("workers", int, 8, "decode workers G", low=1),
        Param("batch", int, 64, "slots per worker B", low=1),
        Param("load", float, None, "arrival load (1.0 = fleet capacity)", low=0, low_open=True),
        Param("step_a", float, 1.2e-4, "step model: ms per KV token", low=0),
        Param("step_b", float, 20.0, "step model: fixed ms per step", low=0),
        Param("seed", int, 0, "preset and policy seed", low=0),
    )
}
#: Parameters that select the trace itself: one value per sweep (`[fixed]` or options).
TRACE_PARAMS: dict[str, Param] = {
    p.name: p
    for p in (
        Param("limit", int, None, "keep the first N requests", low=1),
        Param("output_min", int, None, "keep requests with >= N output tokens", low=1),
    )
}
ALIASES = {"H": "horizon", "G": "workers", "B": "batch", "seeds": "seed"}


def canonical_name(name: str) -> str:
    """`H` -> `horizon`, `seeds` -> `seed`, ...; unknown names raise a `GridError`."""
    resolved = ALIASES.get(name.strip(), name.strip())
    if resolved not in PARAMS and resolved not in TRACE_PARAMS:
        known = [*PARAMS, *TRACE_PARAMS, *ALIASES]
        raise GridError(f"unknown parameter {name!r}; choose from {', '.join(known)}")
    return resolved


def applies(name: str, params: Mapping[str, Any]) -> bool:
    """Whether the cell's policy reads parameter `name` (else the cell holds None)."""
    scope = PARAMS[name].scope
    policy = str(params["policy"])
    if scope == "all":
        return True
    if scope == _BR:
        return policy == "br0" or policy.startswith("brh")
    is_brh = policy.startswith("brh")
    if scope == _BRH:
        return is_brh
    return is_brh and params.get("horizon") != 0


@dataclass(frozen=True)
class SweepSpec:
    """The grid: `axes` (parameter -> values, in the order given) and `fixed` values.

    `trace` holds the trace selectors (`limit`, `output_min`) given in the grid, if any.
    """

    axes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"axes": {k: list(v) for k, v in self.axes.items()}, "fixed": self.fixed,
                "trace_filters": self.trace}  # fmt: skip

    def seeds(self) -> tuple[int, ...]:
        if "seed" in self.axes:
            return tuple(self.axes["seed"])
        return (int(self.fixed.get("seed", PARAMS["seed"].default)),)

    def size(self) -> int:
        """Cells in the cartesian product, before cells that share a key are merged."""
        return math.prod(len(values) for values in self.axes.values())


def _values(name: str, raw: Any, where: str) -> tuple[Any, ...]:
    param = PARAMS[name]
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise GridError(f"{name}: {where} gives no values")
    seen: list[Any] = []
    for item in items:
        value = param.check(item)
        if value not in seen:
            seen.append(value)
    return tuple(seen)


def build_spec(
    grid: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
    overrides: Iterable[str] = (),
) -> SweepSpec:
    """Merge a grid file's tables with `--param name=v1,v2` options (which win)."""
    axes: dict[str, tuple[Any, ...]] = {}
    fixed_values: dict[str, Any] = {}
    trace: dict[str, Any] = {}

    def put(name: str, values: tuple[Any, ...]) -> None:
        """Set `name` (an override keeps an axis where the grid put it)."""
        if len(values) == 1:
            axes.pop(name, None)
            fixed_values[name] = values[0]
        else:
            fixed_values.pop(name, None)
            axes[name] = values

    given: set[str] = set()
    for table, where in ((grid or {}, "[grid]"), (fixed or {}, "[fixed]")):
        for raw_name, raw in table.items():
            name = canonical_name(raw_name)
            if name in given:
                raise GridError(f"{name}: given twice in the grid file")
            given.add(name)
            if name in TRACE_PARAMS:
                if isinstance(raw, list):
                    raise GridError(
                        f"{name}: selects the trace, so it takes one value per sweep, not a list"
                    )
                trace[name] = TRACE_PARAMS[name].check(raw)
                continue
            if where == "[fixed]" and isinstance(raw, list):
                raise GridError(f"{name}: [fixed] takes one value; put lists under [grid]")
            put(name, _values(name, raw, where))
    for option in overrides:
        raw_name, sep, text = option.partition("=")
        if not sep or not text.strip():
            raise GridError(f"--param {option!r}: expected name=v1,v2,...")
        name = canonical_name(raw_name)
        parts = [part for part in text.split(",") if part.strip()]
        if name in TRACE_PARAMS:
            if len(parts) != 1:
                raise GridError(f"{name}: selects the trace, so it takes one value per sweep")
            trace[name] = TRACE_PARAMS[name].parse(parts[0])
            continue
        param = PARAMS[name]
        values: list[Any] = []
        for part in parts:
            value = param.parse(part)
            if value not in values:
                values.append(value)
        put(name, tuple(values))
    # Seeds vary innermost, so a partial sweep covers whole configurations first.
    if "seed" in axes:
        axes["seed"] = axes.pop("seed")
    return SweepSpec(axes, fixed_values, trace)


def load_grid(path: Path, overrides: Iterable[str] = ()) -> SweepSpec:
    """Read a grid TOML (`[grid]` lists, optional `[fixed]` values) plus `--param` options."""
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise GridError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise GridError(f"{path}: {error.strerror or error}") from None
    unknown = set(data) - {"grid", "fixed"}
    if unknown:
        raise GridError(f"{path}: unknown tables {sorted(unknown)}; use [grid] and [fixed]")
    for table in ("grid", "fixed"):
        if table in data and not isinstance(data[table], dict):
            raise GridError(f"{path}: {table} must be a table ([{table}])")
    return build_spec(data.get("grid"), data.get("fixed"), overrides)


def check_cell(params: Mapping[str, Any]) -> None:
    """Cross-parameter checks of one cell (a step model that takes no time, ...)."""
    if params["step_a"] == 0 and params["step_b"] == 0:
        raise GridError("step_a and step_b: the step model must take some time (one > 0)")


def expand(spec: SweepSpec) -> list[dict[str, Any]]:
    """The cells' parameters (every name in `PARAMS`), in product order, merged where
    they differ only in parameters their policy does not read."""
    base = {name: param.default for name, param in PARAMS.items()} | spec.fixed
    names = list(spec.axes)
    cells: list[dict[str, Any]] = []
    seen: set[str] = set()
    for combo in itertools.product(*(spec.axes[n] for n in names)):
        params = base | dict(zip(names, combo, strict=True))
        params = {
            name: (value if applies(name, params) else None) for name, value in params.items()
        }
        check_cell(params)
        identity = json.dumps(params, sort_keys=True)
        if identity not in seen:
            seen.add(identity)
            cells.append(params)
    return cells


def workload_digest(workload: Workload) -> str:
    """A trace's identity: its requests (times, sizes, keys), not its name or path."""
    digest = hashlib.sha256()
    for array, dtype in (
        (workload.ready_s, np.float64),
        (workload.prompt_tokens, np.int64),
        (workload.output_tokens, np.int64),
        (workload.prompt_keys, np.int64),
    ):
        digest.update(np.ascontiguousarray(array, dtype=dtype).tobytes())
    return digest.hexdigest()[:24]


def cell_key(trace_digest: str, params: Mapping[str, Any]) -> str:
    """Stable across runs, machines and executors: the trace and the canonical parameters
    (seed included); None for parameters the policy does not read."""
    canonical = json.dumps(
        {"v": KEY_VERSION, "trace": trace_digest, "params": dict(params)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def spec_hash(trace: str, spec: SweepSpec, extra: Mapping[str, Any] | None = None) -> str:
    """Short hash naming a sweep by default: the same grid on the same trace resumes."""
    text = json.dumps(
        {"trace": trace, "spec": spec.as_json(), "extra": dict(extra or {})}, sort_keys=True
    )
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def varied(cells: Sequence[Mapping[str, Any]]) -> list[str]:
    """Parameters (seed excluded) that take more than one value among `cells`."""
    out = []
    for name in PARAMS:
        if name == "seed":
            continue
        values = {json.dumps(c.get(name)) for c in cells if c.get(name) is not None}
        if len(values) > 1:
            out.append(name)
    return out
