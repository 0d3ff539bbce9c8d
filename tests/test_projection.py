"""The projection the audit keeps across dispatches equals the one rebuilt from scratch.

Hypothesis drives a mirror through every kind of change (dispatches, finishes that teach
the predictor, engine steps with requests that missed them, progress ahead of the steps,
recomputes, ghosts, workers joining) and, after each, compares `MaintainedProjection`
with BR-H's own `project` of the snapshot: exactly, bit for bit, whether it was given the
snapshot's active set or not, and after it kept a projection BR-H's round made.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.policies import BalanceRouteConfig, BalanceRouteHorizon
from shadow.stream.mirror import FleetMirror
from shadow.stream.projection import MaintainedProjection

HORIZON = 12

OPERATION = st.one_of(
    st.tuples(st.just("dispatch"), st.integers(0, 5), st.integers(1, 5000)),
    st.tuples(st.just("finish"), st.integers(0, 40), st.integers(1, 30)),
    st.tuples(st.just("finish quietly"), st.integers(0, 40), st.integers(1, 30)),
    st.tuples(st.just("step"), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("progress"), st.integers(0, 40), st.integers(1, 40)),
    st.tuples(st.just("recompute"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("ghost"), st.integers(0, 40), st.just(0)),
    st.tuples(st.just("audit"), st.just(0), st.just(0)),
)


def _request(mirror: FleetMirror, pick: int) -> str | None:
    running = [r for r in mirror.requests.live.values() if r.worker is not None]
    return running[pick % len(running)].request_id if running else None


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 4), st.lists(OPERATION, min_size=1, max_size=80))
def test_the_maintained_projection_equals_the_rebuilt_one(workers, operations):
    mirror = FleetMirror("f")
    for g in range(workers):
        mirror.apply_worker(0.0, f"w{g}", 8, "up")
    mirror.predictor.observe_many(np.array([3, 7, 20]))
    policy = BalanceRouteHorizon(mirror.predictor, BalanceRouteConfig(horizon=HORIZON))
    # every change rebuilds rows alone (never "most rows changed: rebuild them all")
    maintained = MaintainedProjection(mirror.predictor, HORIZON, full_rebuild_share=1.0)
    steps = [0] * 6
    ts = 0.0
    for number, (kind, a, b) in enumerate(operations):
        ts += 0.01
        if kind == "dispatch":
            request_id = f"r{number}"
            mirror.apply_ready(ts, request_id, b, None)
            mirror.apply_dispatch(ts, request_id, f"w{a % len(mirror.order)}")
        elif kind in ("finish", "finish quietly") and (rid := _request(mirror, a)):
            # an estimated count is not learned: the predictor stays as it was
            mirror.apply_finish(ts, rid, b, "stop", estimated=kind == "finish quietly")
        elif kind == "step":
            g = a % len(mirror.order)
            steps[g] += 1
            running = len(mirror.order[g].active) - b if b else None
            mirror.apply_engine_step(ts, f"w{g}", steps[g], ts - 0.005, running)
        elif kind == "progress" and (rid := _request(mirror, a)):
            mirror.apply_progress(ts, rid, mirror.requests[rid].generated() + b)
        elif kind == "recompute" and (rid := _request(mirror, a)):
            mirror.apply_recompute(ts, rid)
        elif kind == "ghost" and (rid := _request(mirror, a)):
            mirror.release_ghost(mirror.requests[rid])
        elif kind == "audit" and len(mirror.order) < 6:
            mirror.apply_worker(ts, f"w{len(mirror.order)}", 8, "up")
        snapshot = mirror.snapshot()
        assert mirror.running == sum(len(w.active) for w in mirror.order) == len(snapshot.active)
        # every other call as a round's later dispatch gives it: no active set (the rows
        # rebuilt come from the mirror's own requests of those workers)
        lean = number % 2 == 1
        rebuilt = policy.project(snapshot)
        if number % 3 == 0:  # a round's first dispatch: BR-H's own projection is kept
            kept = maintained.current(mirror, snapshot, rebuilt.copy())
        else:
            kept = maintained.current(
                mirror, mirror.snapshot(with_active=False) if lean else snapshot
            )
        assert kept.shape == rebuilt.shape
        assert np.array_equal(kept, rebuilt), (kind, np.argwhere(kept != rebuilt)[:5])


def test_a_dispatch_rebuilds_only_its_worker_row():
    mirror = FleetMirror("f")
    for g in range(8):
        mirror.apply_worker(0.0, f"w{g}", 8, "up")
    mirror.predictor.observe_many(np.array([5, 9, 40]))
    maintained = MaintainedProjection(mirror.predictor, HORIZON)
    for i in range(16):
        mirror.apply_ready(0.1, f"r{i}", 100 + i, None)
        mirror.apply_dispatch(0.1, f"r{i}", f"w{i % 8}")
    maintained.current(mirror, mirror.snapshot())
    assert (maintained.full_rebuilds, maintained.rows_rebuilt) == (1, 0)
    mirror.apply_ready(0.2, "new", 700, None)
    mirror.apply_dispatch(0.2, "new", "w3")
    maintained.current(mirror, mirror.snapshot())
    assert (maintained.full_rebuilds, maintained.rows_rebuilt) == (1, 1)
    mirror.apply_finish(0.3, "new", 12, "stop")  # learned: every prediction may change
    maintained.current(mirror, mirror.snapshot())
    assert maintained.full_rebuilds == 2


def test_the_active_rows_of_some_workers_are_the_snapshots_rows_of_them():
    mirror = FleetMirror("f")
    for g in range(5):
        mirror.apply_worker(0.0, f"w{g}", 8, "up")
    for i in range(23):
        mirror.apply_ready(0.1, f"r{i}", 100 + 7 * i, (i % 3) or None)
        mirror.apply_dispatch(0.1, f"r{i}", f"w{(i * 3) % 5}")
    for step in range(1, 4):
        mirror.apply_engine_step(0.2 + step, "w1", step, 0.1 + step, None)
    mirror.apply_finish(3.5, "r4", 9, "stop")
    active = mirror.snapshot().active
    workers = np.array([3, 1])
    local = mirror.active_of(workers)

    def rows(worker, prompt, generated, keys):
        columns = (worker, prompt, generated, keys)
        return sorted(zip(*(c.tolist() for c in columns), strict=True))

    mask = np.isin(active.worker, workers)
    position = {3: 0, 1: 1}
    local_worker = np.array([position[g] for g in active.worker[mask]])
    expected = rows(
        local_worker, active.prompt_tokens[mask], active.generated[mask], active.prompt_keys[mask]
    )
    assert rows(local.worker, local.prompt_tokens, local.generated, local.prompt_keys) == expected
    assert any(g for g, *_ in expected) and any(gen for *_, gen, _ in expected)


def test_the_audit_keeps_the_projection_brh_made_in_its_round(tmp_path, monkeypatch):
    """A round's first dispatch scores against the projection BR-H made inside its timed
    round instead of projecting the fleet again: on recorded traffic every decision is
    the one the audit makes when it projects the fleet itself, and the projection was
    kept, not rebuilt, on most rounds."""
    from concurrent.futures import ThreadPoolExecutor

    from shadow.events import parse_ndjson
    from shadow.service.ingest.pipeline import Pipeline, PipelineConfig
    from shadow.service.store import ServiceStore
    from shadow.stream.audit import AuditFollower
    from shadow.stream.items import decode_stream
    from tests.service_helpers import batches, record

    log = tmp_path / "events.ndjson"
    record(log, requests=400)
    streams: list[bytes] = []

    class Capturing(ThreadPoolExecutor):
        def __init__(self) -> None:
            super().__init__(max_workers=1)
            self.follower = AuditFollower()

        def submit(self, fn, stream):
            streams.append(stream)
            return super().submit(lambda: self.follower.run(decode_stream(stream)))

    store = ServiceStore(tmp_path / "audit.duckdb")
    worker = Capturing()
    pipeline = Pipeline(store, PipelineConfig(windows_enabled=False), audit_executor=worker)
    pipeline.start()
    for body in batches(log):
        pipeline.submit(parse_ndjson(body.decode())[0])
    pipeline.drain()
    store.close()
    worker.shutdown()

    def decisions(follower: AuditFollower) -> list[tuple]:
        outcomes = [o for s in streams for o in follower.run(decode_stream(s))]
        return [d._replace(latency_ms=None) for o in outcomes for d in o.decisions]

    kept = AuditFollower()
    with_kept = decisions(kept)
    projection = next(iter(kept.fleets.values()))[1].projection
    assert projection.adopted > projection.full_rebuilds
    made_again = MaintainedProjection.current

    def without_made(self, mirror, snapshot, made=None):
        return made_again(self, mirror, snapshot)

    monkeypatch.setattr(MaintainedProjection, "current", without_made)
    rebuilt = AuditFollower()
    assert decisions(rebuilt) == with_kept
    assert next(iter(rebuilt.fleets.values()))[1].projection.adopted == 0
    assert len(with_kept) > 400
