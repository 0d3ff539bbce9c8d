"""The dedupe memory of seqs and steps: exact within its window, small whatever comes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shadow.service.ingest.seen import RecentInts


class Exact:
    """The reference: every value ever seen; older than the window counts as seen."""

    def __init__(self, window: int) -> None:
        self.window, self.seen, self.high = window, set(), -1

    def add(self, value: int) -> bool:
        if value in self.seen or value < self.high - self.window:
            return False
        self.seen.add(value)
        self.high = max(self.high, value)
        return True


@settings(max_examples=400, deadline=None)
@given(
    window=st.integers(1, 50),
    values=st.lists(st.integers(0, 300), max_size=300),
)
def test_agrees_with_the_exact_set_within_the_window(window, values):
    memory, exact = RecentInts(window), Exact(window)
    for value in values:
        high = memory.high
        fresh = memory.add(value)
        if value >= high - window + 1 or value > high:  # exact within the window
            assert fresh == exact.add(value), (value, high)
        else:
            exact.add(value)
        assert memory.high == max(high, value)
        assert memory.gaps() <= window


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=200, unique=True))
def test_seed_restores_what_was_stored(stored):
    memory = RecentInts(1_000_000)
    memory.seed(set(stored))
    for value in stored:
        assert not memory.add(value)  # stored: a duplicate
    if stored:
        low, high = min(stored), max(stored)
        missing = [v for v in range(low, high) if v not in set(stored)][:50]
        for value in missing:
            assert memory.add(value)  # a gap: new once
            assert not memory.add(value)
        assert memory.restored_high == high


def test_a_jump_of_a_million_is_one_interval_and_late_batches_fill_it():
    memory = RecentInts(1_000_000)
    for value in range(2000):
        assert memory.add(value)
    assert memory.add(10_000_000)  # a source restarted at a higher count
    assert memory.add(10_000_005)  # a batch overtook the one before it
    # the first gap is clipped to the window below 10_000_005; the second holds 4
    assert len(memory._starts) == 2 and memory.gaps() == (1_000_000 - 5) + 4
    for value in range(10_000_001, 10_000_005):  # the late batch, in order
        assert memory.add(value)
        assert not memory.add(value)
    assert len(memory._starts) == 1
    assert not memory.add(1999)  # below the window's floor or seen: presumed seen
