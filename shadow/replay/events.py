"""The event stream of what a replay simulated, in the schema of ARCHITECTURE.md.

This is how the service gets recorded traffic with known ground truth: a replay of the
incumbent, emitted as `worker`, `ready`, `dispatch`, `progress`, `finish` and
`engine_step` events, must fold back into exactly the loads the engine computed.

Order: by time; at equal times the events of a step that just ended (`engine_step`,
`progress`, `finish`) come before arrivals and the dispatches of the next step.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from shadow.policies.snapshot import NO_KEY
from shadow.replay.engine import ReplayResult

EVENT_ORDER = {"worker": 0, "engine_step": 1, "progress": 2, "finish": 3, "ready": 4, "dispatch": 5}
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


def iter_events(
    result: ReplayResult,
    prompt_keys: np.ndarray,
    *,
    fleet: str = "default",
    progress_every: int = DEFAULT_PROGRESS_EVERY,
) -> Iterator[dict]:
    """Every event of one replay, in stream order, each with a `seq` from 1."""
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
    names = {code: name for name, code in EVENT_ORDER.items()}
    load = result.worker_load
    active = result.worker_active

    for seq, at in enumerate(order.tolist(), start=1):
        kind = names[int(kinds[at])]
        ts = float(stamps[at])
        a, b = int(first[at]), int(second[at])
        event: dict = {"type": kind, "ts": ts, "fleet": fleet, "seq": seq}
        if kind == "engine_step":
            event |= {
                "worker": b,
                "step": a,
                "duration_ms": float(result.step_duration_ms[a]),
                "running": int(active[a, b]),
                "kv_tokens": int(load[a, b]),
            }
        elif kind == "progress":
            event |= {"request_id": request_id(a), "generated": b}
        elif kind == "finish":
            event |= {
                "request_id": request_id(a),
                "output_tokens": int(result.output_tokens[a]),
                "reason": "stop",
            }
        elif kind == "ready":
            event |= {"request_id": request_id(a), "prompt_tokens": int(result.prompt_tokens[a])}
            hashed = prompt_hash(int(prompt_keys[a]))
            if hashed is not None:
                event["prompt_hash"] = hashed
        elif kind == "dispatch":
            event |= {
                "request_id": request_id(a),
                "worker": int(result.worker[a]),
                "policy": result.policy,
            }
        else:
            event |= {"worker": a, "capacity": result.batch, "state": "up"}
        yield event


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
