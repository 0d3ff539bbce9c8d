"""Simulated steps per second and peak memory of each policy's replay.

Each policy runs in a fresh child process, so the peak resident memory it reports is its
own (the interpreter and numpy included; the baseline before the replay is reported too).
"""

from __future__ import annotations

import multiprocessing
import resource
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from shadow.replay.workload import StepModel, Workload


@dataclass(frozen=True)
class ReplayBench:
    policy: str
    steps: int
    seconds: float
    steps_per_s: float
    peak_rss_mib: float
    baseline_rss_mib: float


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measure(args: tuple[Workload, str, int, int, StepModel, int]) -> ReplayBench:
    from shadow.policies import make_policy
    from shadow.replay import replay

    workload, name, workers, batch, model, seed = args
    baseline = _rss_mib()
    policy = make_policy(name, seed=seed)
    started = time.perf_counter()
    result = replay(workload, policy, workers=workers, batch=batch, step_model=model)
    seconds = time.perf_counter() - started
    return ReplayBench(name, result.steps, seconds, result.steps / seconds, _rss_mib(), baseline)


def run(
    workload: Workload,
    policies: Sequence[str],
    *,
    workers: int,
    batch: int,
    step_model: StepModel,
    seed: int = 0,
) -> list[ReplayBench]:
    context = multiprocessing.get_context("spawn")
    results = []
    for name in policies:
        with context.Pool(1) as pool:
            results.append(
                pool.apply(_measure, ((workload, name, workers, batch, step_model, seed),))
            )
    return results


def as_json(results: Sequence[ReplayBench]) -> dict:
    return {"policies": [asdict(r) for r in results]}
