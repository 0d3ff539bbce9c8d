"""What `shadow bench fleet` samples of a running ingest pass every 30 s of fleet time
(CPU and resident memory per process, the audit's and the source's lag, the windows
stored, the requests held), and the pass's summary from those samples: rates, CPU per
event per process, memory growth after the first minute."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from shadow.bench.load import growth_mib_per_min
from shadow.service.footprint import cpu_seconds, process_tree, resident_bytes


@dataclass(frozen=True)
class Sample:
    """One moment of an ingest pass, every `SAMPLE_S` of fleet time."""

    fleet_s: float
    wall_s: float
    events: int
    #: seconds of fleet time the audit was behind the applied stream
    audit_lag_s: float
    #: how late the source was against the fleet's clock (HTTP pass; 0 for the file)
    behind_s: float
    cpu_s: dict[str, float]
    rss_mib: dict[str, float]
    #: the continuous counterfactuals' windows stored so far, and the fleet time the
    #: latest of them ends at (None: none yet, or counterfactuals off). A window is
    #: evaluated once every request in it has finished (~one request's life after its end)
    windows: int = 0
    window_end_s: float | None = None
    #: DuckDB's own memory (`duckdb_memory()`, summed over its tags; bounded by its
    #: `memory_limit`), part of the server's resident memory: tells its buffer pool
    #: filling from Python objects growing (None: not read)
    duckdb_mib: float | None = None
    #: requests the service holds state for, by holder (`live`, `finished`, `windows`:
    #: the `shadow_held_requests` gauge): what its memory grows with
    held: dict[str, int] = field(default_factory=dict)

    @property
    def counterfactual_lag_s(self) -> float | None:
        """Seconds of fleet time between now and the end of the latest evaluated window."""
        return None if self.window_end_s is None else max(0.0, self.fleet_s - self.window_end_s)


def _processes(pid: int) -> dict[str, int]:
    """The ingesting process and its worker processes: `server`, `worker-N` in the order
    they started (the service starts the audit worker, then the window worker:
    worker-0 and worker-1), and multiprocessing's `resource-tracker`.
    Numbered by start time, a label names the same process in every sample."""
    found = {"server": pid}
    children = sorted((_started(p), p) for p in process_tree(pid) if p != pid)
    workers = 0
    for _, child in children:
        if _is_resource_tracker(child):
            found["resource-tracker"] = child
        else:
            found[f"worker-{workers}"] = child
            workers += 1
    return found


def _started(pid: int) -> int:
    """Clock ticks after boot at which `pid` started (0: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
        return 0


def _is_resource_tracker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"resource_tracker" in cmdline.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False


def footprint(pid: int) -> tuple[dict[str, float], dict[str, float]]:
    cpu, rss = {}, {}
    for role, process in _processes(pid).items():
        cpu[role] = cpu_seconds(process) or 0.0
        rss[role] = (resident_bytes(process) or 0) / 2**20
    return cpu, rss


def _slopes_after_1_min(
    samples: list[Sample], series_of: Callable[[Sample], dict[str, float] | dict[str, int]]
) -> dict[str, float | None]:
    """Per key of `series_of` (a process's MiB, a holder's requests): its least-squares
    slope a minute over the samples from 60 s of fleet time on (None: under 3 of them)."""
    slopes: dict[str, float | None] = {}
    for key in dict.fromkeys(key for s in samples for key in series_of(s)):
        series = [(s.wall_s, float(series_of(s)[key])) for s in samples
                  if s.fleet_s >= 60 and key in series_of(s)]  # fmt: skip
        slopes[key] = growth_mib_per_min(series) if len(series) >= 3 else None
    return slopes


def summarize_pass(samples: list[Sample], events: int, seconds: float, required: float) -> dict:
    """Rates, lag, CPU per event per process and memory growth of one pass."""
    sustained = events / seconds if seconds > 0 else 0.0
    cpu_per_event: dict[str, float] = {}
    if samples:
        last = samples[-1]
        for role, used in last.cpu_s.items():
            start = samples[0].cpu_s.get(role, 0.0) if len(samples) > 1 else 0.0
            span = last.events - (samples[0].events if len(samples) > 1 else 0)
            if span > 0:
                cpu_per_event[role] = (used - start) / span * 1e6
    total = [(s.wall_s, sum(s.rss_mib.values())) for s in samples]
    settled = [(t, mib) for (t, mib), s in zip(total, samples, strict=True) if s.fleet_s >= 60]
    # per process, from 60 s or from its first sample (a process that starts late counts
    # its start as growth in the total's slope)
    by_process = _slopes_after_1_min(samples, lambda s: s.rss_mib)
    held_growth = _slopes_after_1_min(samples, lambda s: s.held)  # requests a minute
    return {
        "events": events,
        "seconds": seconds,
        "sustained_events_per_s": sustained,
        "required_events_per_s": required,
        "ratio": sustained / required if required else None,
        "cpu_us_per_event": cpu_per_event,
        "rss_mib_end": total[-1][1] if total else None,
        "rss_mib_max": max(mib for _, mib in total) if total else None,
        "growth_mib_per_min_after_1_min": growth_mib_per_min(settled),
        "growth_mib_per_min_by_process": by_process,
        "held_requests_end": samples[-1].held if samples else {},
        "held_growth_per_min_after_1_min": held_growth,
        "samples": [asdict(s) | {"counterfactual_lag_s": s.counterfactual_lag_s} for s in samples],
    }


def sample_line(path: str, s: Sample) -> str:
    rss = " + ".join(f"{role} {mib:,.0f}" for role, mib in s.rss_mib.items())
    duck = "" if s.duckdb_mib is None else f" (DuckDB {s.duckdb_mib:,.0f} of the server's)"
    windows = "" if s.window_end_s is None else (
        f", {s.windows} windows (the latest ends {s.counterfactual_lag_s:.0f} s ago)")  # fmt: skip
    held = "" if not s.held else "; holds " + ", ".join(
        f"{count:,} {holder}" for holder, count in s.held.items())  # fmt: skip
    return (f"{path} {s.fleet_s:5.0f} s of fleet time at {s.wall_s:6.1f} s wall: "
            f"{s.events:,} events, audit {s.audit_lag_s:.2f} s behind, source "
            f"{s.behind_s:.2f} s behind{windows}; RSS MiB {rss}{duck}{held}")  # fmt: skip
