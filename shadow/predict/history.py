"""Completed output lengths, grouped and kept sorted, so that the conditional expectations
BR-H needs are a few binary searches per request, vectorised over the active set.

Each sample is packed as `group * STRIDE + length` in one sorted int64 array with a
prefix sum of lengths. New samples are merged in by insertion (O(N)), never by a full
re-sort, because the replay learns after nearly every step.
"""

from __future__ import annotations

import numpy as np

STRIDE = 1 << 32


class LengthHistory:
    """Empirical output-length distributions, one per integer group."""

    def __init__(self) -> None:
        self._packed = np.empty(0, dtype=np.int64)
        self._prefix = np.zeros(1, dtype=np.float64)
        self._pending: list[np.ndarray] = []

    def __len__(self) -> int:
        self._flush()
        return int(self._packed.shape[0])

    def add(self, groups: np.ndarray, lengths: np.ndarray) -> None:
        groups = np.asarray(groups, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if lengths.size and (lengths.min() < 1 or lengths.max() >= STRIDE):
            raise ValueError(f"output lengths must be in 1..{STRIDE - 1}")
        if groups.size and groups.min() < 0:
            raise ValueError("groups must be >= 0")
        self._pending.append(groups * STRIDE + lengths)

    def _flush(self) -> None:
        if not self._pending:
            return
        new = np.sort(np.concatenate(self._pending))
        self._pending.clear()
        self._packed = np.insert(self._packed, np.searchsorted(self._packed, new), new)
        lengths = self._packed & (STRIDE - 1)
        self._prefix = np.concatenate(([0.0], np.cumsum(lengths, dtype=np.float64)))

    def conditional(
        self, groups: np.ndarray, ages: np.ndarray, horizon: int
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For requests that have generated `ages` tokens and are still running:

        - `contribution = E[min(O - a, H + 1) | O > a]`, the expected number of the next
          `H + 1` steps in which the request is still decoding;
        - `finish_probability = P(O - a <= H | O > a)`;
        - `survivors`: how many samples of the group exceed `a` (0 means no evidence).
        Where `survivors == 0` the contribution is `H + 1` and the probability 0.
        """
        self._flush()
        ages = np.asarray(ages, dtype=np.int64)
        base = np.asarray(groups, dtype=np.int64) * STRIDE
        packed = self._packed
        alive_from = np.searchsorted(packed, base + ages, side="right")
        beyond = np.searchsorted(packed, base + ages + horizon, side="right")
        group_end = np.searchsorted(packed, base + STRIDE, side="left")
        survivors = group_end - alive_from
        finishing = beyond - alive_from
        short_steps = self._prefix[beyond] - self._prefix[alive_from] - ages * finishing
        total = short_steps + (horizon + 1) * (group_end - beyond)
        with np.errstate(divide="ignore", invalid="ignore"):
            contribution = np.where(survivors > 0, total / survivors, float(horizon + 1))
            finish = np.where(survivors > 0, finishing / survivors, 0.0)
        return contribution, finish, survivors
