"""Predictors of how long active requests keep decoding, for BR-H's projection.

Each returns, per active request, `c_i = E[min(r_i, H + 1)]` (the expected number of the
next `H + 1` steps in which it still decodes; `r_i` its remaining steps) and the chance
that it finishes within the horizon (`r_i <= H`), and learns from completed requests
incrementally.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from shadow.predict.active import NO_KEY, ActiveSet, prompt_key_id
from shadow.predict.history import LengthHistory


@dataclass(frozen=True)
class Prediction:
    """Per active request: expected alive steps in the horizon, and P(finish within it)."""

    contribution: np.ndarray
    finish_probability: np.ndarray


class Predictor(ABC):
    """Learns from completed requests; predicts for active ones."""

    name: ClassVar[str]

    def observe(self, output_tokens: int, prompt_key: object | None = None) -> None:
        """Learn one completed request."""
        self.observe_many(np.array([output_tokens]), np.array([prompt_key_id(prompt_key)]))

    @abstractmethod
    def observe_many(
        self, output_tokens: np.ndarray, prompt_keys: np.ndarray | None = None
    ) -> None:
        """Learn completed requests; `prompt_keys` are int64 key ids (`NO_KEY` for none)."""

    @abstractmethod
    def predict(self, active: ActiveSet, horizon: int) -> Prediction:
        """Predict for every row of `active`."""


class SurvivalPredictor(Predictor):
    """Empirical survival of output lengths: `c = sum_{h=0..H} P(O > a + h | O > a)`.

    With one distribution for every request, two arrays over lengths answer every age:
    the survivor counts `N(x)` and their prefix sums, rebuilt (two cumulative sums) only
    when new completions arrived; a prediction is then a few lookups per request.
    """

    name = "survival"

    def __init__(self) -> None:
        self._counts = np.zeros(1, dtype=np.int64)
        self._table_cache: tuple[np.ndarray, np.ndarray] | None = None
        #: raised by every observation: predictions made at one version hold until the next
        self.version = 0

    def __len__(self) -> int:
        return int(self._counts.sum())

    def observe(self, output_tokens: int, prompt_key: object | None = None) -> None:
        """Learn one completion without building arrays: the mirror learns one per
        finish, and the arrays of `observe_many` cost ~20 us where this costs ~1."""
        length = int(output_tokens)
        if length < 1:
            raise ValueError("output lengths must be >= 1")
        self._grow(length)
        self._counts[length] += 1
        self._table_cache = None
        self.version += 1

    def _grow(self, longest: int) -> None:
        """Room in the histogram for outputs of `longest` tokens."""
        if longest >= self._counts.shape[0]:
            self._counts = np.concatenate(
                (self._counts, np.zeros(longest + 1 - self._counts.shape[0], dtype=np.int64))
            )

    def observe_many(
        self, output_tokens: np.ndarray, prompt_keys: np.ndarray | None = None
    ) -> None:
        lengths = np.asarray(output_tokens, dtype=np.int64)
        if not lengths.size:
            return
        if lengths.min() < 1:
            raise ValueError("output lengths must be >= 1")
        self._grow(int(lengths.max()))
        np.add.at(self._counts, lengths, 1)
        self._table_cache = None
        self.version += 1

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        """`N(x) = #(O > x)` for `x = 0..longest` and one zero past it (as float), and
        its prefix sums. Built once per change of the histogram: a prediction is then
        gathers only (the audit predicts on every dispatch)."""
        if self._table_cache is None:
            survivors = np.zeros(self._counts.shape[0] + 1, dtype=np.float64)
            survivors[:-1] = self._counts.sum() - np.cumsum(self._counts)
            running = np.empty(survivors.shape[0], dtype=np.float64)
            running[0] = 0.0
            np.cumsum(survivors[:-1], out=running[1:])
            self._table_cache = (survivors, running)
        return self._table_cache

    def predict(self, active: ActiveSet, horizon: int) -> Prediction:
        survivors, running = self._table()
        last = survivors.shape[0] - 2
        ages = np.minimum(active.generated, last + 1)
        alive = survivors[ages]
        # sum_{h=0..H} N(a + h): prefix sums, with N = 0 past the longest output.
        upto = np.minimum(ages + horizon + 1, last + 1)
        total = running[upto] - running[ages]
        at_horizon = survivors[np.minimum(ages + horizon, last + 1)]
        with np.errstate(divide="ignore", invalid="ignore"):
            contribution = np.where(alive > 0, total / alive, horizon + 1.0)
            finish = np.where(alive > 0, 1.0 - at_horizon / alive, 0.0)
        return Prediction(contribution, finish)


class ExactMatchPredictor(Predictor):
    """Survival per prompt key once its bucket holds `min_samples` completions.

    Otherwise, and (choice) when no completion of the bucket outlived the request's age,
    it falls back to the Survival predictor trained on every completion.
    """

    name = "exactmatch"

    def __init__(self, min_samples: int = 3) -> None:
        if min_samples < 1:
            raise ValueError("min_samples must be >= 1")
        self.min_samples = min_samples
        self._fallback = SurvivalPredictor()
        self._keyed = LengthHistory()
        self._group_of: dict[int, int] = {}
        self._sorted_keys = np.empty(0, dtype=np.int64)
        self._sorted_groups = np.empty(0, dtype=np.int64)
        self._counts = np.zeros(0, dtype=np.int64)

    def observe_many(
        self, output_tokens: np.ndarray, prompt_keys: np.ndarray | None = None
    ) -> None:
        lengths = np.asarray(output_tokens, dtype=np.int64)
        self._fallback.observe_many(lengths)
        if prompt_keys is None:
            return
        keys = np.asarray(prompt_keys, dtype=np.int64)
        keyed = keys != NO_KEY
        if not keyed.any():
            return
        keys, lengths = keys[keyed], lengths[keyed]
        groups = np.fromiter((self._group(int(k)) for k in keys), np.int64, keys.shape[0])
        self._keyed.add(groups, lengths)
        np.add.at(self._counts, groups, 1)

    def _group(self, key: int) -> int:
        group = self._group_of.get(key)
        if group is None:
            group = len(self._group_of)
            self._group_of[key] = group
            at = int(np.searchsorted(self._sorted_keys, key))
            self._sorted_keys = np.insert(self._sorted_keys, at, key)
            self._sorted_groups = np.insert(self._sorted_groups, at, group)
            self._counts = np.append(self._counts, 0)
        return group

    def groups_of(self, keys: np.ndarray) -> np.ndarray:
        """Group id per key, -1 for keys never seen."""
        keys = np.asarray(keys, dtype=np.int64)
        if not self._sorted_keys.size:
            return np.full(keys.shape[0], -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(self._sorted_keys, keys), self._sorted_keys.size - 1)
        found = self._sorted_keys[at] == keys
        return np.where(found, self._sorted_groups[at], -1)

    def predict(self, active: ActiveSet, horizon: int) -> Prediction:
        prediction = self._fallback.predict(active, horizon)
        groups = self.groups_of(active.prompt_keys)
        known = groups >= 0
        qualified = np.zeros(len(active), dtype=bool)
        qualified[known] = self._counts[groups[known]] >= self.min_samples
        if not qualified.any():
            return prediction
        rows = np.flatnonzero(qualified)
        contribution, finish, survivors = self._keyed.conditional(
            groups[rows], active.generated[rows], horizon
        )
        use = survivors > 0
        out_c = prediction.contribution.copy()
        out_p = prediction.finish_probability.copy()
        out_c[rows[use]] = contribution[use]
        out_p[rows[use]] = finish[use]
        return Prediction(out_c, out_p)


class OraclePredictor(Predictor):
    """The true remaining length: replay only, the upper bound of what prediction is worth."""

    name = "oracle"

    def observe_many(
        self, output_tokens: np.ndarray, prompt_keys: np.ndarray | None = None
    ) -> None:
        """Nothing to learn: the oracle already knows."""

    def predict(self, active: ActiveSet, horizon: int) -> Prediction:
        if active.remaining is None:
            raise ValueError(
                "the oracle predictor needs the true remaining length of every active request "
                "(ActiveSet.remaining); it exists only in replay"
            )
        remaining = active.remaining
        return Prediction(
            np.minimum(remaining, horizon + 1).astype(np.float64),
            (remaining <= horizon).astype(np.float64),
        )


PREDICTORS: dict[str, type[Predictor]] = {
    cls.name: cls for cls in (SurvivalPredictor, ExactMatchPredictor, OraclePredictor)
}


def make_predictor(name: str, **options: object) -> Predictor:
    """Build a predictor by its registry name (`survival`, `exactmatch`, `oracle`)."""
    try:
        cls = PREDICTORS[name]
    except KeyError:
        raise ValueError(
            f"unknown predictor {name!r}; choose one of {', '.join(sorted(PREDICTORS))}"
        ) from None
    return cls(**options)  # type: ignore[arg-type]
