"""What the HTTP handlers share, typed: the settings, and what the lifespan started (the
runtime, the mode store, the live router, the poller, the companion's addresses). Handlers
reach it through the `State` dependency instead of a closure."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from prometheus_client import CollectorRegistry

from shadow.connectors.poller import MetricsPoller
from shadow.modes import ModeStore
from shadow.service.http.companion import Companion, CompanionAddresses
from shadow.service.http.responses import clean
from shadow.service.http.routing import LiveRouter
from shadow.service.ingest.pipeline import FleetState
from shadow.service.runtime import Runtime
from shadow.service.settings import ServiceSettings
from shadow.service.store import ServiceStore


@dataclass
class Started:
    """What the lifespan builds before the first request."""

    runtime: Runtime
    modes: ModeStore
    router: LiveRouter
    registry: CollectorRegistry
    poller: MetricsPoller | None = None
    #: where the companion (the demo world) listens, if one runs
    companion: CompanionAddresses | None = None


@dataclass
class AppState:
    settings: ServiceSettings
    companion: Companion | None = None
    started: Started | None = None
    #: monotonic time of the last `POST /v1/events` (the idle flush waits for quiet)
    last_submit: float = 0.0
    #: requests refused by the bearer check, by status
    auth_denied: Counter[int] = field(default_factory=lambda: Counter({401: 0, 403: 0}))
    #: `POST /v1/events` bodies cut short by their sender's disconnect (nothing stored)
    ingest_disconnects: int = 0
    # One batch parsed and applied at a time. Both are pure Python, so parallel batches
    # only fight over the GIL, and mostly with the commit thread, whose DuckDB calls take
    # the GIL back many times a statement: with a single contender the commits keep up
    # (4 clients at 2,000-event batches: 37,500-38,700 events/s against 30,000-36,500).
    ingest_turn: threading.Lock = field(default_factory=threading.Lock)

    @property
    def running(self) -> Started:
        if self.started is None:
            raise RuntimeError("the service has not started (its lifespan did not run)")
        return self.started

    @property
    def runtime(self) -> Runtime:
        return self.running.runtime

    @property
    def modes(self) -> ModeStore:
        return self.running.modes

    @property
    def poller(self) -> MetricsPoller | None:
        return self.started.poller if self.started is not None else None

    def hit(self, bound: str) -> None:
        """Count a request refused for exceeding `bound` (`shadow_bound_hits_total`)."""
        self.runtime.pipeline.bound_hits[bound] += 1

    def fleet_state(self, fleet: str) -> FleetState:
        found = self.runtime.pipeline.fleets.get(fleet)
        if found is None:
            raise HTTPException(404, f"unknown fleet {fleet!r}")
        return found

    def fleet_stale(self, fleet: str) -> bool:
        """Whether the polled engines of `fleet` have gone quiet (the router trips on it)."""
        poller = self.poller
        if poller is None or fleet != self.settings.fleet:
            return False
        return any(status["stale"] for status in poller.status().values())

    def freshness(self, fleet: str) -> dict[str, Any]:
        """How fresh the fleet's engine telemetry is (the `telemetry` of `GET /v1/fleets`)."""
        poller = self.poller
        if poller is None or fleet != self.settings.fleet:
            return {"polling": False, "engines": 0, "stale": 0, "max_age_s": None}
        status = poller.status()
        ages = [s["age_s"] for s in status.values() if clean(s.get("age_s")) is not None]
        return {"polling": True, "engines": len(status),
                "stale": sum(1 for s in status.values() if s["stale"]),
                "max_age_s": max(ages) if ages else None}  # fmt: skip


async def app_state(request: Request) -> AppState:
    """The app's state (async: a sync dependency would cost a thread hop per request)."""
    return request.app.state.shadow


State = Annotated[AppState, Depends(app_state)]


async def service_store(state: State) -> ServiceStore:
    return state.runtime.store


Store = Annotated[ServiceStore, Depends(service_store)]
