"""The A/A run's draws: the incumbent against itself on differences no router could act
on, so the gate knows how far a window's metrics move on arbitrary choices alone.

`relabelled` shuffles the workers' order (index tie-breaks and Round-Robin's start fall
elsewhere; every window metric is blind to labels). `jittered` delays each arrival by up
to one step, for a rule with no ties left to draw (BR-0): only the round that first sees
a request moves.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from shadow.replay import InitialRequest
from shadow.replay.workload import Workload


def worker_order(workers: int, seed: int) -> np.ndarray:
    """The relabelling of the A/A draw: the new position of each worker (seeded)."""
    return np.random.default_rng(seed).permutation(workers)


def moved_to(initial: tuple[InitialRequest, ...], order: np.ndarray) -> tuple[InitialRequest, ...]:
    """The observed start state with each request on its worker's new position."""
    return tuple(dataclasses.replace(r, worker=int(order[r.worker])) for r in initial)


def relabelled(
    initial: tuple[InitialRequest, ...], capacity: tuple[int, ...], seed: int
) -> tuple[tuple[InitialRequest, ...], tuple[int, ...]]:
    """The same fleet with its workers in a shuffled order: every window metric is blind
    to the labels, but a rule's index tie-breaks (and Round-Robin's start) are not, so
    this is the A/A draw of a deterministic incumbent."""
    order = worker_order(len(capacity), seed)
    slots = [0] * len(capacity)
    for old, new in enumerate(order):
        slots[int(new)] = capacity[old]
    return moved_to(initial, order), tuple(slots)


def jitter_step_s(observed: dict[str, float], fallback_ms: float) -> float:
    """How late the A/A draw may make an arrival: one observed step (s), or `fallback_ms`
    where no step was observed."""
    step = observed.get("step_ms_mean", math.nan)
    return (step if step > 0 else fallback_ms) / 1000.0


def jittered(arrivals: Workload, step_s: float, seed: int) -> Workload:
    """The same requests, each ready up to one step later (seeded): which round first
    sees a request moves, what it asks for does not."""
    delay = np.random.default_rng(seed).uniform(0.0, step_s, len(arrivals))
    return Workload.from_arrays(
        arrivals.name, arrivals.ready_s + delay, arrivals.prompt_tokens,
        arrivals.output_tokens, arrivals.prompt_keys,
    )  # fmt: skip
