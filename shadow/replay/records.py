"""The replay's plain data in and out: a request already decoding at the start, the
steps a run computed since it was last asked, and a whole run's result as arrays.

Apart from the engine so that consumers of results (metrics, the event writer, the
window worker's measurements) read them without the stepping code."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shadow.policies.snapshot import NO_KEY
from shadow.replay.workload import StepModel


@dataclass(frozen=True)
class InitialRequest:
    """A request already decoding when the replay starts (a window's observed start state)."""

    worker: int
    prompt_tokens: int
    generated: int
    remaining: int
    prompt_key: int = int(NO_KEY)


@dataclass(frozen=True)
class ReplayResult:
    """Everything one policy's replay produced, as plain arrays.

    Requests are indexed as in the workload, followed by the initial requests. Steps are
    numbered from 0; a request admitted before step `k` decodes steps `k .. finish_step`.
    Step ends are kept as computed (not start + duration) so that the end of one step is
    bit-for-bit the start of the next and the time of the admissions made there.
    """

    policy: str
    workers: int
    batch: int
    step_model: StepModel
    step_start_ms: np.ndarray
    step_end_ms: np.ndarray
    step_duration_ms: np.ndarray
    worker_load: np.ndarray
    worker_active: np.ndarray
    ready_ms: np.ndarray
    admit_ms: np.ndarray
    admit_step: np.ndarray
    finish_step: np.ndarray
    worker: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    from_initial: np.ndarray
    sched_ms: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.step_start_ms.shape[0])


ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class StepBlock:
    """Steps computed since the last `FleetReplay.take_steps()`, numbered from `first_step`."""

    first_step: int
    start_ms: np.ndarray
    end_ms: np.ndarray
    duration_ms: np.ndarray
    worker_load: np.ndarray
    worker_active: np.ndarray

    @property
    def steps(self) -> int:
        return int(self.start_ms.shape[0])
