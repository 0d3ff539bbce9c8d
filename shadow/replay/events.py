"""The event stream of what a replay simulated, in the schema of ARCHITECTURE.md.

This is how the service gets recorded traffic with known ground truth: a replay of the
incumbent, emitted as `worker`, `ready`, `dispatch`, `progress`, `finish` and
`engine_step` events, must fold back into exactly the loads the engine computed.

Order: by time, then `shadow.events.EVENT_ORDER`: at equal times the events of a step
that just ended (`engine_step`, `progress`, `finish`) come before arrivals and the
dispatches of the next step.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from shadow.events import (
    EVENT_ORDER,
    DispatchEvent,
    EngineStepEvent,
    Event,
    FinishEvent,
    ProgressEvent,
    ReadyEvent,
    WorkerEvent,
    event_to_json,
)
from shadow.policies.snapshot import NO_KEY
from shadow.replay.records import ReplayResult

DEFAULT_PROGRESS_EVERY = 64


def prompt_hash(key: int) -> str | None:
    """The `prompt_hash` field for an int64 prompt key (16 hex digits)."""
    return None if key == NO_KEY else f"{key & 0xFFFFFFFFFFFFFFFF:016x}"


def request_id(index: int) -> str:
    return f"req-{index}"


def _progress_points(output: np.ndarray, every: int) -> tuple[np.ndarray, np.ndarray]:
    """(request, cumulative generated) at every `every` tokens and at the last token."""
    marks = output // every
    needs_final = (output % every) != 0
    counts = marks + needs_final
    rows = np.repeat(np.arange(output.shape[0]), counts)
    starts = np.cumsum(counts) - counts
    position = np.arange(rows.shape[0]) - np.repeat(starts, counts)
    generated = np.minimum((position + 1) * every, output[rows])
    return rows, generated


def replay_events(
    result: ReplayResult,
    prompt_keys: np.ndarray,
    *,
    fleet: str = "default",
    progress_every: int = DEFAULT_PROGRESS_EVERY,
) -> Iterator[Event]:
    """Every event of one replay as its struct, in stream order, each with a `seq` from 1."""
    if progress_every < 1:
        raise ValueError("progress_every must be >= 1")
    ends = result.step_end_ms / 1000.0
    trace = np.flatnonzero(~result.from_initial & (result.admit_step >= 0))
    columns: list[tuple[str, np.ndarray, np.ndarray, np.ndarray]] = []  # type, ts, a, b

    workers = np.arange(result.workers)
    columns.append(("worker", np.zeros(result.workers), workers, workers))
    steps, per_worker = np.meshgrid(np.arange(result.steps), workers, indexing="ij")
    columns.append(
        ("engine_step", np.repeat(ends, result.workers), steps.ravel(), per_worker.ravel())
    )
    rows, generated = _progress_points(result.output_tokens[trace], progress_every)
    requests = trace[rows]
    columns.append(
        ("progress", ends[result.admit_step[requests] + generated - 1], requests, generated)
    )
    columns.append(("finish", ends[result.finish_step[trace]], trace, trace))
    columns.append(("ready", result.ready_ms[trace] / 1000.0, trace, trace))
    columns.append(("dispatch", result.admit_ms[trace] / 1000.0, trace, trace))

    kinds = np.concatenate([np.full(c[1].shape[0], EVENT_ORDER[c[0]]) for c in columns])
    stamps = np.concatenate([c[1] for c in columns])
    first = np.concatenate([c[2] for c in columns])
    second = np.concatenate([c[3] for c in columns])
    order = np.lexsort((second, first, kinds, stamps))
    build = _builders(result, prompt_keys, fleet)
    for seq, at in enumerate(order.tolist(), start=1):
        yield build[int(kinds[at])](seq, float(stamps[at]), int(first[at]), int(second[at]))


Builder = Callable[[int, float, int, int], Event]


def _builders(result: ReplayResult, prompt_keys: np.ndarray, fleet: str) -> dict[int, Builder]:
    """Kind (its `EVENT_ORDER` code) -> the maker of its event from (seq, ts, a, b), where
    `a`, `b` are the two numbers its column holds (see `replay_events`)."""
    load, active = result.worker_load, result.worker_active

    def worker(seq: int, ts: float, a: int, b: int) -> Event:
        return WorkerEvent(ts=ts, fleet=fleet, seq=seq, worker=a, capacity=result.batch, state="up")

    def engine_step(seq: int, ts: float, a: int, b: int) -> Event:
        return EngineStepEvent(
            ts=ts, fleet=fleet, seq=seq, worker=b, step=a,
            duration_ms=float(result.step_duration_ms[a]), running=int(active[a, b]),
            kv_tokens=int(load[a, b]),
        )  # fmt: skip

    def progress(seq: int, ts: float, a: int, b: int) -> Event:
        return ProgressEvent(ts=ts, fleet=fleet, seq=seq, request_id=request_id(a), generated=b)

    def finish(seq: int, ts: float, a: int, b: int) -> Event:
        return FinishEvent(
            ts=ts, fleet=fleet, seq=seq, request_id=request_id(a),
            output_tokens=int(result.output_tokens[a]), reason="stop",
        )  # fmt: skip

    def ready(seq: int, ts: float, a: int, b: int) -> Event:
        return ReadyEvent(
            ts=ts, fleet=fleet, seq=seq, request_id=request_id(a),
            prompt_tokens=int(result.prompt_tokens[a]),
            prompt_hash=prompt_hash(int(prompt_keys[a])),
        )  # fmt: skip

    def dispatch(seq: int, ts: float, a: int, b: int) -> Event:
        return DispatchEvent(
            ts=ts, fleet=fleet, seq=seq, request_id=request_id(a), worker=int(result.worker[a]),
            policy=result.policy,
        )  # fmt: skip

    makers = {"worker": worker, "engine_step": engine_step, "progress": progress,
              "finish": finish, "ready": ready, "dispatch": dispatch}  # fmt: skip
    return {EVENT_ORDER[kind]: make for kind, make in makers.items()}


def as_written(event: Event) -> dict[str, Any]:
    """The JSON form a replay's events have always had in its files: `event_to_json`
    without the one `source` (never named) and with the workers as the JSON integers the
    replay numbers them by (the structs hold ids as text)."""
    data = event_to_json(event)
    del data["source"]
    if "worker" in data:
        data["worker"] = int(data["worker"])
    return data


def iter_events(
    result: ReplayResult,
    prompt_keys: np.ndarray,
    *,
    fleet: str = "default",
    progress_every: int = DEFAULT_PROGRESS_EVERY,
) -> Iterator[dict]:
    """Every event of one replay in its written JSON form (`as_written`), in stream order."""
    for event in replay_events(result, prompt_keys, fleet=fleet, progress_every=progress_every):
        yield as_written(event)


def write_events(
    path: Path,
    result: ReplayResult,
    prompt_keys: np.ndarray,
    *,
    fleet: str = "default",
    progress_every: int = DEFAULT_PROGRESS_EVERY,
) -> int:
    """Write the stream as NDJSON; returns the number of events."""
    count = 0
    with path.open("w") as out:
        for event in iter_events(result, prompt_keys, fleet=fleet, progress_every=progress_every):
            out.write(json.dumps(event, separators=(",", ":")))
            out.write("\n")
            count += 1
    return count
