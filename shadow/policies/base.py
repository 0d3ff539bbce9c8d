"""The one interface every routing policy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from shadow.policies.snapshot import Admission, FleetSnapshot, ReadyPool


class Policy(ABC):
    """An admission round: given the fleet snapshot and the pool in ready order, decide.

    Pure: no I/O, no globals. Policies that draw random numbers own a generator seeded at
    construction, so a policy given the same seed and the same rounds decides the same.
    """

    name: ClassVar[str]
    #: True for policies that place every request on arrival into per-worker queues
    #: (`vllm-dplb`) instead of admitting into free slots from a central pool.
    dispatches_on_arrival: ClassVar[bool] = False

    @abstractmethod
    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        """The admissions of one round, in the order they were decided."""
