"""The A/A run's draws: the incumbent against itself on differences no router could act
on, so the gate knows how far a window's metrics move on arbitrary choices alone.

`relabelled` shuffles the workers' order (index tie-breaks and Round-Robin's start fall
elsewhere; every window metric is blind to labels). `jittered` delays each arrival by up
to one step, for a rule with no ties left to draw (BR-0): only the round that first sees
a request moves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shadow.replay import InitialRequest
from shadow.replay.workload import Workload


def relabelled(
    initial: tuple[InitialRequest, ...], capacity: tuple[int, ...], seed: int
) -> tuple[tuple[InitialRequest, ...], tuple[int, ...]]:
    """The same fleet with its workers in a shuffled order: every window metric is blind
    to the labels, but a rule's index tie-breaks (and Round-Robin's start) are not, so
    this is the A/A draw of a deterministic incumbent."""
    order = np.random.default_rng(seed).permutation(len(capacity))  # new position of each
    slots = [0] * len(capacity)
    for old, new in enumerate(order):
        slots[int(new)] = capacity[old]
    moved = tuple(dataclasses.replace(r, worker=int(order[r.worker])) for r in initial)
    return moved, tuple(slots)


def jittered(arrivals: Workload, step_s: float, seed: int) -> Workload:
    """The same requests, each ready up to one step later (seeded): which round first
    sees a request moves, what it asks for does not."""
    delay = np.random.default_rng(seed).uniform(0.0, step_s, len(arrivals))
    return Workload.from_arrays(
        arrivals.name, arrivals.ready_s + delay, arrivals.prompt_tokens,
        arrivals.output_tokens, arrivals.prompt_keys,
    )  # fmt: skip
