"""The emulated world as the service's companion (`shadow serve --demo`): the service
starts and stops it through `shadow.service.http.companion.Companion` and never imports
the world itself."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shadow.world.demo import DemoPlan, DemoProcess, abandon_previous_world

if TYPE_CHECKING:
    from shadow.service.ingest.pipeline import Pipeline
    from shadow.service.settings import ServiceSettings
    from shadow.world.assembly import WorldAddresses


class DemoCompanion:
    """Runs the demo world in its child process for the service's lifetime."""

    def __init__(self, plan: DemoPlan) -> None:
        self.plan = plan
        self._process: DemoProcess | None = None

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> DemoCompanion:
        """The plan from the service's settings: the one place the demo reads them."""
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        return cls(
            DemoPlan(
                f"http://{host}:{settings.port}", settings.demo_workers, settings.demo_batch,
                settings.demo_time_scale, settings.demo_load, settings.fleet,
            )
        )  # fmt: skip

    def start(self, pipeline: Pipeline) -> WorldAddresses:
        """Let go of an earlier demo's requests, then start the world; its addresses."""
        abandon_previous_world(pipeline, self.plan.fleet)
        self._process = DemoProcess(self.plan)
        return self._process.start()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
