"""`python -m shadow.bench.parse`: events per second of `parse_ndjson`."""

from __future__ import annotations

import json
import math
import time

from shadow.events import parse_ndjson


def bench_parse(n: int = 200_000, *, batch: int = 10_000) -> float:
    """Events per second of `parse_ndjson` on a realistic mix of replay-emitter shapes.

    The stream arrives as bodies of `batch` lines (an HTTP batch, an `iter_file` batch) and
    each batch's events are dropped after parsing, as a service folding them into state
    does; `batch=n` parses one body and holds every event, which measures the cyclic
    garbage collector as much as parsing (about 40% slower).
    """

    samples = [
        {"type": "engine_step", "ts": 1.25, "fleet": "default", "seq": 1, "worker": 3,
         "step": 120, "duration_ms": 61.5, "running": 64, "kv_tokens": 331000},
        {"type": "progress", "ts": 1.25, "fleet": "default", "seq": 2, "request_id": "req-17",
         "generated": 128},
        {"type": "ready", "ts": 1.3, "fleet": "default", "seq": 3, "request_id": "req-18",
         "prompt_tokens": 4652, "prompt_hash": "00ff00ff00ff00ff"},
        {"type": "dispatch", "ts": 1.31, "fleet": "default", "seq": 4, "request_id": "req-18",
         "worker": 2, "policy": "jsq"},
        {"type": "finish", "ts": 1.4, "fleet": "default", "seq": 5, "request_id": "req-9",
         "output_tokens": 1052, "reason": "stop"},
    ]  # fmt: skip
    weights = [8, 6, 1, 1, 1]  # engine_step and progress dominate real streams
    mix = [json.dumps(s) for s, w in zip(samples, weights, strict=True) for _ in range(w)]
    lines = [mix[i % len(mix)] for i in range(n)]
    bodies = [("\n".join(lines[i : i + batch]) + "\n").encode() for i in range(0, n, max(batch, 1))]
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        count = 0
        for body in bodies:
            events, errors = parse_ndjson(body)
            count += len(events) + len(errors)
            del events, errors
        best = min(best, time.perf_counter() - start)
        assert count == n
    return n / best


if __name__ == "__main__":
    print(f"parse_ndjson, 10,000-line bodies: {bench_parse():,.0f} events/s")
    print(f"parse_ndjson, one 200,000-line body held: {bench_parse(batch=200_000):,.0f} events/s")
