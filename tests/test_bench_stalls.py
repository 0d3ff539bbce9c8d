"""`shadow bench tap`'s stall detection (`shadow.bench.stalls`): which measured intervals
a stall of the machine overlaps, and a real heartbeat process on this machine; and how it
splits the CPUs between vLLM and the measuring side."""

from __future__ import annotations

import os
import time

import numpy as np

from shadow.bench.stalls import STALL_S, Heartbeat, overlaps_stall


def test_an_interval_is_stalled_when_any_stall_overlaps_it():
    stalls = np.array([[10.0, 10.5], [20.0, 20.2], [30.0, 31.0]])
    starts = np.array([9.0, 10.6, 19.0, 20.1, 29.0, 5.0, 32.0, 10.5])
    ends = np.array([10.1, 19.9, 21.0, 20.15, 40.0, 9.99, 33.0, 11.0])
    expected = [True, False, True, True, True, False, False, False]
    assert overlaps_stall(starts, ends, stalls).tolist() == expected
    # an interval spanning several stalls, and no stalls at all
    assert overlaps_stall(np.array([0.0]), np.array([50.0]), stalls).tolist() == [True]
    assert not overlaps_stall(starts, ends, np.empty((0, 2))).any()


def test_the_heartbeat_sees_its_own_process_stopped(tmp_path):
    """SIGSTOP holds the heartbeat for 0.3 s: it reports a stall at least that long (a
    stall of the machine stops it the same way)."""
    import signal

    heartbeat = Heartbeat(tmp_path / "stalls.json").start()
    assert heartbeat.process is not None
    time.sleep(1.0)  # past its start-up
    before = time.perf_counter()
    os.kill(heartbeat.process.pid, signal.SIGSTOP)
    time.sleep(0.3)
    os.kill(heartbeat.process.pid, signal.SIGCONT)
    time.sleep(0.2)
    stalls = heartbeat.stop()
    long = stalls[(stalls[:, 1] - stalls[:, 0]) >= 0.3]
    assert len(long) == 1 and long[0, 0] >= before - STALL_S


def test_vllm_and_the_measuring_side_get_cpus_of_their_own():
    """`bench tap` splits the CPUs it may use: disjoint, together all of them, vLLM's
    half first; a single CPU is not split."""
    from shadow.bench.tap import split_cpus

    mine = os.sched_getaffinity(0)
    split = split_cpus()
    if len(mine) < 2:
        assert split is None
        return
    assert split is not None
    engine, rest = split
    assert engine and rest and not engine & rest and engine | rest == mine
    assert max(engine) < min(rest) and len(engine) == len(mine) // 2
    try:  # one CPU: nothing to split
        os.sched_setaffinity(0, {min(mine)})
        assert split_cpus() is None
    finally:
        os.sched_setaffinity(0, mine)
