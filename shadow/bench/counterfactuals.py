"""What the continuous counterfactuals cost (`shadow bench replay --continuous`).

Recorded traffic (the incumbent's replay of a preset, emitted as events) is ingested
twice through the service's own pipeline: once with the windows off and once with the
continuous counterfactuals on, the audit off in both so the difference is theirs alone.
The extra CPU (this process and its worker processes, which `Runtime.close` joins) is
divided by the steps the counterfactual runs simulated (`window_metrics.steps`, every
policy but the observed fleet) and by the live events ingested.
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

from shadow.bench.bias import ingest_recorded, record
from shadow.replay.workload import StepModel
from shadow.stream.windows import OBSERVED


@dataclass(frozen=True)
class CounterfactualCost:
    events: int
    windows: int
    policies: tuple[str, ...]
    simulated_steps: int
    cpu_off_s: float
    cpu_on_s: float
    wall_off_s: float
    wall_on_s: float

    @property
    def extra_cpu_s(self) -> float:
        return self.cpu_on_s - self.cpu_off_s

    @property
    def us_per_simulated_step(self) -> float:
        return self.extra_cpu_s / max(self.simulated_steps, 1) * 1e6

    @property
    def us_per_live_event(self) -> float:
        return self.extra_cpu_s / max(self.events, 1) * 1e6


def _cpu_s() -> float:
    """CPU of this process and of its children that ended (the joined worker pools)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _ingest(log: Path, db: Path, config: Path) -> tuple[float, float]:
    """`ingest_recorded`'s CPU (this process and its joined workers) and wall seconds."""
    cpu, wall = _cpu_s(), time.perf_counter()
    ingest_recorded(log, db, config)
    return _cpu_s() - cpu, time.perf_counter() - wall


def run(
    requests: int = 5_000,
    load: float = 1.0,
    incumbent: str = "jsq-pool",
    policies: tuple[str, ...] = ("jsq-pool", "br0", "brh-survival", "random"),
    workers: int = 8,
    batch: int = 64,
    window_s: float = 30.0,
) -> CounterfactualCost:
    with tempfile.TemporaryDirectory(prefix="shadow-bench-cf-") as tmp:
        root = Path(tmp)
        log = root / "recorded.jsonl"
        record(log, incumbent, load, requests, StepModel(), workers, batch)
        events = sum(1 for _ in log.open())
        common = "[ingest]\naudit_enabled = false\n"
        off = root / "off.toml"
        off.write_text(common + "windows_enabled = false\n")
        on = root / "on.toml"
        on.write_text(
            common + f'[windows]\nmode = "continuous"\nincumbent = "{incumbent}"\n'
            f"length_s = {window_s}\npolicies = {json.dumps(list(policies))}\n"
        )
        cpu_off, wall_off = _ingest(log, root / "off.duckdb", off)
        cpu_on, wall_on = _ingest(log, root / "on.duckdb", on)
        with duckdb.connect(str(root / "on.duckdb"), read_only=True) as db:
            steps, windows = db.execute(
                "SELECT coalesce(sum(steps), 0), count(DISTINCT window_index) "
                "FROM window_metrics WHERE policy <> ?",
                [OBSERVED],
            ).fetchone()
    return CounterfactualCost(
        events=events, windows=int(windows), policies=tuple(policies),
        simulated_steps=int(steps), cpu_off_s=cpu_off, cpu_on_s=cpu_on,
        wall_off_s=wall_off, wall_on_s=wall_on,
    )  # fmt: skip
