"""The invariants of ARCHITECTURE.md, on the live stream and on shadow decisions.

Each check looks at the mirror just before an event is applied. A violation is counted
once per incident (kind, worker, request), not once per event that shows it again.
Critical kinds feed the gate and the fallback.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shadow.stream.mirror import FleetMirror

CRITICAL = "critical"
WARNING = "warning"

#: kind -> (severity, what it means)
KINDS: dict[str, tuple[str, str]] = {
    "double_dispatch": (CRITICAL, "a request dispatched again while active or after finishing"),
    "over_capacity": (CRITICAL, "a dispatch to a worker with no free slot (active > B)"),
    "dispatch_without_ready": (WARNING, "a dispatch of a request never seen ready"),
    "dispatch_to_unknown_worker": (WARNING, "a dispatch to a worker never announced"),
    "progress_decreased": (WARNING, "cumulative progress went down"),
    "progress_after_finish": (WARNING, "progress reported after the request finished"),
    "finish_unknown_request": (WARNING, "a finish for a request never dispatched"),
    "ghost": (WARNING, "an active request with no progress for the ghost TTL; slot released"),
    "engine_drift": (WARNING, "mirror active count differs from the engine's running count"),
    "invalid_shadow_decision": (CRITICAL, "a shadow policy chose a full or unknown worker"),
    "shadow_decision_error": (CRITICAL, "a shadow policy raised or timed out on a round"),
}


@dataclass(frozen=True)
class Violation:
    kind: str
    severity: str
    fleet: str
    worker: str | None
    request_id: str | None
    ts: float
    detail: str


@dataclass(frozen=True)
class InvariantConfig:
    """A field's `metadata` holds the bounds a configured value must meet."""

    ghost_ttl_s: float = field(default=120.0, metadata={"gt": 0})
    #: a live dispatch can race a step boundary by a few ms, so one request of slack
    drift_tolerance: int = field(default=1, metadata={"ge": 0})
    #: scrapes race the event stream by milliseconds, so they get some slack
    scrape_drift_tolerance: int = field(default=2, metadata={"ge": 0})
    drift_samples: int = field(default=3, metadata={"ge": 1})
    #: and for this long: a burst the engine's front end has not handed to its scheduler
    #: yet (tokenizing long prompts; measured on a real vLLM: 8 requests for over 0.75 s)
    #: is in flight, not drift; samples alone made the window shrink with the poll interval.
    #: It is also the longest gap between two samples a run of them spans: across a
    #: longer one (scrapes that failed while an API server stalled) the disagreement was
    #: not watched, and two short ones on either side are not one that lasted
    drift_min_s: float = field(default=3.0, metadata={"ge": 0})


class InvariantChecker:
    """Checks for one fleet; remembers what it already reported."""

    def __init__(self, fleet: str, config: InvariantConfig | None = None) -> None:
        self.fleet = fleet
        self.config = config or InvariantConfig()
        self._reported: set[tuple[str, str | None, str | None]] = set()
        #: (ts, key) of the reported incidents of requests, oldest first, for `forget`
        self._request_incidents: deque[tuple[float, tuple[str, str | None, str]]] = deque()
        #: each ongoing drift: (samples in a row, when it began, when last seen; event time)
        self._drift: dict[str, tuple[int, float, float]] = {}

    @property
    def remembered(self) -> int:
        """Incidents remembered as reported (bounded by `forget`)."""
        return len(self._reported)

    def forget(self, before_ts: float) -> None:
        """Forget the incidents of requests reported before `before_ts`, with the
        requests the mirror forgets (`FleetMirror.forget_finished`): a misbehaving source
        raises one per request, so remembering them all would grow without bound. The
        mirror ignores later events of a forgotten request, so none is reported twice."""
        incidents = self._request_incidents
        while incidents and incidents[0][0] < before_ts:
            self._reported.discard(incidents.popleft()[1])

    def _violation(
        self, kind: str, ts: float, worker: str | None, request_id: str | None, detail: str
    ) -> list[Violation]:
        key = (kind, worker, request_id)
        if key in self._reported:
            return []
        self._reported.add(key)
        if request_id is not None:
            self._request_incidents.append((ts, (kind, worker, request_id)))
        return [Violation(kind, KINDS[kind][0], self.fleet, worker, request_id, ts, detail)]

    def before_dispatch(
        self, mirror: FleetMirror, ts: float, request_id: str, worker_id: str
    ) -> list[Violation]:
        found: list[Violation] = []
        if mirror.is_stale(ts, request_id):
            return found  # a late duplicate of a forgotten request: the mirror ignores it
        request = mirror.requests.get(request_id)
        worker = mirror.workers.get(worker_id)
        if request is None:
            found += self._violation(
                "dispatch_without_ready",
                ts,
                worker_id,
                request_id,
                f"dispatch of {request_id} to {worker_id}, never seen ready",
            )
        elif request.worker is not None or request.finished:
            where = request.worker.worker_id if request.worker is not None else "(finished)"
            found += self._violation(
                "double_dispatch",
                ts,
                worker_id,
                request_id,
                f"{request_id} dispatched to {worker_id} while already on {where}",
            )
            return found
        if worker is None:
            found += self._violation(
                "dispatch_to_unknown_worker",
                ts,
                worker_id,
                request_id,
                f"worker {worker_id} was never announced by a worker event",
            )
        elif len(worker.active) >= worker.capacity or not worker.accepting:
            found += self._violation(
                "over_capacity",
                ts,
                worker_id,
                request_id,
                f"{worker_id} has {len(worker.active)} active of B = {worker.capacity} "
                f"(state {worker.state}) when {request_id} arrives",
            )
        return found

    def before_progress(
        self, mirror: FleetMirror, ts: float, request_id: str, generated: int
    ) -> list[Violation]:
        request = mirror.requests.get(request_id)
        if request is None:
            return []
        worker = request.worker.worker_id if request.worker is not None else None
        if request.finished:
            if request.output_tokens is not None and generated <= request.output_tokens:
                return []  # a late duplicate of what the finish already said
            return self._violation(
                "progress_after_finish",
                ts,
                worker,
                request_id,
                f"{request_id} reported {generated} tokens after finishing",
            )
        if generated < request.progress:
            return self._violation(
                "progress_decreased",
                ts,
                worker,
                request_id,
                f"{request_id} progress went from {request.progress} down to {generated}",
            )
        return []

    def before_finish(self, mirror: FleetMirror, ts: float, request_id: str) -> list[Violation]:
        request = mirror.requests.get(request_id)
        if request_id in mirror.pool:
            return []  # left the pool before dispatch (a client gave up): legitimate
        if mirror.is_stale(ts, request_id):
            return []  # a late duplicate of a forgotten request
        if request is None or (request.worker is None and not request.finished):
            return self._violation(
                "finish_unknown_request",
                ts,
                None,
                request_id,
                f"finish for {request_id}, which was never dispatched",
            )
        return []

    def on_engine_step(
        self, ts: float, worker_id: str, expected: int, running: int, waiting: int = 0
    ) -> list[Violation]:
        """The engine ran `running` requests in a step where the mirror expected `expected`.

        As for a scrape (`on_engine_sample`), a request the engine holds in its waiting
        queue is not drift: the mirror may count up to `waiting` more than `running`.
        `waiting` here is the engine's queue (the plugin's count; the emulator sends none)
        beyond the requests `expected` already leaves out as not started yet (the caller,
        `FleetCore.engine_step`, subtracts them), so none is excused twice."""
        return self._compare(
            ts, worker_id, (expected, expected), running, "step", excused=float(waiting)
        )

    def on_engine_sample(
        self,
        mirror: FleetMirror,
        ts: float,
        worker_id: str,
        running: float,
        *,
        deferred: float = 0.0,
        capacity_waiting: float = 0.0,
        preemptions: float | None = None,
        requested_at: float | None = None,
    ) -> list[Violation]:
        """A scrape of the engine's `/metrics`, checked once the mirror reached its time.

        The page shows the engine at some moment between the scrape's request
        (`requested_at`, default `ts`) and its answer (`ts`): the mirror's count is
        taken as its range over that span (`ActiveHistory`), and only a count outside
        it is drift. A span the history cannot cover is not judged.

        The mirror counts a request active from its dispatch to its finish; the engine
        runs it, or holds it in its waiting queue. vLLM's `num_requests_running` leaves
        the queue out, and a request the router dispatched on arrival may well sit there:
        a prefill waiting for the token budget or a preempted request (reason
        `capacity`), a KV transfer from the prefill node not landed yet (`deferred`).
        None of that is drift. So when the page splits waiting by reason
        (`num_requests_waiting_by_reason`), the check compares the mirror's active count
        with running + waiting (`deferred` + `capacity_waiting`): the mirror may count up
        to that many more than `running`, never fewer, within `scrape_drift_tolerance`.

        Without the split (older vLLM, the emulator) both are 0: the check is mirror
        active vs engine running, within the tolerance. `preemptions` is accepted for the
        callers that pass it and no longer needed: a preempted request is in the queue.
        """
        del preemptions  # the waiting queue holds the preempted ones (see above)
        worker = mirror.workers.get(worker_id)
        if worker is None:
            return []
        start = ts if requested_at is None else min(requested_at, ts)
        span = worker.active_history.between(start, ts, len(worker.active))
        if span is None:
            return []
        return self._compare(
            ts, worker_id, span, running, "scrape", excused=deferred + capacity_waiting,
            seen_from=start,
        )  # fmt: skip

    def _compare(
        self,
        ts: float,
        worker_id: str,
        expected: tuple[int, int],
        running: float,
        what: str,
        excused: float = 0.0,
        seen_from: float | None = None,
    ) -> list[Violation]:
        """Drift when the mirror's count (its `expected` range, lowest and highest) is
        below `running`, or above `running` plus the `excused` waiting, by more than the
        tolerance, for `drift_samples` in a row over at least `drift_min_s`.

        In a row means watched throughout: a sample seen from (`seen_from`, default `ts`)
        more than `drift_min_s` after the run's last one starts the run over. A real-vLLM
        run in CI had its API server stall for 12.7 s, every scrape in it timing out: a
        burst just dispatched before (mirror 7, engine 0) and another after (7 against
        3) made "3 scrapes over 13.0 s" of two transients of under a second each."""
        key = f"{what}:{worker_id}"
        tolerance = (
            self.config.scrape_drift_tolerance if what == "scrape" else self.config.drift_tolerance
        )
        low, high = expected
        if running - high > tolerance or low - running - excused > tolerance:
            run, since, last = self._drift.get(key, (0, ts, ts))
            if (ts if seen_from is None else seen_from) - last > self.config.drift_min_s:
                run, since = 0, ts  # not watched in between: this one starts a new run
            run += 1
            self._drift[key] = (run, since, ts)
            if run >= self.config.drift_samples and ts - since >= self.config.drift_min_s:
                waiting = f" (+{excused:g} waiting excused)" if excused else ""
                return self._violation(
                    "engine_drift",
                    ts,
                    worker_id,
                    None,
                    f"{worker_id}: mirror has {low if low == high else f'{low}-{high}'} "
                    f"active, engine reports "
                    f"{running:g} running{waiting} for {run} {what}s over {ts - since:.1f} s",
                )
        else:
            self._drift.pop(key, None)
        return []

    def sweep_ghosts(self, mirror: FleetMirror) -> list[Violation]:
        """Flag and release active requests silent for longer than the ghost TTL."""
        found: list[Violation] = []
        limit = mirror.now - self.config.ghost_ttl_s
        for worker in mirror.order:
            silent = [r for r in worker.active.values() if r.last_seen_ts < limit]
            for request in silent:
                found += self._violation(
                    "ghost",
                    mirror.now,
                    worker.worker_id,
                    request.request_id,
                    f"{request.request_id} on {worker.worker_id}: no progress since "
                    f"{request.last_seen_ts:.3f} s (TTL {self.config.ghost_ttl_s:g} s); released",
                )
                mirror.release_ghost(request)
        return found

    def shadow_error(self, ts: float, policy: str, request_id: str, what: str) -> list[Violation]:
        """A shadow policy's round that raised or timed out (the gate's candidate errors:
        one per round, keyed by policy so two failing policies are both counted)."""
        key = ("shadow_decision_error", policy, request_id)
        if key in self._reported:
            return []
        self._reported.add(key)
        self._request_incidents.append((ts, key))
        kind = "shadow_decision_error"
        detail = f"{policy} failed deciding {request_id}: {what}"
        return [Violation(kind, KINDS[kind][0], self.fleet, None, request_id, ts, detail)]

    def shadow_decision(
        self, ts: float, policy: str, request_id: str, worker_id: str, free_slots: int
    ) -> list[Violation]:
        if free_slots <= 0:
            return self._violation(
                "invalid_shadow_decision",
                ts,
                worker_id,
                request_id,
                f"{policy} chose {worker_id} for {request_id} with no free slot",
            )
        return []
