"""The finished-request ledger: found by id exactly as a dict of records would be, forgotten
by time, writes kept, and small (the reason it exists)."""

from __future__ import annotations

import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shadow.stream import finished_ledger
from shadow.stream.finished_ledger import FinishedLedger
from shadow.stream.mirror import FleetMirror

IDS = [f"req-{i}" for i in range(12)]

OPERATION = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(IDS), st.integers(0, 60)),
    st.tuples(st.just("forget"), st.just(""), st.integers(0, 60)),
    st.tuples(st.just("seen"), st.sampled_from(IDS), st.integers(0, 99) | st.just(2**40)),
    st.tuples(st.just("correct"), st.sampled_from(IDS), st.integers(0, 99) | st.just(2**33)),
)


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of 3 rows, so a few dozen operations seal, index and drop many of them; and
    3 reason codes (None and two), so most reasons are kept beside their rows."""
    monkeypatch.setattr(finished_ledger, "CHUNK_ROWS", 3)
    monkeypatch.setattr(finished_ledger, "_REASON_CODES", 3)


def _record(rid: str, left: int) -> dict:
    ghost = left % 7 == 0
    return {
        "left_ts": float(left),
        "finish_ts": None if ghost else float(left),
        # counts past 32 bits (the schema allows them) are kept beside the row
        "prompt_tokens": 10 * left + 1 if left % 5 else 2**45 + left,
        "prompt_key": -left,
        "output_tokens": None if ghost else left + 2,
        "estimated": left % 2 == 0,
        "reason": None if ghost else ("stop", "length", "tool_calls", f"odd-{left}")[left % 4],
        "finish_ref": 1000 + left,
        "progress_seen": -1,
    }


# the fixture only sets a constant, the same for every example
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.lists(OPERATION, max_size=120))
def test_the_ledger_answers_as_a_dict_of_records(tiny_chunks, operations) -> None:
    """The model: a dict of records; `forget(t)` drops every record that left before t and
    counts them; an id is added again only once forgotten (as the mirror does)."""
    ledger = FinishedLedger()
    model: dict[str, dict] = {}
    for kind, rid, value in operations:
        if kind == "add":
            if rid in model:
                continue  # the mirror never finishes a request it still remembers
            record = _record(rid, value)
            fields = {k: v for k, v in record.items() if k not in ("left_ts", "progress_seen")}
            ledger.add(rid, record["left_ts"], **fields)
            model[rid] = record
        elif kind == "forget":
            gone = [r for r, rec in model.items() if rec["left_ts"] < value]
            for r in gone:
                del model[r]
            assert ledger.forget(float(value)) == len(gone)
        elif rid in model:
            view = ledger.get(rid)
            assert view is not None
            if kind == "seen":
                view.progress_seen = value
                model[rid]["progress_seen"] = value
            else:
                view.output_tokens, view.estimated = value, False
                model[rid]["output_tokens"], model[rid]["estimated"] = value, False
        assert len(ledger) == len(model)
        for r in IDS:
            view = ledger.get(r)
            assert (r in ledger) == (r in model) == (view is not None), r
            if view is not None:
                got = {key: getattr(view, key) for key in model[r]}
                assert got == model[r] and view.request_id == r and view.finished
                assert view.worker is None and view.slot == -1
    held_chunks = len(ledger._chunks)
    assert held_chunks <= 1 + -(-len(ledger) // 3) + len(model)  # dropped once all forgotten


def test_a_view_does_not_outlive_its_chunk(tiny_chunks) -> None:
    ledger = FinishedLedger()
    for i in range(7):
        ledger.add(f"r{i}", float(i), prompt_tokens=1, prompt_key=0, output_tokens=1,
                   estimated=False, finish_ts=float(i), reason="stop", finish_ref=i)  # fmt: skip
    old = ledger.get("r0")
    assert old is not None and old.left_ts == 0.0
    assert ledger.forget(3.0) == 3 and "r0" not in ledger and "r3" in ledger
    with pytest.raises(LookupError, match="dropped by forget"):
        old.left_ts  # noqa: B018


def test_a_finished_request_costs_a_fraction_of_an_object() -> None:
    """20,000 finished requests held by a mirror: under 65 bytes each (61 measured, the
    chunk being filled keeping a dict of its rows), where the `__slots__` record with its
    dict entry, id and numbers took ~400, and the columns all 64-bit 80."""
    mirror = FleetMirror("f")
    mirror.apply_worker(0.0, "w0", 1, "up")
    ids = [f"cmpl-{i:012d}-0" for i in range(20_000)]  # made before the measure starts
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i, rid in enumerate(ids):
            ts = 1.0 + i
            mirror.apply_ready(ts, rid, 500 + i, None)
            mirror.apply_dispatch(ts, rid, "w0")
            mirror.apply_engine_step(ts + 0.5, "w0", i, ts + 0.1, 1)
            mirror.apply_finish(ts + 0.6, rid, 700 + i % 50, "stop")
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(mirror.requests) == 20_000 and mirror.running == 0
    assert mirror.requests[ids[123]].output_tokens == 723
    assert held / len(ids) < 65, f"{held / len(ids):.0f} bytes a finished request"
