"""Which dispatches the decision audit audits when it cannot audit them all.

The audit runs beside ingest and must never hold it up. When its backlog grows, the
sampler audits one dispatch in every block of `stride` consecutive dispatches, at a
random position within the block: the sample is even in time (every block, so no time
window is left out) and cannot alias with an incumbent that cycles through the workers
(a fixed "every k-th" would audit one worker only under round-robin with k = G). The
stride doubles while the backlog stays high and halves back to 1 (every dispatch) when
it has drained; each skipped dispatch is counted, so the gate and the UI can say the
audited dispatches are a sample and of what.
"""

from __future__ import annotations

import random


class AuditSampler:
    """Per fleet: keep or skip each first dispatch; `stride` 1 keeps every one."""

    def __init__(self, max_stride: int = 64, seed: int = 0) -> None:
        if max_stride < 1:
            raise ValueError(f"max_stride must be >= 1, got {max_stride}")
        self.max_stride = max_stride
        self.stride = 1
        self.audited = 0
        self.skipped = 0
        self._wanted = 1
        self._position = 0
        self._pick = 0
        self._rng = random.Random(seed)

    def keep(self) -> bool:
        """Whether to audit the next dispatch (counted either way)."""
        if self._position == 0:  # a new block: the stride changes only between blocks
            self.stride = self._wanted
            self._pick = self._rng.randrange(self.stride) if self.stride > 1 else 0
        keep = self._position == self._pick
        self._position = (self._position + 1) % self.stride
        if keep:
            self.audited += 1
        else:
            self.skipped += 1
        return keep

    def adapt(self, backlog: int, high: int) -> None:
        """Double the stride while the audit's backlog is at `high` batches or more,
        halve it once the backlog is down to one batch (from the next block on)."""
        if backlog >= high:
            self._wanted = min(self.max_stride, self._wanted * 2)
        elif backlog <= 1:
            self._wanted = max(1, self._wanted // 2)

    @property
    def sampled_share(self) -> float:
        """Audited / (audited + skipped): 1.0 when nothing was skipped."""
        seen = self.audited + self.skipped
        return self.audited / seen if seen else 1.0
