"""Milliseconds per admission round of BR-0 and BR-H, on snapshots shaped like the paper's
Azure-2024 regime (prompts averaging ~4.6k tokens, outputs ~1k, full batches).

Each round gets a fresh random snapshot and pool; the time measured is the policy's
`admit` call alone, which includes BR-H's prediction and projection: wall time (what the
targets judge) and the thread's CPU time beside it (on a shared host the wall time's tail
measures the neighbours; the CPU time is the round's own work).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from shadow.policies import ActiveSet, FleetSnapshot, Policy, ReadyPool, make_policy

PROMPT_MEAN = 4652
PROMPT_SIGMA = 0.8


@dataclass(frozen=True)
class RouterCase:
    workers: int
    batch: int
    pool: int
    free_slots: int
    target_p99_ms: float | None = None


#: The cases of issue 2, with the P99 targets for this 2-core machine, and issue 24's
#: wide-EP fleet: G = 256, every free slot of one step's completions (one a worker); its
#: target is a third of a ~60 ms decode step.
DEFAULT_CASES = (
    RouterCase(8, 64, 256, 8, 1.5),
    RouterCase(8, 64, 256, 64),
    RouterCase(64, 64, 2048, 64, 20.0),
    RouterCase(256, 128, 4096, 256, 20.0),
)


@dataclass(frozen=True)
class RouterResult:
    policy: str
    workers: int
    batch: int
    pool: int
    free_slots: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    rounds: int
    cpu_p50_ms: float
    cpu_p99_ms: float


def _prompts(rng: np.random.Generator, n: int) -> np.ndarray:
    mu = np.log(PROMPT_MEAN) - PROMPT_SIGMA**2 / 2
    return np.clip(rng.lognormal(mu, PROMPT_SIGMA, n), 16, 32768).astype(np.int64)


def paper_like_outputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Output lengths above 1,000 clustered at 1,024, mean about 1,050 (the paper's regime)."""
    clustered = rng.random(n) < 0.6
    spread = 1001 + rng.geometric(1 / 70, n)
    return np.where(clustered, 1024, spread).astype(np.int64)


def random_round(rng: np.random.Generator, case: RouterCase) -> tuple[FleetSnapshot, ReadyPool]:
    """A full fleet with `free_slots` free slots spread at random, and a pool."""
    free = rng.multinomial(case.free_slots, np.full(case.workers, 1 / case.workers))
    free = np.minimum(free, case.batch)
    while free.sum() < case.free_slots:  # spill what a full worker could not take
        free[rng.choice(np.flatnonzero(free < case.batch))] += 1
    counts = case.batch - free
    n = int(counts.sum())
    outputs = paper_like_outputs(rng, n)
    generated = (rng.random(n) * outputs).astype(np.int64)
    active = ActiveSet.from_arrays(
        np.repeat(np.arange(case.workers), counts),
        _prompts(rng, n),
        generated,
        remaining=outputs - generated,
    )
    snapshot = FleetSnapshot.from_active(np.full(case.workers, case.batch), active)
    pool = ReadyPool.from_arrays(np.arange(case.pool).tolist(), _prompts(rng, case.pool))
    return snapshot, pool


def _policy(name: str, seed: int) -> Policy:
    policy = make_policy(name, seed=seed)
    predictor = getattr(policy, "predictor", None)
    if predictor is not None:
        predictor.observe_many(paper_like_outputs(np.random.default_rng(seed + 1), 10_000))
    return policy


def run_case(name: str, case: RouterCase, rounds: int, seed: int = 0) -> RouterResult:
    rng = np.random.default_rng(seed)
    policy = _policy(name, seed)
    inputs = [random_round(rng, case) for _ in range(rounds)]
    policy.admit(*inputs[0])  # warm caches and lazy imports outside the measurement
    elapsed = np.empty(rounds)
    cpu = np.empty(rounds)
    for i, (snapshot, pool) in enumerate(inputs):
        # The CPU span sits strictly inside the wall span. Read the other way round, a thread
        # preempted between the two closing reads was charged up to 0.07 ms more CPU than
        # wall on this VM (3,000 rounds beside three busy processes); nested, never.
        started = time.perf_counter()
        cpu_started = time.thread_time()
        admissions = policy.admit(snapshot, pool)
        cpu[i] = time.thread_time() - cpu_started
        elapsed[i] = time.perf_counter() - started
        if len(admissions) != min(case.free_slots, case.pool):
            raise AssertionError(f"{name} admitted {len(admissions)} of {case.free_slots} slots")
    ms, cpu_ms = elapsed * 1000.0, cpu * 1000.0
    return RouterResult(
        name,
        case.workers,
        case.batch,
        case.pool,
        case.free_slots,
        round(float(np.percentile(ms, 50)), 4),
        round(float(np.percentile(ms, 99)), 4),
        round(float(ms.max()), 4),
        rounds,
        round(float(np.percentile(cpu_ms, 50)), 4),
        round(float(np.percentile(cpu_ms, 99)), 4),
    )


def run(
    policies: Sequence[str], cases: Sequence[RouterCase], rounds: int, seed: int = 0
) -> Iterator[tuple[RouterCase, RouterResult]]:
    for case in cases:
        for name in policies:
            yield case, run_case(name, case, rounds, seed)


def as_json(results: Sequence[RouterResult]) -> dict:
    return {"cases": [asdict(result) for result in results]}
