"""What the ingest path is configured with and bounded by, and what one ingest call
answers: plain data, apart from the `Pipeline` that uses them, so that the settings and
the ingest path's parts (apply, audits, windows) import them without the pipeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shadow.events import EventError
from shadow.replay.workload import StepModel
from shadow.stream.audit import AuditConfig
from shadow.stream.invariants import InvariantConfig
from shadow.stream.windows import WindowConfig


@dataclass(frozen=True)
class PipelineConfig:
    """The ingest path. A field's `metadata` holds the bounds a configured value must meet
    (`ge`, `gt`, `le`, `lt`; the settings check them)."""

    reorder_window_s: float = field(default=2.0, metadata={"ge": 0})
    #: a fleet's events are released no further than its slowest live source's time
    #: (less the window); a source holds it for at most this long (wall time, counted
    #: while ingest goes on) after its last post (`source_clocks`)
    source_wait_s: float = field(default=3.0, metadata={"ge": 0})
    #: ... and not when it is this far (event time) behind its fleet's newest event
    source_max_lag_s: float = field(default=30.0, metadata={"ge": 0})
    seq_window: int = 1_000_000
    ghost_sweep_every_s: float = 5.0
    audit_enabled: bool = True
    #: audit an even sample of dispatches while the audit worker falls behind (its
    #: backlog at half of `max_audit_backlog`), instead of making ingest wait for it;
    #: off: every dispatch is audited (`stream.sampling`)
    audit_sampling: bool = False
    windows_enabled: bool = True
    step_fit_min_samples: int = 50
    default_step_model: StepModel = field(default_factory=StepModel)
    audit: AuditConfig = field(default_factory=AuditConfig)
    invariants: InvariantConfig = field(default_factory=InvariantConfig)
    windows: WindowConfig = field(default_factory=WindowConfig)
    limits: Limits = field(default_factory=lambda: Limits())


@dataclass(frozen=True)
class Limits:
    """Bounds on what one service instance holds; each hit is counted (`bound_hits`)."""

    #: events waiting in the reorder window; past it, everything buffered is applied now
    max_reorder_events: int = field(default=1_000_000, metadata={"ge": 1000})
    max_fleets: int = field(default=64, metadata={"ge": 1})
    max_workers_per_fleet: int = field(default=1024, metadata={"ge": 1})
    #: requests ready or running in one fleet; more `ready` events are rejected
    max_active_per_fleet: int = field(default=200_000, metadata={"ge": 1})
    #: dedupe memory of a finished request's progress is kept this long (fleet time)
    finished_ttl_s: float = field(default=300.0, metadata={"gt": 0})
    #: batches handed to the audit worker and not audited yet; past it, ingest waits for
    #: the oldest (the audit's memory and lag stay bounded when it falls behind)
    max_audit_backlog: int = field(default=64, metadata={"ge": 1})


BOUNDS = ("body_bytes", "batch_events", "reorder_buffer", "fleets", "workers_per_fleet",
          "active_per_fleet", "page_size", "audit_backlog")  # fmt: skip


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: int = 0
    errors: list[EventError] = field(default_factory=list)

    def as_json(self, error_limit: int = 1000) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "errors": [
                {"position": e.position, "line": e.line, "field": e.field, "message": e.message}
                for e in self.errors[:error_limit]
            ],
        }
