"""The one interface every routing policy implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from typing import ClassVar

from shadow.policies.snapshot import Admission, FleetSnapshot, ReadyPool


class HoldsWork(StrEnum):
    """How a router holds work it cannot start yet (BALANCEROUTE.md, "Baselines and other
    candidates"): the replay engine models both, so each policy says which is its own."""

    #: a ready request waits centrally until the policy assigns it to a free slot
    POOL = "pool"
    #: the router dispatches on arrival; a full worker queues the request in its own
    #: `waiting` and starts it FCFS when one of its own slots frees (sticky)
    WORKER_QUEUES = "worker-queues"


class Policy(ABC):
    """An admission round: given the fleet snapshot and the pool in ready order, decide.

    Pure: no I/O, no globals. Policies that draw random numbers own a generator seeded at
    construction, so a policy given the same seed and the same rounds decides the same.
    """

    name: ClassVar[str]
    #: how this router holds work: the engine runs a pool or per-worker queues for it
    holds_work: ClassVar[HoldsWork] = HoldsWork.POOL
    #: whether `admit` reads `snapshot.active`, the per-request rows; a class that never
    #: does says so itself (a subclass is presumed to read them until it says otherwise),
    #: and the replay then spares its rounds building them (a gather per column over
    #: every running request, in each of the continuous runs' hundreds of thousands of
    #: rounds)
    reads_active: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "reads_active" not in cls.__dict__:
            cls.reads_active = True

    @property
    def dispatches_on_arrival(self) -> bool:
        """True when every request is placed on arrival into a worker's queue (worker
        queues) instead of admitted into a free slot from a central pool."""
        return self.holds_work is HoldsWork.WORKER_QUEUES

    @abstractmethod
    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        """The admissions of one round, in the order they were decided."""
