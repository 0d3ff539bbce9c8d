"""The pool baselines: `random`, `rr`, `jsq-pool`, `p2c`, `ltl`. They hold work in the
prompt pool, take it in ready order, one request at a time, and see every earlier
admission of the same round. The routers that dispatch on arrival into worker queues
(`jsq`, `ascend-proxy`, `vllm-dplb`, ...) are in `shadow.policies.queued`."""

from __future__ import annotations

import random as _random
from abc import abstractmethod

import numpy as np

from shadow.policies.base import Policy
from shadow.policies.registry import register_policy
from shadow.policies.snapshot import Admission, FleetSnapshot, ReadyPool


class SlotFillingPolicy(Policy):
    """A baseline that fills free slots from the head of the pool, one request at a time."""

    reads_active = False

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        free = snapshot.free_slots.tolist()
        count = snapshot.active_count.tolist()
        load = snapshot.load.tolist()
        prompts = pool.prompt_tokens.tolist()
        admissions: list[Admission] = []
        for i in range(min(len(pool), sum(free))):
            g = self.choose(free, count, load, prompts[i])
            free[g] -= 1
            count[g] += 1
            load[g] += prompts[i]
            admissions.append(Admission(pool.request_ids[i], snapshot.worker_ids[g]))
        return admissions

    @abstractmethod
    def choose(self, free: list[int], count: list[int], load: list[int], prompt: int) -> int:
        """Index of the worker for the next request; at least one worker has a free slot."""


@register_policy("random")
class RandomPolicy(SlotFillingPolicy):
    """Uniform among workers with a free slot."""

    reads_active = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = _random.Random(seed)

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        """`choose`'s picks, with the open workers kept across the round instead of listed
        again for every request (O(G) each: at G = 256 most of a replay's Random round)."""
        free = snapshot.free_slots.tolist()
        open_workers = [g for g, slots in enumerate(free) if slots > 0]
        ids, requests = snapshot.worker_ids, pool.request_ids
        admissions: list[Admission] = []
        for i in range(min(len(pool), sum(free))):  # as `SlotFillingPolicy.admit`
            g = self._rng.choice(open_workers)  # the list `choose` would make, same order
            free[g] -= 1
            if free[g] == 0:
                open_workers.remove(g)
            admissions.append(Admission(requests[i], ids[g]))
        return admissions

    def choose(self, free: list[int], count: list[int], load: list[int], prompt: int) -> int:
        return self._rng.choice([g for g, slots in enumerate(free) if slots > 0])


@register_policy("rr")
class RoundRobinPolicy(SlotFillingPolicy):
    """Round robin over workers with a free slot; the cursor persists across rounds."""

    reads_active = False

    def __init__(self, seed: int = 0) -> None:
        self._cursor = 0

    def choose(self, free: list[int], count: list[int], load: list[int], prompt: int) -> int:
        workers = len(free)
        for step in range(workers):
            g = (self._cursor + step) % workers
            if free[g] > 0:
                self._cursor = (g + 1) % workers
                return g
        raise AssertionError("choose called with no free slot")


@register_policy("jsq-pool")
class JoinShortestQueuePolicy(SlotFillingPolicy):
    """Fewest active requests among workers with a free slot, ties to the lowest index:
    the first round's `jsq`, and the emulated world's router, which holds a pool.

    `random_ties` breaks ties at random instead (seeded): the A/A replay, which shows how
    much a window's metrics move on arbitrary choices alone."""

    reads_active = False

    def __init__(self, seed: int = 0, random_ties: bool = False) -> None:
        self._rng = _random.Random(seed) if random_ties else None

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        """`choose`'s picks on arrays: a closed worker's key is past every count, so the
        first minimum is the lowest-index open worker with the fewest requests (at
        G = 256 a scan in Python per request was most of a replay's and an audit's JSQ)."""
        free = snapshot.free_slots.astype(np.int64)
        count = snapshot.active_count.astype(np.int64)
        closed = np.iinfo(np.int64).max
        key = np.where(free > 0, count, closed)
        ids, requests = snapshot.worker_ids, pool.request_ids
        admissions: list[Admission] = []
        for i in range(min(len(pool), int(free.sum()))):  # as `SlotFillingPolicy.admit`
            if self._rng is None:
                g = int(key.argmin())
            else:  # the ties `choose` would list, in the same order
                g = self._rng.choice(np.flatnonzero(key == key.min()).tolist())
            free[g] -= 1
            count[g] += 1
            key[g] = count[g] if free[g] > 0 else closed
            admissions.append(Admission(requests[i], ids[g]))
        return admissions

    def choose(self, free: list[int], count: list[int], load: list[int], prompt: int) -> int:
        fewest = min(c for g, c in enumerate(count) if free[g] > 0)
        if self._rng is None:
            return next(g for g, c in enumerate(count) if c == fewest and free[g] > 0)
        return self._rng.choice([g for g, c in enumerate(count) if c == fewest and free[g] > 0])


@register_policy("p2c")
class PowerOfTwoPolicy(SlotFillingPolicy):
    """Two random workers with a free slot; the one with fewer active requests."""

    reads_active = False

    def __init__(self, seed: int = 0) -> None:
        self._rng = _random.Random(seed)

    def choose(self, free: list[int], count: list[int], load: list[int], prompt: int) -> int:
        open_workers = [g for g, slots in enumerate(free) if slots > 0]
        if len(open_workers) == 1:
            return open_workers[0]
        a, b = self._rng.sample(open_workers, 2)
        return min((count[a], a), (count[b], b))[1]


@register_policy("ltl")
class LeastTokenLoadPolicy(SlotFillingPolicy):
    """Lowest KV load `L_g`, ties to the lowest index (or at random, seeded: A/A)."""

    reads_active = False

    def __init__(self, seed: int = 0, random_ties: bool = False) -> None:
        self._rng = _random.Random(seed) if random_ties else None

    def choose(self, free: list[int], count: list[int], load: list[int], prompt: int) -> int:
        lowest = min(tokens for g, tokens in enumerate(load) if free[g] > 0)
        ties = [g for g, tokens in enumerate(load) if tokens == lowest and free[g] > 0]
        return ties[0] if self._rng is None else self._rng.choice(ties)
