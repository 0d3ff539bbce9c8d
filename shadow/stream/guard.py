"""A policy under guard for the window replays: a round that raises is counted and
answered by a fallback, as the live service answers it (Round-Robin), so one candidate's
bug neither stops the replay of a window nor loses that window for every other policy."""

from __future__ import annotations

from shadow.policies import Admission, FleetSnapshot, Policy, ReadyPool, make_policy


class GuardedPolicy(Policy):
    """`policy`'s rounds; one that raises is counted (`errors`, the first `error`) and
    answered by `fallback` (Round-Robin by default; JSQ with worker queues for a policy
    that dispatches on arrival)."""

    def __init__(self, policy: Policy, fallback: Policy | None = None) -> None:
        self.policy = policy
        self.name = policy.name  # type: ignore[misc]
        self.holds_work = policy.holds_work  # type: ignore[misc]
        # the fallback holds work the same way (a pool round cannot place into a full
        # fleet, where a worker-queue router must)
        default = "jsq" if policy.dispatches_on_arrival else "rr"
        self.fallback = fallback if fallback is not None else make_policy(default)
        self.reads_active = policy.reads_active or self.fallback.reads_active  # type: ignore[misc]
        #: the replay engine teaches the policy's own predictor, through the guard
        self.predictor = getattr(policy, "predictor", None)
        self.errors = 0
        self.error = ""

    def admit(self, snapshot: FleetSnapshot, pool: ReadyPool) -> list[Admission]:
        try:
            return self.policy.admit(snapshot, pool)
        except Exception as error:  # a candidate's bug is evidence, not a crash
            self.errors += 1
            if not self.error:
                self.error = f"{type(error).__name__}: {error}"[:500]
            return self.fallback.admit(snapshot, pool)
