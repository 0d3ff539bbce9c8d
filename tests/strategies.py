"""Hypothesis strategies for fleet snapshots and pools."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from shadow.policies import ActiveSet, FleetSnapshot, ReadyPool


@st.composite
def snapshots(draw, max_workers: int = 8, max_batch: int = 8, max_prompt: int = 5000):
    """A fleet of random size and load, with true remaining lengths (so the oracle works)."""
    workers = draw(st.integers(1, max_workers))
    capacity = draw(st.lists(st.integers(0, max_batch), min_size=workers, max_size=workers))
    rows = []
    for g, cap in enumerate(capacity):
        for _ in range(draw(st.integers(0, cap))):
            rows.append(
                (
                    g,
                    draw(st.integers(1, max_prompt)),
                    draw(st.integers(0, 300)),
                    draw(st.integers(1, 200)),
                    draw(st.integers(0, 3)),
                )
            )
    columns = list(zip(*rows, strict=True)) if rows else [[], [], [], [], []]
    active = ActiveSet.from_arrays(
        columns[0], columns[1], columns[2], prompt_keys=columns[4], remaining=columns[3]
    )
    return FleetSnapshot.from_active(capacity, active)


@st.composite
def pools(draw, max_size: int = 20, max_prompt: int = 8000):
    prompts = draw(st.lists(st.integers(0, max_prompt), min_size=0, max_size=max_size))
    keys = draw(st.lists(st.integers(0, 3), min_size=len(prompts), max_size=len(prompts)))
    return ReadyPool.from_arrays([f"r{i}" for i in range(len(prompts))], prompts, keys)


def trained(predictor, seed: int = 0, samples: int = 300):
    """Feed a predictor a history of output lengths (and keys 0..3)."""
    rng = np.random.default_rng(seed)
    predictor.observe_many(rng.integers(1, 250, samples), rng.integers(0, 4, samples))
    return predictor
