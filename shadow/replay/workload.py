"""Requests to replay and the step-time model: the plain inputs of the replay engine."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shadow.policies.snapshot import NO_KEY


@dataclass(frozen=True)
class StepModel:
    """`T_step = a * max_g L_g + b` milliseconds.

    The default gives about 60 ms per step at full batch (B = 64) on the
    `paper-azure2024` preset (mean prompt 4,652, mean output 1,052: a full worker holds
    about 64 * (4652 + 526) = 331k KV tokens), with the fixed part `b` a third of it.
    """

    a_ms_per_token: float = 1.2e-4
    b_ms: float = 20.0

    def __post_init__(self) -> None:
        if self.a_ms_per_token < 0 or self.b_ms < 0:
            raise ValueError("step model a_ms_per_token and b_ms must be >= 0")
        if self.a_ms_per_token == 0 and self.b_ms == 0:
            raise ValueError("step model must take some time: a_ms_per_token or b_ms > 0")

    def step_ms(self, max_load: float) -> float:
        return self.a_ms_per_token * max_load + self.b_ms


@dataclass(frozen=True)
class Workload:
    """Requests sorted by ready time; `ready_s` in seconds from the start of the trace."""

    name: str
    ready_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    prompt_keys: np.ndarray

    def __post_init__(self) -> None:
        n = self.ready_s.shape[0]
        for field_name in ("prompt_tokens", "output_tokens", "prompt_keys"):
            if getattr(self, field_name).shape != (n,):
                raise ValueError(f"workload {field_name} has the wrong shape")
        if n and np.any(np.diff(self.ready_s) < 0):
            raise ValueError("workload ready_s must be sorted ascending")
        if n and (self.output_tokens.min() < 1 or self.prompt_tokens.min() < 0):
            raise ValueError("workload needs output_tokens >= 1 and prompt_tokens >= 0")

    def __len__(self) -> int:
        return int(self.ready_s.shape[0])

    @classmethod
    def from_arrays(
        cls,
        name: str,
        ready_s: object,
        prompt_tokens: object,
        output_tokens: object,
        prompt_keys: object | None = None,
    ) -> Workload:
        """Build a workload, sorting by ready time (stable, so equal times keep file order)."""
        ready = np.asarray(ready_s, dtype=np.float64)
        order = np.argsort(ready, kind="stable")
        keys = (
            np.full(ready.shape[0], NO_KEY, dtype=np.int64)
            if prompt_keys is None
            else np.asarray(prompt_keys, dtype=np.int64)
        )
        return cls(
            name,
            ready[order],
            np.asarray(prompt_tokens, dtype=np.int64)[order],
            np.asarray(output_tokens, dtype=np.int64)[order],
            keys[order],
        )

    def head(self, limit: int) -> Workload:
        return Workload(
            self.name,
            self.ready_s[:limit],
            self.prompt_tokens[:limit],
            self.output_tokens[:limit],
            self.prompt_keys[:limit],
        )
