"""`POST /v1/route`: where to send ready requests, by the fleet's mode.

`live`: the promoted policy decides on the mirror. `fallback` / `latched`: Round-Robin
over the workers that are up (it needs no load telemetry, so it cannot be misled by it).
`shadow`: the incumbent router decides; the answer says so. In `live`, a policy exception,
a decision slower than its budget, or stale telemetry answers that very request with
Round-Robin and trips the fleet to `fallback` (GATE.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shadow.modes import Mode, ModeConfig, ModeStore, trip_now
from shadow.policies import Policy, ReadyPool, make_policy, prompt_key_id
from shadow.service.ingest.pipeline import Pipeline


@dataclass(frozen=True)
class RouteRequest:
    request_id: str
    prompt_tokens: int
    prompt_hash: str | None = None


@dataclass
class RouteAnswer:
    fleet: str
    mode: str
    policy: str | None
    decisions: list[dict[str, str]] = field(default_factory=list)
    detail: str = ""
    latency_ms: float | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "fleet": self.fleet,
            "mode": self.mode,
            "policy": self.policy,
            "decisions": self.decisions,
            "detail": self.detail,
            "latency_ms": self.latency_ms,
        }


class LiveRouter:
    def __init__(
        self,
        pipeline: Pipeline,
        modes: ModeStore,
        *,
        budget_ms: float = 5.0,
        stale: Callable[[str], bool] | None = None,
        mode_config: ModeConfig | None = None,
    ) -> None:
        """`stale(fleet)` says whether the fleet's telemetry is too old to route on."""
        self.pipeline = pipeline
        self.modes = modes
        self.budget_ms = budget_ms
        self.mode_config = mode_config or ModeConfig()
        self.stale = stale or (lambda fleet: False)
        self._policies: dict[tuple[str, str], Policy] = {}
        self._cursor: dict[str, int] = {}
        #: a test seam: called before the policy decides (raise to inject a policy fault)
        self.before_decide: Callable[[str], None] | None = None
        #: a Prometheus histogram of decision times, by policy (set by the service)
        self.latency: Any = None

    def _policy(self, fleet: str, name: str) -> Policy:
        key = (fleet, name)
        policy = self._policies.get(key)
        if policy is None:
            state = self.pipeline.fleets.get(fleet)
            predictor = state.mirror.predictor if state and name == "brh-survival" else None
            policy = self._policies[key] = make_policy(name, predictor=predictor)
        return policy

    def _round_robin(self, fleet: str, requests: Sequence[RouteRequest]) -> list[dict[str, str]]:
        state = self.pipeline.fleets.get(fleet)
        workers = [w.worker_id for w in state.mirror.order if w.accepting] if state else []
        if not workers:
            return []
        cursor = self._cursor.get(fleet, 0)
        decisions = []
        for request in requests:
            decisions.append(
                {"request_id": request.request_id, "worker": workers[cursor % len(workers)]}
            )
            cursor += 1
        self._cursor[fleet] = cursor % len(workers)
        return decisions

    def _trip(self, fleet: str, reason: str) -> str:
        self.modes.apply(fleet, trip_now, reason, actor="route", cfg=self.mode_config)
        return self.modes.get(fleet).mode.value

    def route(self, fleet: str, requests: Sequence[RouteRequest]) -> RouteAnswer:
        mode = self.modes.get(fleet)
        if mode.mode == Mode.SHADOW:
            return RouteAnswer(
                fleet, mode.mode.value, None,
                detail="fleet is in shadow mode: the incumbent router decides",
            )  # fmt: skip
        if mode.mode in (Mode.FALLBACK, Mode.LATCHED):
            return RouteAnswer(
                fleet, mode.mode.value, "rr", self._round_robin(fleet, requests),
                detail=f"{mode.mode.value}: Round-Robin answers",
            )  # fmt: skip
        name = mode.policy or "brh-survival"
        if self.stale(fleet):
            now_mode = self._trip(fleet, "stale telemetry")
            return RouteAnswer(
                fleet, now_mode, "rr", self._round_robin(fleet, requests),
                detail="telemetry is stale: Round-Robin answered and the fleet tripped",
            )  # fmt: skip
        started = time.perf_counter()
        try:
            with self.pipeline.lock:
                state = self.pipeline.fleets.get(fleet)
                if state is None:
                    raise LookupError(f"no events seen for fleet {fleet!r}")
                if self.before_decide is not None:
                    self.before_decide(fleet)
                snapshot = state.mirror.snapshot()
                pool = ReadyPool(
                    [r.request_id for r in requests],
                    np.array([r.prompt_tokens for r in requests], dtype=np.int64),
                    np.array([prompt_key_id(r.prompt_hash) for r in requests], dtype=np.int64),
                )
                admissions = self._policy(fleet, name).admit(snapshot, pool)
        except Exception as error:  # any policy fault: the request must still be routed
            now_mode = self._trip(fleet, f"policy exception: {type(error).__name__}: {error}")
            return RouteAnswer(
                fleet, now_mode, "rr", self._round_robin(fleet, requests),
                detail=f"{name} raised {type(error).__name__}: Round-Robin answered and the "
                "fleet tripped",
            )  # fmt: skip
        elapsed = (time.perf_counter() - started) * 1000.0
        if self.latency is not None:
            self.latency.labels(policy=name).observe(elapsed / 1000.0)
        if elapsed > self.budget_ms:
            now_mode = self._trip(
                fleet, f"decision took {elapsed:.2f} ms > budget {self.budget_ms:g} ms"
            )
            return RouteAnswer(
                fleet, now_mode, "rr", self._round_robin(fleet, requests),
                detail=f"{name} was too slow: Round-Robin answered and the fleet tripped",
                latency_ms=elapsed,
            )  # fmt: skip
        decided = {a.request_id for a in admissions}
        decisions = [{"request_id": str(a.request_id), "worker": str(a.worker)} for a in admissions]
        waiting = [r.request_id for r in requests if r.request_id not in decided]
        return RouteAnswer(
            fleet, Mode.LIVE.value, name, decisions,
            detail=f"no free slot yet for {len(waiting)} request(s)" if waiting else "",
            latency_ms=elapsed,
        )  # fmt: skip
