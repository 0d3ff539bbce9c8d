"""The mirror behind the real ingest path equals the mirror of the clean, ordered stream.

A hypothesis state machine plays a decode fleet (workers join, drain, go down; requests
become ready, are dispatched to workers with a free slot, decode in engine steps, report
progress and finish) and writes down two things: the clean stream, in event-time order,
and what the service receives instead: the same events in batches, with duplicates
(arbitrarily late, caught by `(source, seq)`), reorderings within the reorder window,
schema-invalid lines and semantically wrong events. The received stream goes through
`parse_body` and the `Pipeline` of a `Runtime` on a DuckDB file (restarted now and
then, gracefully or as after a crash); a `FleetMirror` applies the clean stream directly.
After every step both mirrors keep their own invariants and are equal (so the ingest path
adds nothing and loses nothing), every wrong event that was applied has its violation and
no other violation exists; whenever everything sent is applied, the mirror is the fleet
itself (active sets, pool, and generated counts where the engine reports its steps).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from shadow.events import EVENT_ORDER as ORDER
from shadow.events import parse_body, parse_ndjson
from shadow.service.runtime import Runtime
from shadow.service.settings import ServiceSettings, load_settings
from shadow.service.store import ServiceStore
from shadow.stream.fleet import FleetCore
from shadow.stream.mirror import FinishedRequest, FleetMirror

WINDOW_S = 0.5  # the pipeline's reorder window
MAX_WORKERS = 4
TIMES = st.sampled_from([100, 0, 300, 10, 700, 1])  # ms since the previous event
#: what happens in one step (the common things more often)
STEPS = ["ready", "dispatch", "steps", "deliver", "finish", "dispatch", "steps", "deliver",
         "progress", "change worker", "add worker", "deliver", "wrong finish unknown",
         "wrong dispatch again", "wrong after finish", "wrong backwards", "wrong harmless",
         "forget"]  # fmt: skip
AUDIT = ("jsq-pool", "br0")

#: schema-invalid lines and the field each rejection must name (None: the whole line)
INVALID_LINES: list[tuple[str, str | None]] = [
    ('{"type":"ready","ts":1,"request_id":"x","prompt_tokens":"ten"}', "prompt_tokens"),
    ('{"type":"ready","ts":1,"request_id":"x","prompt_tokens":-3}', "prompt_tokens"),
    ('{"type":"ready","ts":1,"prompt_tokens":5}', "request_id"),
    ('{"type":"ready","ts":1,"request_id":3.5,"prompt_tokens":5}', "request_id"),
    ('{"type":"dispatch","ts":1,"request_id":"x"}', "worker"),
    ('{"type":"progress","ts":1,"request_id":"x","generated":true}', "generated"),
    ('{"type":"finish","ts":1,"request_id":"x","output_tokens":3,"reason":"Boom!"}', "reason"),
    ('{"type":"worker","ts":1,"worker":"w9","capacity":0}', "capacity"),
    ('{"type":"engine_step","ts":1,"worker":"w0","step":1,"running":1}', "duration_ms"),
    ('{"type":"ready","ts":-1,"request_id":"x","prompt_tokens":5}', "ts"),
    ('{"type":"ready","ts":1,"fleet":"no spaces","request_id":"x","prompt_tokens":5}', "fleet"),
    ('{"type":"ready","ts":1,"seq":"7","request_id":"x","prompt_tokens":5}', "seq"),
    ('{"type":"teleport","ts":1}', "type"),
    ('{"ts":1,"request_id":"x"}', "type"),
    ("this is not json", None),
    ("42", None),
]


@functools.cache
def migrated_database() -> Path:
    """An empty database at the schema's head, copied for each example (migrating a new
    file costs more than a whole example's ingest)."""
    root = Path(tempfile.mkdtemp(prefix="mirror-stateful-template-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    ServiceStore(root / "template.duckdb").close()
    return root / "template.duckdb"


@dataclass
class Sent:
    """One event as emitted: its time, its NDJSON line and its dedupe key."""

    ts: float
    kind: str
    line: str
    key: tuple[str, int]
    fields: dict[str, Any]
    #: the violation a semantically wrong event must raise: (kind, request id)
    violation: tuple[str, str] | None = None
    #: a wrong event that must change nothing and raise nothing
    harmless: bool = False
    #: the finished request a wrong event is about (it must not be forgotten first)
    about_finished: str | None = None
    #: lost in a crash before it was applied (it was not stored)
    lost: bool = False

    def __repr__(self) -> str:  # what a failing example prints
        return self.line

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # hypothesis's printer
        printer.text(self.line)


@dataclass
class TrueWorker:
    wid: str
    capacity: int
    telemetry: bool
    state: str = "up"
    step: int = 0
    active: list[str] = field(default_factory=list)  # in dispatch order
    started: set[str] = field(default_factory=set)  # admitted by the engine


@dataclass
class TrueRequest:
    rid: str
    prompt: int
    hash: str | None
    worker: str | None = None
    generated: int = 0
    reported: int = 0
    finished: bool = False
    output: int | None = None
    finish_ts: float | None = None
    values: set[int] = field(default_factory=set)  # progress counts sent


def apply_clean(mirror: FleetMirror, event: Sent) -> None:
    """The clean stream straight into a mirror, as `FleetCore` would apply it."""
    f, ts = event.fields, event.ts
    if event.kind == "worker":
        mirror.apply_worker(ts, f["worker"], f["capacity"], f["state"])
    elif event.kind == "ready":
        mirror.apply_ready(ts, f["request_id"], f["prompt_tokens"], f.get("prompt_hash"))
    elif event.kind == "dispatch":
        mirror.apply_dispatch(ts, f["request_id"], f["worker"])
    elif event.kind == "progress":
        mirror.apply_progress(ts, f["request_id"], f["generated"])
    elif event.kind == "finish":
        mirror.apply_finish(ts, f["request_id"], f["output_tokens"], f["reason"])
    else:
        start = ts - f["duration_ms"] / 1000.0
        mirror.apply_engine_step(ts, f["worker"], f["step"], start, f["running"])


def check_invariants(mirror: FleetMirror) -> None:
    """What the mirror promises about itself, whatever it was fed."""
    owner: dict[str, str] = {}
    used = 0
    for worker in mirror.order:
        assert mirror.workers[worker.worker_id] is worker
        assert len(worker.active) <= worker.capacity, (worker.worker_id, len(worker.active))
        prompt_sum = offset_sum = load = 0
        for rid, request in worker.active.items():
            assert rid not in owner, f"{rid} active on {owner.get(rid)} and {worker.worker_id}"
            owner[rid] = worker.worker_id
            assert request.worker is worker and not request.finished
            assert rid not in mirror.pool
            assert mirror.requests.get(rid) is request
            slot = request.slot
            assert slot >= 0 and mirror._slot_used[slot]
            assert mirror._slot_worker[slot] == worker.index
            assert mirror._slot_prompt[slot] == request.prompt_tokens
            assert mirror._slot_offset[slot] == request.offset
            prompt_sum += request.prompt_tokens
            offset_sum += request.offset
            load += request.prompt_tokens + request.generated()
            used += 1
        assert (worker.prompt_sum, worker.offset_sum) == (prompt_sum, offset_sum)
        assert worker.load == load
    assert int(mirror._slot_used.sum()) == used
    assert not any(mirror._slot_used[s] for s in mirror._free_slots)
    snapshot = mirror.snapshot()
    assert list(snapshot.load) == list(mirror.loads())
    assert list(snapshot.active_count) == [len(w.active) for w in mirror.order]
    per_worker = [0] * len(mirror.order)
    active = snapshot.active
    for w, prompt, generated in zip(
        active.worker, active.prompt_tokens, active.generated, strict=True
    ):
        per_worker[int(w)] += int(prompt) + int(generated)
    assert per_worker == list(mirror.loads())
    for rid, request in mirror.pool.items():
        assert mirror.requests.get(rid) is request
        assert request.worker is None and not request.finished
    for rid, request in mirror.requests.live.items():
        assert not request.finished, f"{rid} finished but still held as live"
        if request.worker is not None:
            assert owner.get(rid) == request.worker.worker_id


def picture(mirror: FleetMirror) -> dict[str, Any]:
    """The comparable state of a mirror: workers, pool, requests."""
    return {
        "workers": [
            (w.worker_id, w.capacity, w.state, sorted(w.active), w.load, w.steps, w.last_step)
            for w in mirror.order
        ],
        "pool": list(mirror.pool),
        "learned": len(mirror.predictor),
    }


def request_picture(request: Any) -> tuple:
    if request.finished:
        return ("finished", request.output_tokens, request.prompt_tokens)
    worker = request.worker.worker_id if request.worker is not None else None
    return (worker, request.generated(), request.progress, request.prompt_tokens)


class IngestMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        shm = Path("/dev/shm")  # a RAM disk where there is one: commits cost no fsync
        where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix="mirror-stateful-", dir=where))
        shutil.copyfile(migrated_database(), self.root / "shadow.duckdb")
        self.settings = load_settings(
            None,
            db=self.root / "shadow.duckdb",
            windows=False,
            workers_processes=False,
            audit_policies=list(AUDIT),
            reorder_window_s=WINDOW_S,
            # The reference releases by the window behind the newest event alone. The wait
            # for a slow source depends on wall time, which this machine does not model:
            # tests/test_source_clocks.py checks it (any delay between in-order sources)
            ingest={"source_wait_s": 0.0},
            ghost_ttl_s=1e9,  # silence is not what this test is about
        )
        self.runtime: Runtime | None = Runtime(self.settings)
        self.reference = FleetMirror("default")
        # the world
        self.clock_ms = 0
        self.last_kind: str | None = None
        self.workers: dict[str, TrueWorker] = {}
        self.requests: dict[str, TrueRequest] = {}
        self.pool: list[str] = []
        self.seqs: dict[str, int] = {}
        self.counter = 0
        # the streams
        self.clean: list[Sent] = []
        self.applied = 0  # how much of `clean` the reference mirror has applied
        self.wrong: list[Sent] = []  # semantically wrong events, in time order
        self.pending: list[Sent] = []  # emitted, not yet delivered
        self.delivered: list[Sent] = []
        self.seen: set[tuple[str, int]] = set()
        self.max_ts = float("-inf")
        self.upto = float("-inf")  # what the pipeline has applied (event time)
        self.horizon = float("-inf")  # forget_finished horizon of the running pipeline
        self.dispatches = 0
        self.restarted_at = 0  # events delivered before the last restart
        self.stored_changed = False

    def teardown(self) -> None:
        try:
            if self.runtime is not None:
                self.runtime.store.close()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    # -- the world -------------------------------------------------------------------

    @property
    def pipeline(self):
        assert self.runtime is not None
        return self.runtime.pipeline

    def _stamp(self, kind: str, dt_ms: int) -> float:
        """The next event time: the same as the last one only where the pipeline's class
        order at equal times keeps the emitted order."""
        same = dt_ms == 0 and self.last_kind is not None and ORDER[kind] > ORDER[self.last_kind]
        if not same:
            self.clock_ms += max(dt_ms, 1)
        self.last_kind = kind
        return self.clock_ms / 1000.0

    def _emit(self, ts: float, kind: str, source: str, **fields: Any) -> Sent:
        seq = self.seqs.get(source, 0)
        self.seqs[source] = seq + 1
        body = {"type": kind, "ts": ts, "seq": seq, "source": source, **fields}
        event = Sent(ts, kind, json.dumps(body), (source, seq), body)
        self.pending.append(event)
        return event

    def _clean(self, kind: str, dt_ms: int, source: str = "router", **fields: Any) -> Sent:
        event = self._emit(self._stamp(kind, dt_ms), kind, source, **fields)
        self.clean.append(event)
        return event

    def _wrong(self, kind: str, dt_ms: int, **fields: Any) -> Sent:
        """A semantically wrong event at a time of its own (so no clean event shares its
        time, and it is applied exactly between the clean events around it)."""
        self.clock_ms += max(dt_ms, 1)
        self.last_kind = None
        event = self._emit(self.clock_ms / 1000.0, kind, "router", **fields)
        self.wrong.append(event)
        return event

    def _free_workers(self) -> list[TrueWorker]:
        return [w for w in self.workers.values() if w.state == "up" and len(w.active) < w.capacity]

    def _active(self) -> list[TrueRequest]:
        return [r for r in self.requests.values() if r.worker is not None]

    def _finish(self, request: TrueRequest, reason: str, dt_ms: int) -> None:
        output = request.generated if request.worker is not None else 0
        self._clean("finish", dt_ms, request_id=request.rid, output_tokens=output, reason=reason)
        if request.worker is not None:
            worker = self.workers[request.worker]
            worker.active.remove(request.rid)
            worker.started.discard(request.rid)
        else:
            self.pool.remove(request.rid)
        request.worker = None
        request.finished = True
        request.output = output
        request.finish_ts = self.clock_ms / 1000.0

    @initialize(
        capacities=st.lists(st.integers(1, 4), min_size=1, max_size=3),
        telemetry=st.lists(st.booleans(), min_size=3, max_size=3),
    )
    def fleet(self, capacities: list[int], telemetry: list[bool]) -> None:
        for capacity, steps in zip(capacities, telemetry, strict=False):
            self._add_worker(capacity, steps, 0)

    @rule(data=st.data(), what=st.sampled_from(STEPS))
    def step(self, data: st.DataObject, what: str) -> None:
        """One thing happens: the fleet acts, a wrong event is emitted, a batch is
        delivered, or the service forgets finished requests. (One rule: hypothesis
        switches rules off per example, and an example without one of these is wasted.)"""
        if what == "deliver":
            self._deliver(data)
        elif what == "forget":
            self._forget(data.draw(st.integers(0, 20_000), label="ttl ms"))
        elif what.startswith("wrong "):
            self._wrong_event(data, what.removeprefix("wrong "), data.draw(TIMES, label="dt"))
        else:
            self._act(data, what, data.draw(TIMES, label="dt"))

    def _act(self, data: st.DataObject, action: str, dt: int) -> None:
        """The fleet does one thing; when it cannot, what makes it possible."""
        stepping = any(w.state != "down" for w in self.workers.values())
        if action == "dispatch" and self.pool and not self._free_workers():
            action = "finish" if self._active() else "change worker"
        if action == "progress" and not any(r.generated > r.reported for r in self._active()):
            action = "steps"
        if action == "add worker" and len(self.workers) >= MAX_WORKERS:
            action = "change worker"
        if action == "dispatch" and self.pool:
            self._dispatch(data, dt)
        elif action == "finish" and (self._active() or self.pool):
            self._finish_one(data, dt)
        elif action == "progress":
            self._progress(data, dt)
        elif action == "change worker":
            self._change_worker(data, dt)
        elif action == "add worker":
            self._add_worker(data.draw(st.integers(1, 4)), data.draw(st.booleans()), dt)
        elif action == "steps" and stepping:
            for _ in range(data.draw(st.integers(1, 3), label="steps")):
                self._step(data, dt)
        else:
            self._ready(data.draw(st.lists(st.integers(0, 5000), min_size=1, max_size=3)), dt)

    def _add_worker(self, capacity: int, telemetry: bool, dt: int) -> None:
        wid = f"w{len(self.workers)}"
        self.workers[wid] = TrueWorker(wid, capacity, telemetry)
        self._clean("worker", dt, source="fleet", worker=wid, capacity=capacity, state="up")

    def _change_worker(self, data: st.DataObject, dt: int) -> None:
        worker = self.workers[data.draw(st.sampled_from(sorted(self.workers)), label="worker")]
        state = data.draw(st.sampled_from(["up", "draining", "down"]), label="state")
        if state == "down":  # its requests fail first
            for rid in list(worker.active):
                self._finish(self.requests[rid], "error", dt)
        capacity = data.draw(st.integers(max(1, len(worker.active)), 4), label="capacity")
        worker.state, worker.capacity = state, capacity
        self._clean("worker", dt, source="fleet", worker=worker.wid, capacity=capacity, state=state)

    def _ready(self, prompts: list[int], dt: int) -> None:
        for prompt in prompts:
            self.counter += 1
            rid = f"r{self.counter}"
            digest = f"h{prompt % 3}" if prompt % 2 else None
            self.requests[rid] = TrueRequest(rid, prompt, digest)
            self.pool.append(rid)
            fields: dict[str, Any] = {"request_id": rid, "prompt_tokens": prompt}
            if digest is not None:
                fields["prompt_hash"] = digest
            self._clean("ready", dt, **fields)

    def _dispatch(self, data: st.DataObject, dt: int) -> None:
        """The router admits from the pool (any request, any worker with a free slot)."""
        for _ in range(data.draw(st.integers(1, 3), label="admissions")):
            if not (self.pool and self._free_workers()):
                return
            rid = data.draw(st.sampled_from(self.pool), label="request")
            worker = data.draw(st.sampled_from(self._free_workers()), label="to")
            self.pool.remove(rid)
            worker.active.append(rid)
            self.requests[rid].worker = worker.wid
            self._clean("dispatch", dt, request_id=rid, worker=worker.wid, policy="jsq")

    def _step(self, data: st.DataObject, dt: int) -> None:
        """A barrier step of every running worker: the engine admits some of its newly
        dispatched requests (oldest first) and every admitted request decodes a token; a
        worker without step telemetry steps silently. The tap reports some right away."""
        ts = None
        stepped: list[TrueRequest] = []
        for worker in self.workers.values():
            if worker.state == "down":
                continue
            pending = [r for r in worker.active if r not in worker.started]
            admit = data.draw(st.integers(0, len(pending)), label=f"admit {worker.wid}")
            worker.started.update(pending[:admit])
            running = [self.requests[r] for r in worker.active if r in worker.started]
            kv = sum(r.prompt + r.generated for r in running)
            for request in running:
                request.generated += 1
            if worker.telemetry:
                if ts is None:
                    ts = self._stamp("engine_step", dt)
                event = self._emit(
                    ts, "engine_step", f"engine-{worker.wid}", worker=worker.wid,
                    step=worker.step, duration_ms=20.0 + kv * 1e-4, running=len(running),
                    kv_tokens=kv,
                )  # fmt: skip
                self.clean.append(event)
            worker.step += 1
            stepped.extend(running)
        for request in stepped:
            if data.draw(st.booleans(), label=f"report {request.rid}"):
                request.reported = request.generated
                request.values.add(request.generated)
                self._clean("progress", 0, request_id=request.rid, generated=request.generated)

    def _progress(self, data: st.DataObject, dt: int) -> None:
        """Cumulative progress, coalesced: any count between the last report and now."""
        behind = [r for r in self._active() if r.generated > r.reported]
        request = data.draw(st.sampled_from(behind), label="request")
        value = data.draw(st.integers(request.reported + 1, request.generated), label="value")
        request.reported = value
        request.values.add(value)
        self._clean("progress", dt, request_id=request.rid, generated=value)

    def _finish_one(self, data: st.DataObject, dt: int) -> None:
        """A request finishes on its worker, or leaves the pool (the client gave up)."""
        choices = sorted(r.rid for r in self._active()) + self.pool
        request = self.requests[data.draw(st.sampled_from(choices), label="request")]
        if request.worker is None:
            reason = "cancelled"
        else:
            reason = data.draw(
                st.sampled_from(["stop", "length", "abort", "cancelled", "tool_calls", "odd_new"])
            )
        self._finish(request, reason, dt)

    # -- semantically wrong events ----------------------------------------------------

    def _finished(self) -> list[TrueRequest]:
        """Finished requests the running pipeline has not forgotten."""
        done = [r for r in self.requests.values() if r.finished and r.finish_ts >= self.horizon]
        return sorted(done, key=lambda r: r.rid)

    def _known(self) -> list[TrueRequest]:
        """Requests the running pipeline's mirror knows (not forgotten)."""
        alive = [r for r in self.requests.values() if not r.finished]
        return sorted(alive, key=lambda r: r.rid) + self._finished()

    def _wrong_event(self, data: st.DataObject, what: str, dt: int) -> None:
        """An event that is valid JSON and schema but wrong for the fleet: it must raise
        its violation (or none, if harmless) and change nothing."""
        active = sorted(self._active(), key=lambda r: r.rid)
        # A backwards count the request never reported: the pipeline takes a count equal
        # to the last one it received for a repeat, whatever its seq, and a reordering
        # can make an earlier count the last one received.
        backwards = {r.rid: [v for v in range(r.reported) if v not in r.values] for r in active}
        reported = [r for r in active if backwards[r.rid]]
        if what == "dispatch again" and active:
            request = data.draw(st.sampled_from(active), label="request")
            to = data.draw(st.sampled_from(sorted(self.workers)), label="to")
            event = self._wrong("dispatch", dt, request_id=request.rid, worker=to, policy="jsq")
            event.violation = ("double_dispatch", request.rid)
        elif what == "after finish" and self._finished():
            request = data.draw(st.sampled_from(self._finished()), label="request")
            if data.draw(st.booleans(), label="dispatch"):
                to = data.draw(st.sampled_from(sorted(self.workers)), label="to")
                event = self._wrong("dispatch", dt, request_id=request.rid, worker=to, policy="jsq")
                event.violation = ("double_dispatch", request.rid)
            else:
                # above anything reported before (an equal count is taken for a duplicate)
                value = max(request.output, request.reported) + data.draw(st.integers(1, 50))
                request.reported = value
                event = self._wrong("progress", dt, request_id=request.rid, generated=value)
                event.violation = ("progress_after_finish", request.rid)
            event.about_finished = request.rid
        elif what == "backwards" and reported:
            request = data.draw(st.sampled_from(reported), label="request")
            value = data.draw(st.sampled_from(backwards[request.rid]), label="value")
            request.values.add(value)
            event = self._wrong("progress", dt, request_id=request.rid, generated=value)
            event.violation = ("progress_decreased", request.rid)
        elif what == "harmless":  # a ready again, or progress of a request never seen
            known = self._known()
            if known and data.draw(st.booleans(), label="ready again"):
                request = data.draw(st.sampled_from(known), label="request")
                event = self._wrong(
                    "ready", dt, request_id=request.rid, prompt_tokens=request.prompt
                )
                if request.finished:
                    event.about_finished = request.rid
            else:
                self.counter += 1
                rid = f"nobody-{self.counter}"
                event = self._wrong("progress", dt, request_id=rid, generated=3)
            event.harmless = True
        else:
            self.counter += 1
            rid = f"never-{self.counter}"
            event = self._wrong("finish", dt, request_id=rid, output_tokens=5, reason="stop")
            event.violation = ("finish_unknown_request", rid)

    # -- delivery --------------------------------------------------------------------

    def _submit(self, batch: list[Sent], duplicates: list[Sent], junk: list[int],
                data: st.DataObject) -> None:  # fmt: skip
        lines: list[tuple[str, Any]] = [("event", e) for e in batch + duplicates]
        lines += [("junk", i) for i in junk]
        lines = data.draw(st.permutations(lines), label="arrival order")
        body = "\n".join(INVALID_LINES[x][0] if k == "junk" else x.line for k, x in lines)
        events, errors = parse_body(body.encode(), "application/x-ndjson")
        result = self.pipeline.submit(events, errors)
        fresh = set()
        for kind, item in lines:
            if kind == "event" and item.key not in self.seen:
                fresh.add(item.key)
        expected_errors = {p: INVALID_LINES[x][1] for p, (k, x) in enumerate(lines) if k == "junk"}
        assert {e.position: e.field for e in result.errors} == expected_errors, result.errors
        assert all(e.message for e in result.errors)
        assert result.rejected == len(junk)
        assert result.accepted == len(fresh), (result.accepted, len(fresh))
        assert result.duplicates == len(batch) + len(duplicates) - len(fresh)
        self.seen |= fresh
        self.stored_changed = True
        delivered = {id(e) for e in batch}
        self.pending = [e for e in self.pending if id(e) not in delivered]
        self.delivered += batch
        if batch:
            self.max_ts = max(self.max_ts, *(e.ts for e in batch))
            self.upto = max(self.upto, self.max_ts - WINDOW_S)
        self._advance(self.upto)

    def _advance(self, upto: float) -> None:
        while self.applied < len(self.clean) and self.clean[self.applied].ts <= upto:
            apply_clean(self.reference, self.clean[self.applied])
            if self.clean[self.applied].kind == "dispatch":
                self.dispatches += 1
            self.applied += 1

    def _deliver(self, data: st.DataObject) -> None:
        """A batch: some of what is pending (a later event may come before an earlier
        one, but never after the pipeline's reorder window passed it), duplicates of
        anything sent before or in this batch, and bad lines. Now and then, everything
        pending is sent too, and then (`then`) an idle flush applies it all (`drain`), or
        the service stops gracefully (`stop`) or as a SIGKILL would stop it (`crash`: no
        drain, no final commit) and starts again on the same file."""
        duplicates = data.draw(st.integers(0, 3), label="duplicates")
        junk = data.draw(st.lists(st.integers(0, len(INVALID_LINES) - 1), max_size=2))
        then = data.draw(st.sampled_from([None] * 6 + ["drain", "stop", "crash"]), label="then")
        if then is None:
            take = data.draw(
                st.lists(st.booleans(), min_size=len(self.pending), max_size=len(self.pending)),
                label="take",
            )
        else:
            take = [True] * len(self.pending)
        batch = [e for e, chosen in zip(self.pending, take, strict=True) if chosen]
        top = max([self.max_ts, *(e.ts for e in batch)])
        batch += [e for e, chosen in zip(self.pending, take, strict=True)
                  if not chosen and e.ts <= top - WINDOW_S]  # fmt: skip
        again = []
        # A progress sent before a restart is not resent: the pipeline does not remember
        # its seq then (see test_a_progress_resent_after_a_restart_is_a_duplicate).
        pool = [e for e in self.delivered[self.restarted_at :] if e.kind == "progress"]
        pool += [e for e in self.delivered if e.kind != "progress"] + batch
        if duplicates and pool:
            again = [data.draw(st.sampled_from(pool), label="duplicate") for _ in range(duplicates)]
        self._submit(batch, again, junk, data)
        if then is not None:
            self._sync(then)

    def _sync(self, how: str) -> None:
        assert self.runtime is not None and not self.pending
        if how == "drain":
            self.pipeline.drain()
        else:
            if how == "crash":
                # Only a request's highest progress is stored: a lower one (a wrong count)
                # still in the reorder window is gone, and its violation with it.
                for event in self.wrong:
                    violation = event.violation or ("",)
                    if event.ts > self.upto and violation[0] == "progress_decreased":
                        event.lost = True
                self.runtime.store.close()
            else:
                self.runtime.close()
            self.runtime = None
            self.runtime = Runtime(self.settings)
            self.pipeline.drain()  # as the idle flush would (a crash leaves a window to apply)
            # the store keeps every lifecycle event and step, and each request's highest
            # progress
            lifecycle = sum(1 for e in self.delivered if e.kind != "progress")
            progressed = {e.fields["request_id"] for e in self.delivered if e.kind == "progress"}
            assert self.runtime.rebuilt_events == lifecycle + len(progressed)
            self.horizon = float("-inf")
            self.restarted_at = len(self.delivered)
        self.upto = self.max_ts
        self._advance(self.upto)
        self.last_kind = None  # what comes next is not applied yet: a time of its own
        self.check_the_world()

    def _forget(self, ttl_ms: int) -> None:
        """Forget finished requests (never one a wrong event still to be applied is about:
        that event would then be about an unknown request)."""
        state = self.pipeline.fleets.get("default")
        if state is None:
            return
        before = state.mirror.now - ttl_ms / 1000.0
        for event in self.wrong:
            if event.about_finished is not None and event.ts > self.upto:
                before = min(before, self.requests[event.about_finished].finish_ts)
        state.core.forget(before)
        self.horizon = max(self.horizon, before)

    # -- checks ----------------------------------------------------------------------

    def check_the_world(self) -> None:
        """After a sync, the reference mirror (hence the pipeline's) is the fleet itself:
        every worker's active set and pool exactly, and where the engine reports steps,
        every request's generated count."""
        mirror = self.reference
        assert list(mirror.pool) == self.pool
        for worker in self.workers.values():
            mirrored = mirror.workers[worker.wid]
            assert sorted(mirrored.active) == sorted(worker.active)
            assert (mirrored.capacity, mirrored.state) == (worker.capacity, worker.state)
            for rid in worker.active:
                request = self.requests[rid]
                expected = request.generated if worker.telemetry else request.reported
                assert mirrored.active[rid].generated() == expected, rid

    @invariant()
    def mirrors_keep_their_invariants(self) -> None:
        if self.runtime is None:
            return
        check_invariants(self.reference)
        state = self.pipeline.fleets.get("default")
        if state is not None:
            check_invariants(state.mirror)

    @invariant()
    def pipeline_mirror_equals_the_clean_one(self) -> None:
        if self.runtime is None:
            return
        state = self.pipeline.fleets.get("default")
        if state is None:
            assert not self.reference.order and not self.reference.requests
            return
        mirror = state.mirror
        assert picture(mirror) == picture(self.reference)
        assert state.state_mismatches == 0
        # finished requests are found by id only: look up every id the world made
        for rid in self.requests:
            request = self.reference.requests.get(rid)
            got = mirror.requests.get(rid)
            if request is None:
                assert got is None, f"{rid} known to the pipeline, not to the clean mirror"
            elif got is None:
                assert request.finished, f"{rid} lost while still in the fleet"
                assert self.requests[rid].finish_ts < self.horizon, f"{rid} lost"
            else:
                assert request_picture(got) == request_picture(request), rid
        assert set(mirror.requests.live) <= set(self.reference.requests.live)
        assert len(mirror.requests.finished) <= len(self.reference.requests.finished)

    @invariant()
    def what_is_stored_is_right(self) -> None:
        """Every wrong event that was applied has its violation, stored once, and there is
        no other violation; every dispatch is audited once. (Only after a delivery: the
        database changes with nothing else.)"""
        if self.runtime is None or not self.stored_changed:
            return
        self.stored_changed = False
        rows = self.pipeline.store.query("SELECT kind, worker, request_id FROM violations")
        found = {(r["kind"], r["request_id"]) for r in rows}
        assert len(rows) == len({(r["kind"], r["worker"], r["request_id"]) for r in rows})
        applied = {
            e.violation for e in self.wrong if e.violation and e.ts <= self.upto and not e.lost
        }
        possible = {e.violation for e in self.wrong if e.violation}
        assert applied <= found, applied - found
        assert found <= possible, found - possible
        audits = self.pipeline.store.query(
            "SELECT policy, count(*) AS n, count(DISTINCT ingest_id) AS d FROM decisions "
            "GROUP BY policy"
        )
        assert all(row["n"] == row["d"] for row in audits)
        counts = {r["policy"]: r["n"] for r in audits}
        if self.dispatches:
            assert counts == dict.fromkeys(AUDIT, self.dispatches), (counts, self.dispatches)


def test_the_mirror_behind_ingest_equals_the_clean_stream() -> None:
    run_state_machine_as_test(
        IngestMachine,
        settings=settings(
            max_examples=50, stateful_step_count=60, deadline=None, report_multiple_bugs=False
        ),
    )


# -- forgetting finished requests ------------------------------------------------------


def known(mirror: FleetMirror, *request_ids: str) -> set[str]:
    """Which of these requests the mirror knows (finished ones are found by id only)."""
    return {rid for rid in request_ids if rid in mirror.requests}


def test_forget_finished_drops_only_old_finished_requests() -> None:
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 4, "up")
    for i, rid in enumerate(["a", "b", "c", "pool"]):
        mirror.apply_ready(1.0 + i, rid, 100, None)
    for rid in ("a", "b", "c"):
        mirror.apply_dispatch(5.0, rid, "w0")
    mirror.apply_finish(10.0, "a", 7, "stop")
    mirror.apply_finish(20.0, "b", 9, "stop")
    mirror.apply_finish(12.0, "pool", 0, "cancelled")
    assert mirror.forget_finished(15.0) == 2  # a and the cancelled pool request
    assert known(mirror, "a", "b", "c", "pool") == {"b", "c"}
    assert mirror.forget_finished(15.0) == 0
    assert mirror.forget_finished(25.0) == 1
    assert known(mirror, "a", "b", "c", "pool") == {"c"}
    assert set(mirror.workers["w0"].active) == {"c"} and len(mirror.requests) == 1
    assert mirror.workers["w0"].starting == [mirror.requests["c"]]  # released ones pruned
    check_invariants(mirror)


def test_a_finished_request_is_held_compact_and_still_known() -> None:
    """Until forgotten, a finished request is a `FinishedRequest` (not its live state):
    a late duplicate of its events changes nothing, a second dispatch is a double
    dispatch, an exact count corrects the tap's estimate, and a ghost is held the same
    way; a finish that comes late (earlier than one applied before it) is forgotten by
    its own time."""
    core = FleetCore("f")
    mirror = core.mirror
    core.worker(0.0, "w0", 4, "up")
    for rid in ("a", "b", "c"):
        core.ready(1.0, rid, 100, None)
        core.dispatch(2.0, rid, "w0")
    core.finish_event(10.0, "a", 7, "stop", True, False, 41)  # the tap's estimate
    done = mirror.requests["a"]
    assert isinstance(done, FinishedRequest) and done.finished and done.worker is None
    assert (done.output_tokens, done.estimated, done.finish_ref) == (7, True, 41)
    assert core.ready(11.0, "a", 100, None)[1] is None  # a duplicate ready is not new
    assert core.progress(11.0, "a", 5) == []  # a late duplicate of what the finish said
    assert [v.kind for v in core.dispatch(11.0, "a", "w0")] == ["double_dispatch"]
    _, outcome = core.finish_event(12.0, "a", 9, "stop", False, True, 42)
    assert (outcome.kind, outcome.completed.output_tokens, outcome.primary_ref) == (
        "corrected", 9, 41,
    )  # fmt: skip
    assert mirror.requests["a"].output_tokens == 9 and not mirror.requests["a"].estimated
    core.finish_event(20.0, "b", 3, "stop", False, False, 43)
    core.finish_event(15.0, "c", 4, "stop", False, False, 44)  # applied late
    assert all(isinstance(mirror.requests[r], FinishedRequest) for r in "abc")
    assert mirror.forget_finished(16.0) == 2 and known(mirror, "a", "b", "c") == {"b"}
    ghost = FleetMirror("g")
    ghost.apply_worker(0.0, "w0", 4, "up")
    ghost.apply_ready(1.0, "x", 10, None)
    live = ghost.apply_dispatch(2.0, "x", "w0")
    ghost.now = 50.0
    ghost.release_ghost(live)
    held = ghost.requests["x"]
    assert isinstance(held, FinishedRequest) and held.left_ts == 50.0
    assert ghost.running == 0 and ghost.forget_finished(50.0) == 0
    assert ghost.forget_finished(50.5) == 1 and not ghost.requests


def _send(pipeline: Any, *events: dict[str, Any]) -> Any:
    parsed, errors = parse_ndjson("\n".join(json.dumps(e) for e in events))
    assert not errors
    result = pipeline.submit(parsed)
    pipeline.drain()
    return result


@pytest.fixture
def runtime(tmp_path):
    settings_ = _inline(tmp_path / "forget.duckdb")
    runtime = Runtime(settings_)
    yield runtime
    runtime.close()


def _one_life(request_id: str, capacity: int) -> list[dict]:
    """A worker w0 and one request's whole life on it: ready, dispatch, progress 4,
    finish with 6 tokens."""
    return [
        {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": capacity},
        {"type": "ready", "ts": 1.0, "request_id": request_id, "prompt_tokens": 50},
        {"type": "dispatch", "ts": 2.0, "request_id": request_id, "worker": "w0"},
        {"type": "progress", "ts": 3.0, "request_id": request_id, "generated": 4},
        {
            "type": "finish",
            "ts": 4.0,
            "request_id": request_id,
            "output_tokens": 6,
            "reason": "stop",
        },
    ]


def test_late_duplicates_of_a_forgotten_request_change_nothing(runtime) -> None:
    """Events without a seq are not deduplicated by their seq: once the request is
    forgotten, the mirror itself must take them for what they are."""
    pipeline = runtime.pipeline
    life = _one_life("old", capacity=1)
    _send(pipeline, *life)
    _send(pipeline, {"type": "ready", "ts": 100.0, "request_id": "new", "prompt_tokens": 10})
    state = pipeline.fleets["default"]
    assert state.core.forget(state.mirror.now - 30.0) == 1
    assert "old" not in state.mirror.requests
    before = picture(state.mirror)
    late = [*life[1:3], {**life[3], "generated": 2}, life[4]]  # the whole life again, late
    result = _send(pipeline, *late)
    assert result.accepted == 4 and result.rejected == 0
    assert picture(state.mirror) == before
    assert state.mirror.workers["w0"].active == {}  # no phantom slot
    assert list(state.mirror.pool) == ["new"]  # no phantom ready request
    assert pipeline.store.query("SELECT kind FROM violations") == []
    check_invariants(state.mirror)
    # after the horizon the id is unknown: a dispatch of it is tracked (and flagged)
    _send(pipeline, {"type": "dispatch", "ts": 101.0, "request_id": "old", "worker": "w0"})
    assert set(state.mirror.workers["w0"].active) == {"old"}
    assert pipeline.store.query("SELECT kind FROM violations") == [
        {"kind": "dispatch_without_ready"}
    ]


def test_a_finished_requests_progress_memory_moves_into_the_mirror(runtime) -> None:
    """Once its finish is applied, a request's highest progress count is kept with the
    mirror's record of it (no second copy in the pipeline): a late resend that is not
    ahead is still a duplicate, one ahead is taken once, and the count goes when the
    mirror forgets the request (restarts: the stateful test above)."""
    pipeline = runtime.pipeline
    life = _one_life("r", capacity=2)
    _send(pipeline, *life)
    state = pipeline.fleets["default"]
    done = state.mirror.requests["r"]
    assert isinstance(done, FinishedRequest) and done.progress_seen == 4
    assert len(pipeline._progress_seen) == 0  # nothing of it left in the pipeline
    assert _send(pipeline, life[3]).duplicates == 1  # a late resend, not ahead
    ahead = {**life[3], "ts": 5.0, "generated": 6}
    assert _send(pipeline, ahead).accepted == 1 and done.progress_seen == 6
    assert _send(pipeline, ahead).duplicates == 1
    assert len(pipeline._progress_seen) == 0
    _send(pipeline, {"type": "ready", "ts": 400.0, "request_id": "later", "prompt_tokens": 5})
    assert "r" not in state.mirror.requests  # forgotten finished_ttl_s after its finish
    assert len(pipeline._progress_seen) == 0


def test_an_absurd_output_length_is_not_learned() -> None:
    """The predictor keeps a histogram as long as the longest output it learned."""
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 2, "up")
    mirror.apply_ready(1.0, "r", 10, None)
    mirror.apply_dispatch(2.0, "r", "w0")
    done = mirror.apply_finish(3.0, "r", 10**12, "stop")
    assert done is not None and done.output_tokens == 10**12
    assert len(mirror.predictor) == 0
    check_invariants(mirror)


def test_a_follower_forgets_with_the_stream() -> None:
    from shadow.stream.fleet import FleetCore
    from shadow.stream.items import DispatchItem, FinishItem, ForgetItem, ReadyItem, WorkerItem

    core = FleetCore("f")
    items = [
        WorkerItem(0.0, "f", "w0", 2, "up"),
        ReadyItem(1.0, "f", "a", 10, None),
        DispatchItem(2.0, "f", "a", "w0", None),
        FinishItem(3.0, "f", "a", 5, "stop"),
        ForgetItem(50.0, "f", 40.0),
    ]
    for item in items:
        core.apply(item)
    assert len(core.mirror.requests) == 0 and core.mirror.forgotten_before == 40.0
    assert [w.worker_id for w in core.mirror.order] == ["w0"]


# -- found by these tests, to be fixed outside the files this suite may change ----------


def _events(*events: dict[str, Any]) -> Any:
    parsed, errors = parse_ndjson("\n".join(json.dumps(e) for e in events))
    assert not errors
    return parsed


def _inline(db: Path) -> ServiceSettings:
    """A service on `db` with the audit inline and no windows: restarts are cheap."""
    return load_settings(None, db=db, windows=False, workers_processes=False)


def _running(request: str, ts: tuple[float, float, float], generated: int) -> list[dict]:
    """Worker `w0` (B = 2) and `request` ready, dispatched to it and progressed, at `ts`."""
    ready, dispatched, progressed = ts
    return [
        {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 2},
        {"type": "ready", "ts": ready, "request_id": request, "prompt_tokens": 10},
        {"type": "dispatch", "ts": dispatched, "request_id": request, "worker": "w0"},
        {"type": "progress", "ts": progressed, "request_id": request, "generated": generated},
    ]


def test_an_incident_is_stored_once_across_a_crash(tmp_path) -> None:
    """The event that raised a violation before the checkpoint can be gone after a
    restart (only a request's highest progress is kept): a later one raises it again."""
    settings_ = _inline(tmp_path / "x.duckdb")
    runtime = Runtime(settings_)
    runtime.pipeline.submit(_events(
        {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 2},
        {"type": "ready", "ts": 1.0, "request_id": "r", "prompt_tokens": 10},
        {"type": "dispatch", "ts": 2.0, "request_id": "r", "worker": "w0"},
        {"type": "finish", "ts": 3.0, "request_id": "r", "output_tokens": 5, "reason": "stop"},
        {"type": "progress", "ts": 4.0, "request_id": "r", "generated": 10},
        {"type": "ready", "ts": 8.0, "request_id": "x", "prompt_tokens": 10},
    ))  # fmt: skip
    runtime.pipeline.submit(
        _events({"type": "progress", "ts": 9.0, "request_id": "r", "generated": 12})
    )
    runtime.store.close()  # a crash: the second progress is stored, not applied
    runtime = Runtime(settings_)
    try:
        rows = runtime.store.query("SELECT kind, request_id FROM violations")
        assert rows == [{"kind": "progress_after_finish", "request_id": "r"}]
    finally:
        runtime.close()


def test_a_decrease_seen_before_a_crash_is_kept(tmp_path) -> None:
    """A lower progress is not stored (only a request's highest is), so its violation
    cannot be derived again after a restart, even when it follows the checkpoint."""
    settings_ = _inline(tmp_path / "x.duckdb")
    runtime = Runtime(settings_)
    runtime.pipeline.submit(_events(
        *_running("r", (1.0, 2.0, 3.0), generated=5),
        {"type": "ready", "ts": 10.0, "request_id": "later", "prompt_tokens": 10},
    ))  # fmt: skip
    # applied at once (well behind the newest event), after the held-back ready's id
    runtime.pipeline.submit(
        _events({"type": "progress", "ts": 4.0, "request_id": "r", "generated": 2})
    )
    before = runtime.store.query("SELECT kind, request_id FROM violations")
    assert before == [{"kind": "progress_decreased", "request_id": "r"}]
    assert runtime.store.state("applied_through") < 6  # the ready at 10 s is held back
    runtime.store.close()  # a crash
    runtime = Runtime(settings_)
    try:
        assert runtime.store.query("SELECT kind, request_id FROM violations") == before
    finally:
        runtime.close()


def test_events_in_the_reorder_window_at_a_crash_are_still_reordered(tmp_path) -> None:
    def mirror_after(restart: bool) -> dict[str, Any]:
        settings_ = _inline(tmp_path / f"{restart}.duckdb")
        runtime = Runtime(settings_)
        runtime.pipeline.submit(_events(
            {"type": "worker", "ts": 0.0, "worker": "w0", "capacity": 2},
            {"type": "ready", "ts": 1.0, "request_id": "r", "prompt_tokens": 10},
            {"type": "engine_step", "ts": 1.5, "worker": "w0", "step": 0, "duration_ms": 20.0,
             "running": 1},
        ))  # fmt: skip
        if restart:
            runtime.store.close()  # a crash
            runtime = Runtime(settings_)
        # the dispatch came before the step, and only 0.3 s late: within the window
        runtime.pipeline.submit(
            _events({"type": "dispatch", "ts": 1.2, "request_id": "r", "worker": "w0"})
        )
        runtime.pipeline.drain()
        seen = picture(runtime.pipeline.fleets["default"].mirror)
        runtime.close()
        return seen

    assert mirror_after(restart=True) == mirror_after(restart=False)


def test_an_event_applied_before_a_crash_keeps_its_place_after_a_held_one(tmp_path) -> None:
    """The newest event seen can be one the store does not keep (a lower progress), so the
    restart's window starts before the point the stop had applied to. Event `b` (5.9 s) came
    after `a` (6.1 s) but within the window, and both were applied before the stop, `b`
    first; only `a`'s id is within the checkpoint. The restart held `b` back and applied `a`
    at once: the pool became `a, b` where the stream says `b, a` (found by the state
    machine above)."""

    def mirror_after(restart: bool) -> dict[str, Any]:
        settings_ = _inline(tmp_path / f"{restart}.duckdb")
        runtime = Runtime(settings_)
        runtime.pipeline.submit(_events(
            *_running("r", (0.5, 0.6, 1.0), generated=9),
            {"type": "ready", "ts": 6.1, "request_id": "a", "prompt_tokens": 10},
        ))  # fmt: skip
        runtime.pipeline.submit(_events(
            {"type": "ready", "ts": 7.8, "request_id": "x", "prompt_tokens": 10},
            {"type": "ready", "ts": 5.9, "request_id": "b", "prompt_tokens": 10},
            {"type": "progress", "ts": 8.5, "request_id": "r", "generated": 3},  # not stored
        ))  # fmt: skip
        mirror = runtime.pipeline.fleets["default"].mirror
        assert list(mirror.pool) == ["b", "a"]  # `x` (7.8 s) waits in the window
        if restart:
            runtime.store.close()  # a crash
            runtime = Runtime(settings_)
        runtime.pipeline.drain()
        seen = picture(runtime.pipeline.fleets["default"].mirror)
        runtime.close()
        return seen

    straight = mirror_after(restart=False)
    assert straight["pool"] == ["b", "a", "x"]
    assert mirror_after(restart=True) == straight


def test_a_progress_resent_after_a_restart_is_a_duplicate(tmp_path) -> None:
    settings_ = _inline(tmp_path / "x.duckdb")
    runtime = Runtime(settings_)
    early = {"type": "progress", "ts": 3.0, "seq": 3, "request_id": "r", "generated": 2}
    runtime.pipeline.submit(_events(
        {"type": "worker", "ts": 0.0, "seq": 0, "worker": "w0", "capacity": 2},
        {"type": "ready", "ts": 1.0, "seq": 1, "request_id": "r", "prompt_tokens": 10},
        {"type": "dispatch", "ts": 2.0, "seq": 2, "request_id": "r", "worker": "w0"},
        early,
        {"type": "progress", "ts": 4.0, "seq": 4, "request_id": "r", "generated": 5},
    ))  # fmt: skip
    runtime.close()
    runtime = Runtime(settings_)
    try:
        again = runtime.pipeline.submit(_events(early))  # a client retries an old batch
        runtime.pipeline.drain()
        assert (again.accepted, again.duplicates) == (0, 1)
        assert runtime.store.query("SELECT kind FROM violations") == []
    finally:
        runtime.close()


def test_a_count_beyond_int64_is_rejected_naming_its_field() -> None:
    line = {"type": "ready", "ts": 1.0, "request_id": "x", "prompt_tokens": 2**63}
    events, errors = parse_ndjson(json.dumps(line))
    assert events == [] and [e.field for e in errors] == ["prompt_tokens"]
