"""How well a predictor separates requests that finish within the horizon from those that
do not (AUC), and how far its contribution is from the truth (MAE, in steps).

Scored at several ages of each completed request (every `age_stride` tokens), because a
predictor is asked about a request at every age while it decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shadow.predict.active import NO_KEY, ActiveSet
from shadow.predict.predictors import Predictor


@dataclass(frozen=True)
class Calibration:
    predictor: str
    horizon: int
    auc: float
    mae_steps: float
    samples: int


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged); NaN when one class is empty."""
    labels = np.asarray(labels, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    positives = int(labels.sum())
    negatives = labels.shape[0] - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    average_rank = ends - (counts - 1) / 2.0
    rank_sum = average_rank[inverse][labels].sum()
    return float((rank_sum - positives * (positives + 1) / 2.0) / (positives * negatives))


def ages_of(output_tokens: np.ndarray, age_stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Row index and age for every age `0, stride, 2*stride, ... < o_i` of every request."""
    outputs = np.asarray(output_tokens, dtype=np.int64)
    per_request = (outputs + age_stride - 1) // age_stride
    rows = np.repeat(np.arange(outputs.shape[0]), per_request)
    starts = np.cumsum(per_request) - per_request
    ages = (np.arange(rows.shape[0]) - np.repeat(starts, per_request)) * age_stride
    return rows, ages


def _scored(
    predictor: Predictor, outputs: np.ndarray, keys: np.ndarray, horizon: int, age_stride: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per scored age: finishes within H, P(finish), predicted and true contribution."""
    rows, ages = ages_of(outputs, age_stride)
    remaining = outputs[rows] - ages
    active = ActiveSet.from_arrays(
        np.zeros(rows.shape[0], dtype=np.int64),
        np.zeros(rows.shape[0], dtype=np.int64),
        ages,
        keys[rows],
        remaining,
    )
    prediction = predictor.predict(active, horizon)
    truth = np.minimum(remaining, horizon + 1)
    return remaining <= horizon, prediction.finish_probability, prediction.contribution, truth


def _columns(
    output_tokens: np.ndarray, prompt_keys: np.ndarray | None, age_stride: int
) -> tuple[np.ndarray, np.ndarray]:
    if age_stride < 1:
        raise ValueError("age_stride must be >= 1")
    outputs = np.asarray(output_tokens, dtype=np.int64)
    if outputs.size and outputs.min() < 1:
        raise ValueError("output_tokens must be >= 1")
    keys = (
        np.full(outputs.shape[0], NO_KEY, dtype=np.int64)
        if prompt_keys is None
        else np.asarray(prompt_keys, dtype=np.int64)
    )
    return outputs, keys


def _calibration(
    name: str, horizon: int, parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
) -> Calibration:
    finishes, probability, contribution, truth = (
        np.concatenate([p[i] for p in parts]) if parts else np.empty(0) for i in range(4)
    )
    mae = float(np.abs(contribution - truth).mean()) if truth.size else float("nan")
    return Calibration(
        name, horizon, roc_auc(finishes.astype(bool), probability), mae, int(truth.shape[0])
    )


def calibrate(
    predictor: Predictor,
    output_tokens: np.ndarray,
    prompt_keys: np.ndarray | None = None,
    horizon: int = 80,
    age_stride: int = 16,
) -> Calibration:
    """Score `predictor` on completed requests (their true output lengths and keys)."""
    outputs, keys = _columns(output_tokens, prompt_keys, age_stride)
    return _calibration(
        predictor.name, horizon, [_scored(predictor, outputs, keys, horizon, age_stride)]
    )


def prequential_calibrate(
    predictor: Predictor,
    output_tokens: np.ndarray,
    prompt_keys: np.ndarray | None = None,
    horizon: int = 80,
    age_stride: int = 16,
    chunk: int = 64,
) -> Calibration:
    """Score `predictor` as it is used: requests in completion order, each scored before
    the predictor learns its outcome (it learns a chunk of `chunk` after scoring it).

    In-sample scoring lets a predictor that memorises (ExactMatch) grade its own answers;
    scored first, it is judged on what it knew when it was asked.
    """
    if chunk < 1:
        raise ValueError("chunk must be >= 1")
    outputs, keys = _columns(output_tokens, prompt_keys, age_stride)
    parts = []
    for start in range(0, outputs.shape[0], chunk):
        part_outputs, part_keys = outputs[start : start + chunk], keys[start : start + chunk]
        parts.append(_scored(predictor, part_outputs, part_keys, horizon, age_stride))
        predictor.observe_many(part_outputs, part_keys)
    return _calibration(predictor.name, horizon, parts)
