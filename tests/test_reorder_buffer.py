"""The reorder buffer releases exactly what a single sorted queue would, in the same
order, however fleets interleave and stragglers arrive."""

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.service.ingest.reorder import ReorderBuffer as _ReorderBuffer

# (fleet, ts, class order) of each pushed event; a release step is None
steps = st.lists(
    st.one_of(
        st.none(),
        st.tuples(st.sampled_from("abc"), st.integers(0, 40), st.integers(0, 5)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(
    steps=steps,
    horizons=st.lists(st.integers(-5, 45), min_size=1, max_size=30),
    shuffled=st.booleans() | st.randoms(use_true_random=False),
)
def test_release_order_and_lowest_id_match_a_sorted_reference(steps, horizons, shuffled):
    """Ids pushed in order (ingest), or not (a `shuffled` order: stored events replayed
    at start-up need not come in id order)."""
    buffer = _ReorderBuffer()
    reference: list[tuple] = []
    ids = list(range(1, len(steps) + 1))
    if not isinstance(shuffled, bool):
        shuffled.shuffle(ids)
    next_id = 1
    released = 0
    for step in steps:
        if step is None:
            upto = float(horizons[released % len(horizons)])
            released += 1
            expected = sorted(e for e in reference if e[0] <= upto)
            reference = [e for e in reference if e[0] > upto]
            assert buffer.pop_until(upto) == expected
        else:
            fleet, ts, order = step
            entry = (float(ts), order, ids[next_id - 1], SimpleNamespace(fleet=fleet))
            next_id += 1
            buffer.push(entry)
            reference.append(entry)
        assert len(buffer) == len(reference)
        assert buffer.lowest_id() == (min(e[2] for e in reference) if reference else None)
    assert buffer.pop_until(float("inf")) == sorted(reference)
    assert len(buffer) == 0 and buffer.lowest_id() is None


def test_an_in_order_fleet_stays_out_of_the_straggler_heap():
    buffer = _ReorderBuffer()
    for i in range(100):  # two fleets interleaved, each in order
        buffer.push((float(i), 0, 2 * i + 1, SimpleNamespace(fleet="a")))
        buffer.push((float(i) - 50.0, 0, 2 * i + 2, SimpleNamespace(fleet="b")))
    assert not buffer._late
    released = buffer.pop_until(20.0)
    assert [e[0] for e in released] == sorted(e[0] for e in released)
    assert len(released) == 21 + 71
