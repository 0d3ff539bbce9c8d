"""The active requests of a fleet, one row each: what an output-length predictor reads,
and the part of a routing policy's snapshot (`shadow.policies.snapshot`) behind each
worker's load. Kept here, below the policies, because BR-H's policies hold predictors:
the predictors read this and no policy module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

#: Stands for "no prompt key" in the int64 key columns.
NO_KEY = np.iinfo(np.int64).min


def prompt_key_id(key: Hashable | None) -> int:
    """Map a prompt key (hash string, template name, int) to a stable int64.

    Stable across processes (unlike `hash()`), so a key recorded today matches the same
    key replayed tomorrow.
    """
    if key is None:
        return int(NO_KEY)
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        value = int(key)
        if value == NO_KEY or not (-(2**63) <= value < 2**63):
            raise ValueError(f"prompt_key {value} is out of the int64 range or reserved")
        return value
    digest = hashlib.blake2b(str(key).encode(), digest_size=8).digest()
    value = int.from_bytes(digest, "little", signed=True)
    return value if value != NO_KEY else value + 1


def int_column(name: str, values: object, length: int | None = None) -> np.ndarray:
    """`values` as a one-dimensional int64 column of `length` rows, or a ValueError naming
    the column."""
    array = np.asarray(values, dtype=np.int64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if length is not None and array.shape[0] != length:
        raise ValueError(f"{name} has {array.shape[0]} rows, expected {length}")
    return array


@dataclass(frozen=True)
class ActiveSet:
    """Every active request of a fleet, one row each; `worker` indexes the snapshot's workers."""

    worker: np.ndarray
    prompt_tokens: np.ndarray
    generated: np.ndarray
    prompt_keys: np.ndarray
    remaining: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.worker.shape[0])

    @classmethod
    def from_arrays(
        cls,
        worker: object,
        prompt_tokens: object,
        generated: object,
        prompt_keys: object | None = None,
        remaining: object | None = None,
    ) -> ActiveSet:
        worker_col = int_column("worker", worker)
        n = worker_col.shape[0]
        prompt_col = int_column("prompt_tokens", prompt_tokens, n)
        generated_col = int_column("generated", generated, n)
        if n and (prompt_col.min() < 0 or generated_col.min() < 0):
            raise ValueError("prompt_tokens and generated must be >= 0")
        keys = (
            np.full(n, NO_KEY, dtype=np.int64)
            if prompt_keys is None
            else int_column("prompt_keys", prompt_keys, n)
        )
        remaining_col = None
        if remaining is not None:
            remaining_col = int_column("remaining", remaining, n)
            if n and remaining_col.min() < 1:
                raise ValueError("remaining must be >= 1 for an active request")
        return cls(worker_col, prompt_col, generated_col, keys, remaining_col)

    @classmethod
    def empty(cls) -> ActiveSet:
        return cls.from_arrays([], [], [])
