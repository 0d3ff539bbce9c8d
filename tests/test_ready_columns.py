"""The mirror's ready pool as columns (`ReadyColumns`) says what its dict says, in the same
order, through any sequence of readies, dispatches, finishes and recomputes; and the audit
round's members are exactly the requests pooled before the round began."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.stream import ready_columns
from shadow.stream.audit import _RoundMembers
from shadow.stream.mirror import FleetMirror
from shadow.stream.ready_columns import INITIAL_ROWS

OPS = st.lists(
    st.tuples(st.sampled_from(["ready", "dispatch", "finish", "recompute"]), st.integers(0, 10**6)),
    max_size=200,
)


def _expected(mirror: FleetMirror) -> tuple[list[str], list[int], list[int]]:
    pooled = list(mirror.pool.values())
    return (
        [r.request_id for r in pooled],
        [r.prompt_tokens for r in pooled],
        [r.prompt_key for r in pooled],
    )


def _apply(mirror: FleetMirror, op: str, pick: int, ts: float, made: list[str]) -> None:
    pooled, active = list(mirror.pool), [r for w in mirror.order for r in w.active]
    if op == "ready" or not made:
        rid = f"r{len(made)}"
        made.append(rid)
        mirror.apply_ready(ts, rid, 1 + pick % 997, f"h{pick % 5}")
    elif op == "dispatch" and pooled:
        mirror.apply_dispatch(ts, pooled[pick % len(pooled)], f"w{pick % 3}")
    elif op == "finish":
        either = pooled + active
        if either:
            mirror.apply_finish(ts, either[pick % len(either)], 7, "stop")
    elif op == "recompute" and active:
        mirror.apply_recompute(ts, active[pick % len(active)])


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_the_columns_are_the_pool_in_ready_order(ops):
    with pytest.MonkeyPatch.context() as patch:  # small columns: grown and compacted often
        patch.setattr(ready_columns, "INITIAL_ROWS", 2)
        mirror = FleetMirror("f")
        for w in range(3):
            mirror.apply_worker(0.0, f"w{w}", 10**6, "up")
        made: list[str] = []
        for k, (op, pick) in enumerate(ops):
            _apply(mirror, op, pick, 1.0 + k, made)
            ids, prompts, keys = mirror.ready.columns()
            assert (ids.tolist(), prompts.tolist(), keys.tolist()) == _expected(mirror)
            assert len(mirror.ready) == len(mirror.pool)
        for rid, request in mirror.requests.live.items():
            assert (request.pool_index >= 0) == (rid in mirror.pool)


def test_many_removals_compact_the_columns_and_keep_them_small():
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 10**6, "up")
    assert len(mirror.ready) == 0  # made now (on first use), kept in step from here on
    for i in range(10 * INITIAL_ROWS):
        mirror.apply_ready(float(i), f"r{i}", 10, None)
        if i % 4:  # three in four leave the pool at once
            mirror.apply_dispatch(float(i), f"r{i}", "w0")
    ids, prompts, _ = mirror.ready.columns()
    assert ids.tolist() == [f"r{i}" for i in range(0, 10 * INITIAL_ROWS, 4)]
    assert np.all(prompts == 10)
    assert mirror.ready._end <= 2 * len(mirror.pool) + INITIAL_ROWS  # tombstones compacted


def test_a_rounds_members_are_those_pooled_before_it():
    """A set of the pool's ids taken at the round's start, as the audit once built each
    round: the members agree with it for every request, through the round's dispatches,
    a request pooled during it, and one given back during it."""
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 10**6, "up")
    for i in range(6):
        mirror.apply_ready(1.0, f"r{i}", 10, None)
    mirror.apply_dispatch(1.0, "r5", "w0")
    members = _RoundMembers(mirror, mirror.ready.next_seq, extra="x")
    at_start = frozenset(mirror.pool) | {"x"}
    for rid in ("r0", "r1"):  # the round dispatches two of its own
        members.note_dispatch(rid)
        mirror.apply_dispatch(2.0, rid, "w0")
    mirror.apply_ready(2.0, "late", 10, None)  # pooled after the round began
    mirror.apply_recompute(2.0, "r5")  # given back: pooled again, after the round began
    for rid in ["r0", "r1", "r2", "r3", "r4", "r5", "late", "x", "never"]:
        assert (rid in members) == (rid in at_start), rid
