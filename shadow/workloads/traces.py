"""Request traces on disk -> `Workload`, plus re-timing to a target load.

Formats (`format=`):

- `azure`: the Azure LLM inference traces, CSV `TIMESTAMP,ContextTokens,GeneratedTokens`
  (2023: `2023-11-16 18:15:46.6805900`, seven fractional digits; 2024: with `+00:00`).
- `mooncake`: Mooncake FAST'25 JSONL, `timestamp` (ms), `input_length`, `output_length`,
  `hash_ids`; the prompt key is the stable hash of the whole `hash_ids` list.
- `jsonl` / `csv`: generic, fields `ready_s` (or `timestamp`, seconds), `prompt_tokens`,
  `output_tokens` and optional `prompt_key` (an integer is kept, any other text hashed).
- `auto`: picks by extension, then by the CSV header or the first JSON object.

Every loaded workload starts at `ready_s[0] == 0.0` (after filtering), because a replay
should not idle through whatever came before the first request it keeps. A malformed row
raises `TraceError` naming file, line and field, or is skipped and counted with
`skip_bad=True`; a request with 0 output tokens is malformed, since replay decodes at
least one token per request.
"""

from __future__ import annotations

import contextlib
import csv
import datetime as dt
import gzip
import io
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from shadow.policies.snapshot import NO_KEY, prompt_key_id
from shadow.replay.workload import StepModel, Workload

#: Formats `load_trace` reads; `auto` picks one of the others.
FORMATS = ("auto", "azure", "mooncake", "jsonl", "csv")

#: `resolve_workload` treats a spec with this prefix as a synthetic preset name.
SYNTHETIC_PREFIX = "synthetic:"

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_JSON_SUFFIXES = {".jsonl", ".json", ".ndjson"}

_TIMESTAMP_RE = re.compile(
    r"\s*(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d+))?"
    r"\s*(Z|[+-]\d{2}:?\d{2})?\s*$",
    re.IGNORECASE,
)
_INT_RE = re.compile(r"\s*\+?\d+\s*$")
_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, line and field."""


@dataclass(frozen=True)
class LoadResult:
    """A loaded workload, how many malformed rows were skipped, and where it came from.

    `source` reads `FORMAT:PATH` for files (`azure:/data/conv.csv`) and
    `synthetic:PRESET seed=N` for generated workloads.
    """

    workload: Workload
    skipped: int
    source: str


class _BadRow(Exception):
    """One malformed row; turned into a `TraceError` (or counted) by the row loop."""

    def __init__(self, field: str | None, problem: str) -> None:
        super().__init__(problem)
        self.field = field
        self.problem = problem


# Parsed row: (ready time in integer ns, prompt tokens, output tokens, prompt key). Integer
# ns keep the 100 ns spacing of the Azure timestamps exact before they are made relative.
_Row = tuple[int, int, int, int]


# --- field parsers -----------------------------------------------------------------------


def _describe(value: object) -> str:
    return repr(value) if isinstance(value, str) else json.dumps(value)


def _count(field: str, value: object, *, minimum: int = 0) -> int:
    """A token count: a non-negative integer (an integral float such as `12.0` is accepted)."""
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = int(value) if value.is_integer() else None
    elif isinstance(value, str):
        if _INT_RE.match(value):
            number = int(value)
        else:
            try:
                as_float = float(value)
            except ValueError:
                as_float = math.nan
            number = int(as_float) if as_float.is_integer() else None
    if number is None or number < 0:
        raise _BadRow(field, f"expected a non-negative integer, got {_describe(value)}")
    if number < minimum:
        raise _BadRow(
            field, f"expected at least {minimum} (a request decodes >= 1 token), got {number}"
        )
    return number


def _timestamp_ns(field: str, value: object) -> int:
    """An ISO timestamp as exact integer ns since the epoch (UTC; naive means UTC).

    Hand-parsed: `datetime.fromisoformat` rejects the 7 fractional digits of the Azure 2023
    trace on Python 3.11, and integer nanoseconds keep sub-microsecond spacing exact.
    """
    match = _TIMESTAMP_RE.match(value) if isinstance(value, str) else None
    if match is None:
        raise _BadRow(field, f"expected a timestamp like 2023-11-16 18:15:46.68, got {value!r}")
    year, month, day, hour, minute, second, frac, offset = match.groups()
    try:
        days = dt.date(int(year), int(month), int(day)).toordinal() - _EPOCH_ORDINAL
    except ValueError:
        raise _BadRow(field, f"expected a valid date, got {value!r}") from None
    if int(hour) > 23 or int(minute) > 59 or int(second) > 60:
        raise _BadRow(field, f"expected a valid time of day, got {value!r}")
    seconds = days * 86400 + int(hour) * 3600 + int(minute) * 60 + int(second)
    if offset and offset.upper() != "Z":
        digits = offset[1:].replace(":", "")
        shift = int(digits[:2]) * 3600 + int(digits[2:]) * 60
        seconds -= shift if offset[0] == "+" else -shift
    nanos = seconds * 1_000_000_000 + int((frac or "0")[:9].ljust(9, "0"))
    if not -(2**63) <= nanos < 2**63:
        raise _BadRow(field, f"expected a timestamp between 1678 and 2262, got {value!r}")
    return nanos


def _seconds_ns(field: str, value: object) -> int:
    """Generic ready time: seconds as a number, returned as integer ns like the timestamps."""
    number = math.nan
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        with contextlib.suppress(ValueError):
            number = float(value)
    if not math.isfinite(number) or abs(number) >= 9.2e9:
        raise _BadRow(field, f"expected a number of seconds, got {_describe(value)}")
    return round(number * 1e9)


def _key(field: str, value: object) -> int:
    """A prompt key: empty/null means none; an integer is kept; any other text is hashed."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return int(NO_KEY)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        value = int(value)
    if isinstance(value, (bool, float, list, dict)):
        raise _BadRow(field, f"expected an integer or a string, got {_describe(value)}")
    if isinstance(value, int):
        if value == NO_KEY:
            return int(NO_KEY)
        if not -(2**63) <= value < 2**63:
            raise _BadRow(field, f"expected an int64 key, got {value}")
        return value
    return prompt_key_id(str(value).strip())


# --- row sources ---------------------------------------------------------------------------


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def _inner_suffix(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def _normalise(name: str) -> str:
    return name.strip().lower()


def _csv_rows(
    handle: IO[str],
    label: str,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
    any_of: tuple[str, ...] = (),
) -> Iterator[tuple[int, dict[str, str | None]]]:
    """Yield (line number, {column: text}) per data row; a short row has None in its gaps.

    The header must hold every `required` column and, if given, one of `any_of`.
    """
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{label}: empty file, expected a header line")
    positions = {_normalise(name): index for index, name in enumerate(header)}
    missing = [name for name in required if _normalise(name) not in positions]
    if any_of and not any(_normalise(name) in positions for name in any_of):
        missing.append(" or ".join(any_of))
    if missing:
        raise TraceError(
            f"{label} line 1: missing column {missing[0]!r} (header: {','.join(header)})"
        )
    wanted = {
        name: positions[_normalise(name)]
        for name in required + any_of + optional
        if _normalise(name) in positions
    }
    for cells in reader:
        if not cells or (len(cells) == 1 and not cells[0].strip()):
            continue
        yield (
            reader.line_num,
            {name: cells[index] if index < len(cells) else None for name, index in wanted.items()},
        )


def _json_rows(handle: IO[str]) -> Iterator[tuple[int, dict[str, Any] | _BadRow]]:
    for line_number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            yield line_number, _BadRow(None, f"invalid JSON ({error.msg})")
            continue
        if not isinstance(record, dict):
            yield line_number, _BadRow(None, "expected a JSON object")
            continue
        yield line_number, record


def _need(record: dict[str, Any], field: str) -> Any:
    value = record.get(field)
    if value is None:
        raise _BadRow(field, "missing")
    return value


# --- per-format row parsers --------------------------------------------------------------


def _azure_row(row: dict[str, Any]) -> _Row:
    stamp = _need(row, "TIMESTAMP")
    prompt = _count("ContextTokens", _need(row, "ContextTokens"))
    output = _count("GeneratedTokens", _need(row, "GeneratedTokens"), minimum=1)
    return _timestamp_ns("TIMESTAMP", stamp), prompt, output, int(NO_KEY)


def _mooncake_row(row: dict[str, Any]) -> _Row:
    stamp = _need(row, "timestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
        raise _BadRow("timestamp", f"expected milliseconds (a number), got {_describe(stamp)}")
    if not math.isfinite(stamp):
        raise _BadRow("timestamp", f"expected a finite number, got {_describe(stamp)}")
    prompt = _count("input_length", _need(row, "input_length"))
    output = _count("output_length", _need(row, "output_length"), minimum=1)
    hash_ids = row.get("hash_ids")
    if hash_ids is None or hash_ids == []:
        key = int(NO_KEY)
    elif isinstance(hash_ids, list):
        key = prompt_key_id(",".join(map(str, hash_ids)))
    else:
        raise _BadRow("hash_ids", f"expected a list, got {_describe(hash_ids)}")
    if abs(stamp) >= 9.2e12:
        raise _BadRow("timestamp", f"expected milliseconds, got {_describe(stamp)}")
    ready = stamp * 1_000_000 if isinstance(stamp, int) else round(stamp * 1e6)
    return ready, prompt, output, key


def _generic_row(row: dict[str, Any]) -> _Row:
    if row.get("ready_s") not in (None, ""):
        ready = _seconds_ns("ready_s", row["ready_s"])
    elif row.get("timestamp") not in (None, ""):
        ready = _seconds_ns("timestamp", row["timestamp"])
    else:
        raise _BadRow("ready_s", "missing (give ready_s or timestamp, in seconds)")
    prompt = _count("prompt_tokens", _need(row, "prompt_tokens"))
    output = _count("output_tokens", _need(row, "output_tokens"), minimum=1)
    key = _key("prompt_key", row.get("prompt_key"))
    return ready, prompt, output, key


# --- loading ---------------------------------------------------------------------------


def _detect(path: Path, label: str) -> str:
    suffix = _inner_suffix(path)
    with _open_text(path) as handle:
        first = ""
        for line in handle:
            if line.strip():
                first = line.strip()
                break
    if not first:
        raise TraceError(f"{label}: empty file, no requests")
    if suffix in _JSON_SUFFIXES or (suffix != ".csv" and first.startswith("{")):
        try:
            record = json.loads(first)
        except json.JSONDecodeError:
            record = {}
        if isinstance(record, dict) and {"input_length", "output_length"} <= set(record):
            return "mooncake"
        return "jsonl"
    header = {_normalise(cell) for cell in next(csv.reader([first]))}
    if {_normalise(name) for name in _AZURE_COLUMNS} <= header:
        return "azure"
    return "csv"


def _parse(path: Path, fmt: str, label: str, skip_bad: bool) -> tuple[list[_Row], int]:
    rows: list[_Row] = []
    skipped = 0

    def consume(source: Iterator[tuple[int, Any]], parse: Callable[[dict[str, Any]], _Row]) -> None:
        nonlocal skipped
        for line_number, record in source:
            try:
                if isinstance(record, _BadRow):
                    raise record
                rows.append(parse(record))
            except _BadRow as bad:
                if skip_bad:
                    skipped += 1
                    continue
                where = f"{label} line {line_number}"
                field = f" field {bad.field!r}:" if bad.field else ""
                raise TraceError(f"{where}:{field} {bad.problem}") from None

    with _open_text(path) as handle:
        try:
            if fmt == "azure":
                consume(_csv_rows(handle, label, _AZURE_COLUMNS), _azure_row)
            elif fmt == "csv":
                columns = ("prompt_tokens", "output_tokens")
                times = ("ready_s", "timestamp")
                source = _csv_rows(handle, label, columns, ("prompt_key",), times)
                consume(source, _generic_row)
            elif fmt == "mooncake":
                consume(_json_rows(handle), _mooncake_row)
            else:
                consume(_json_rows(handle), _generic_row)
        except UnicodeDecodeError as error:
            raise TraceError(f"{label}: not UTF-8 text ({error.reason})") from None
        except csv.Error as error:
            raise TraceError(f"{label}: unreadable CSV ({error})") from None
    return rows, skipped


def _filtered(workload: Workload, output_min: int | None, limit: int | None) -> Workload:
    """Apply `output_min` then `limit` (in ready order) and re-zero the first ready time."""
    keep = np.ones(len(workload), dtype=bool)
    if output_min is not None:
        keep &= workload.output_tokens >= output_min
    ready = workload.ready_s[keep]
    prompt = workload.prompt_tokens[keep]
    output = workload.output_tokens[keep]
    keys = workload.prompt_keys[keep]
    if limit is not None:
        ready, prompt, output, keys = ready[:limit], prompt[:limit], output[:limit], keys[:limit]
    if ready.shape[0]:
        ready = ready - ready[0]
    return Workload(workload.name, ready, prompt, output, keys)


def _check_filters(output_min: int | None, limit: int | None) -> None:
    if output_min is not None and output_min < 0:
        raise ValueError(f"output_min must be >= 0, got {output_min}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")


def load_trace(
    path: str | Path,
    format: str = "auto",
    *,
    output_min: int | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
) -> LoadResult:
    """Read a trace file into a `Workload` sorted by ready time, starting at 0 s.

    `output_min` keeps requests with `output_tokens >= output_min` (not counted as
    skipped); `limit` then keeps the first N in ready order.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown trace format {format!r}; choose from {', '.join(FORMATS)}")
    _check_filters(output_min, limit)
    path = Path(path)
    label = str(path)
    if not path.is_file():
        problem = "is not a file" if path.exists() else "no such file"
        raise TraceError(f"{label}: {problem}")
    try:
        fmt = _detect(path, label) if format == "auto" else format
        rows, skipped = _parse(path, fmt, label, skip_bad)
    except UnicodeDecodeError as error:
        raise TraceError(f"{label}: not UTF-8 text ({error.reason})") from None
    except OSError as error:
        raise TraceError(f"{label}: cannot read ({error.strerror or error})") from None
    if not rows and not skipped:
        raise TraceError(f"{label}: no requests")
    nanos = np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows))
    ready = (nanos - nanos.min()).astype(np.float64) / 1e9 if rows else nanos.astype(float)
    name = path.name.removesuffix(".gz").rsplit(".", 1)[0] or path.name
    workload = Workload.from_arrays(
        name,
        ready,
        np.fromiter((row[1] for row in rows), dtype=np.int64, count=len(rows)),
        np.fromiter((row[2] for row in rows), dtype=np.int64, count=len(rows)),
        np.fromiter((row[3] for row in rows), dtype=np.int64, count=len(rows)),
    )
    return LoadResult(_filtered(workload, output_min, limit), skipped, f"{fmt}:{label}")


def write_trace(workload: Workload, path: str | Path, format: str = "auto") -> None:
    """Write a workload as generic `jsonl` or `csv` (by extension under `auto`).

    The inverse of `load_trace` for the generic formats, so a generated or filtered workload
    can be saved and replayed later; a missing key (`NO_KEY`) is written as empty/null.
    """
    path = Path(path)
    if format == "auto":
        format = "jsonl" if _inner_suffix(path) in _JSON_SUFFIXES else "csv"
    if format not in ("jsonl", "csv"):
        raise ValueError(f"write_trace writes jsonl or csv, not {format!r}")
    keys: list[int | None] = [None if k == NO_KEY else int(k) for k in workload.prompt_keys]
    columns = zip(
        workload.ready_s.tolist(),
        workload.prompt_tokens.tolist(),
        workload.output_tokens.tolist(),
        keys,
        strict=True,
    )
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", encoding="utf-8", newline="") as handle:
        if format == "jsonl":
            for ready, prompt, output, key in columns:
                record = {
                    "ready_s": ready,
                    "prompt_tokens": prompt,
                    "output_tokens": output,
                    "prompt_key": key,
                }
                handle.write(json.dumps(record) + "\n")
        else:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(["ready_s", "prompt_tokens", "output_tokens", "prompt_key"])
            for ready, prompt, output, key in columns:
                writer.writerow([repr(ready), prompt, output, "" if key is None else key])


# --- re-timing -----------------------------------------------------------------------------


def target_arrival_rate(
    workload: Workload, load: float, *, workers: int, batch: int, step_model: StepModel
) -> float:
    """Requests per second that make `load` (1.0 = full-batch output capacity) on the fleet.

    A full worker holds `batch` requests that are on average half-way through decoding, so
    `batch * (mean_prompt + mean_output / 2)` KV tokens; each step then emits `batch`
    tokens per worker. Capacity in output tokens/s divided by the mean output length gives
    the request rate the fleet can sustain; `load` scales it.
    """
    if not math.isfinite(load) or load <= 0:
        raise ValueError(f"load must be a positive number, got {load}")
    if workers < 1 or batch < 1:
        raise ValueError(f"workers and batch must be >= 1, got {workers} and {batch}")
    if len(workload) == 0:
        raise ValueError("cannot size a load for an empty workload")
    mean_prompt = float(workload.prompt_tokens.mean())
    mean_output = float(workload.output_tokens.mean())
    step_s = step_model.step_ms(batch * (mean_prompt + mean_output / 2)) / 1000.0
    capacity_tok_s = workers * batch / step_s
    return load * capacity_tok_s / mean_output


def retime(
    workload: Workload,
    *,
    rate_scale: float | None = None,
    load: float | None = None,
    workers: int | None = None,
    batch: int | None = None,
    step_model: StepModel | None = None,
) -> Workload:
    """Stretch or squeeze arrival times, keeping their pattern (bursts stay bursts).

    `rate_scale=X` multiplies the arrival rate by X. `load=X` sets the mean arrival rate
    `(n-1)/(last-first)` to `target_arrival_rate(...)`, so 1.0 means the fleet's output
    capacity at full batch; arrivals all at one instant are spaced evenly at that rate.
    """
    if (rate_scale is None) == (load is None):
        raise ValueError("retime needs exactly one of rate_scale or load")
    ready = workload.ready_s
    n = ready.shape[0]
    if rate_scale is not None:
        if not math.isfinite(rate_scale) or rate_scale <= 0:
            raise ValueError(f"rate_scale must be a positive number, got {rate_scale}")
        new_ready = ready if n == 0 else ready[0] + (ready - ready[0]) / rate_scale
    else:
        assert load is not None
        if workers is None or batch is None or step_model is None:
            raise ValueError("retime(load=...) needs workers, batch and step_model")
        rate = target_arrival_rate(
            workload, load, workers=workers, batch=batch, step_model=step_model
        )
        if n < 2:
            new_ready = ready.copy()
        else:
            span = float(ready[-1] - ready[0])
            if span > 0:
                new_ready = ready[0] + (ready - ready[0]) * ((n - 1) / rate / span)
            else:
                new_ready = ready[0] + np.arange(n, dtype=np.float64) / rate
    return Workload(
        workload.name,
        np.asarray(new_ready, dtype=np.float64),
        workload.prompt_tokens,
        workload.output_tokens,
        workload.prompt_keys,
    )


def resolve_workload(
    spec: str,
    *,
    format: str = "auto",
    seed: int = 0,
    output_min: int | None = None,
    limit: int | None = None,
    skip_bad: bool = False,
) -> LoadResult:
    """`synthetic:PRESET` generates a preset (with `seed`); anything else is a trace path."""
    if spec.startswith(SYNTHETIC_PREFIX):
        from shadow.workloads.synthetic import generate

        _check_filters(output_min, limit)
        preset = spec.removeprefix(SYNTHETIC_PREFIX)
        workload = _filtered(generate(preset, seed=seed), output_min, limit)
        return LoadResult(workload, 0, f"{SYNTHETIC_PREFIX}{preset} seed={seed}")
    return load_trace(spec, format, output_min=output_min, limit=limit, skip_bad=skip_bad)
