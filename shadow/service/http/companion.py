"""A companion the service starts beside itself and stops with it, without knowing what it
is: `shadow serve --demo` passes the emulated world (`shadow.world`) this way, so the
production service never imports the world."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from shadow.service.ingest.pipeline import Pipeline


class CompanionAddresses(Protocol):
    """Where the companion listens: `GET /v1/demo` answers these; the service scrapes the
    engines in `workers` (worker id -> base URL)."""

    router: str
    tap: str
    workers: dict[str, str]


class Companion(Protocol):
    """Started once the service's pipeline is up (blocking; run off the event loop), and
    stopped before the service closes."""

    def start(self, pipeline: Pipeline) -> CompanionAddresses: ...

    def stop(self) -> None: ...
