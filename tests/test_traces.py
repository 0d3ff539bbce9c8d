import json
from pathlib import Path

import numpy as np
import pytest

from shadow.policies.snapshot import NO_KEY, prompt_key_id
from shadow.replay.workload import StepModel, Workload
from shadow.workloads.traces import (
    LoadResult,
    TraceError,
    load_trace,
    resolve_workload,
    retime,
    target_arrival_rate,
    write_trace,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
CONV_2023 = DATA / "azure-2023" / "AzureLLMInferenceTrace_conv.csv"
CODE_2023 = DATA / "azure-2023" / "AzureLLMInferenceTrace_code.csv"
SLICE_2024 = (
    DATA / "azure-2024-conv" / "AzureLLMInferenceTrace_conv_1week.slice_2024-05-12T0100-0103.csv"
)
MOONCAKE = DATA / "mooncake-fast25" / "synthetic_trace.jsonl"

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure_rows(count: int) -> list[str]:
    return [f"2023-11-16 18:15:{i:02d}.6805900,{100 + i},{10 + i}\n" for i in range(count)]


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines))
    return path


# --- the real traces ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "fmt", "rows"),
    [
        (CONV_2023, "azure", 19_366),
        (CODE_2023, "azure", 8_819),
        (SLICE_2024, "azure", 4_706),
        (MOONCAKE, "mooncake", 3_993),
    ],
)
def test_real_traces_load_whole_and_sorted_from_zero(path, fmt, rows):
    result = load_trace(path)
    workload = result.workload
    assert isinstance(result, LoadResult)
    assert result.source == f"{fmt}:{path}"
    assert result.skipped == 0
    assert len(workload) == rows
    assert workload.ready_s[0] == 0.0
    assert np.all(np.diff(workload.ready_s) >= 0)
    assert workload.output_tokens.min() >= 1
    assert load_trace(path, fmt).workload.ready_s.tolist() == workload.ready_s.tolist()


def test_azure_2023_keeps_seven_fractional_digits():
    workload = load_trace(CONV_2023).workload
    # 18:15:46.6805900 -> 18:15:50.9951690, then the last row at 19:14:08.4025270.
    assert workload.ready_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert workload.ready_s[-1] == pytest.approx(3501.721937, abs=1e-9)
    assert workload.prompt_tokens[:2].tolist() == [374, 396]
    assert workload.output_tokens[:2].tolist() == [44, 109]
    assert np.all(workload.prompt_keys == NO_KEY)
    assert workload.output_tokens.mean() == pytest.approx(211.1, abs=0.1)


def test_azure_2024_slice_spans_three_minutes():
    workload = load_trace(SLICE_2024).workload
    assert workload.ready_s[-1] == pytest.approx(179.912128, abs=1e-6)
    assert workload.output_tokens.max() == 1024 + 135  # 1,159, the slice's longest


def test_output_min_on_the_2024_slice_leaves_the_eleven_long_requests():
    result = load_trace(SLICE_2024, output_min=1001)
    workload = result.workload
    assert len(workload) == 11
    assert result.skipped == 0
    assert workload.prompt_tokens.mean() == pytest.approx(4484.0)
    assert workload.output_tokens.mean() == pytest.approx(1044.545, abs=1e-3)
    assert workload.ready_s[0] == 0.0  # re-zeroed at the first kept request (01:00:02.24)
    assert workload.ready_s[-1] == pytest.approx(145.266831, abs=1e-6)


def test_limit_keeps_the_first_rows_after_filtering():
    workload = load_trace(SLICE_2024, output_min=1001, limit=3).workload
    assert workload.prompt_tokens.tolist() == [5706, 3867, 3253]
    assert load_trace(SLICE_2024, limit=0).workload.ready_s.shape == (0,)


def test_mooncake_keys_hash_the_whole_hash_ids_list():
    workload = load_trace(MOONCAKE).workload
    with MOONCAKE.open() as handle:
        first = json.loads(handle.readline())
    assert workload.prompt_tokens[0] == first["input_length"] == 40160
    assert workload.prompt_keys[0] == prompt_key_id(",".join(map(str, first["hash_ids"])))
    assert workload.ready_s[-1] == pytest.approx(1022.025)  # timestamps are milliseconds
    assert workload.prompt_tokens.mean() == pytest.approx(15325.48, abs=0.01)
    assert np.all(workload.prompt_keys != NO_KEY)


# --- formats and detection ---------------------------------------------------------------


def test_offsets_are_applied_and_the_earliest_request_is_zero(tmp_path):
    path = _write(
        tmp_path / "offsets.csv",
        [
            AZURE_HEADER,
            "2024-05-12 02:00:01.5+01:00,10,5\n",  # 01:00:01.5 UTC
            "2024-05-12T01:00:00Z,20,6\n",
            "2024-05-12 01:00:03.000001,30,7\n",  # naive means UTC
        ],
    )
    workload = load_trace(path).workload
    assert workload.ready_s.tolist() == pytest.approx([0.0, 1.5, 3.000001], abs=1e-12)
    assert workload.prompt_tokens.tolist() == [20, 10, 30]


def test_generic_round_trip_through_jsonl_and_csv(tmp_path):
    original = Workload.from_arrays(
        "demo",
        [0.0, 0.25, 0.25, 1.125],
        [100, 0, 300, 4000],
        [1, 20, 300, 4000],
        [NO_KEY, 7, prompt_key_id("system-prompt-a"), -5],
    )
    for name in ("demo.jsonl", "demo.csv", "demo.csv.gz"):
        path = tmp_path / name
        write_trace(original, path)
        result = load_trace(path)
        assert result.source.split(":", 1)[0] == ("jsonl" if "json" in name else "csv")
        loaded = result.workload
        assert loaded.ready_s.tolist() == original.ready_s.tolist()
        assert loaded.prompt_tokens.tolist() == original.prompt_tokens.tolist()
        assert loaded.output_tokens.tolist() == original.output_tokens.tolist()
        assert loaded.prompt_keys.tolist() == original.prompt_keys.tolist()


def test_generic_formats_accept_timestamp_and_string_keys(tmp_path):
    jsonl = _write(
        tmp_path / "generic.jsonl",
        [
            '{"timestamp": 10.5, "prompt_tokens": 5, "output_tokens": 2, "prompt_key": "a"}\n',
            "\n",
            '{"timestamp": 10, "prompt_tokens": 6, "output_tokens": 3}\n',
        ],
    )
    workload = load_trace(jsonl).workload
    assert workload.ready_s.tolist() == [0.0, 0.5]
    assert workload.prompt_keys.tolist() == [NO_KEY, prompt_key_id("a")]
    csv_path = _write(
        tmp_path / "generic.txt",
        ["output_tokens,prompt_tokens,timestamp,prompt_key\n", "4,9,2.0,b\n", "5,8,1.0,\n"],
    )
    result = load_trace(csv_path)
    assert result.source.startswith("csv:")
    assert result.workload.prompt_tokens.tolist() == [8, 9]
    assert result.workload.prompt_keys.tolist() == [NO_KEY, prompt_key_id("b")]


def test_unknown_format_is_a_value_error():
    with pytest.raises(ValueError, match="unknown trace format 'parquet'"):
        load_trace(CONV_2023, "parquet")


# --- malformed input ---------------------------------------------------------------------


def test_bad_azure_row_names_file_line_and_field(tmp_path):
    rows = _azure_rows(20)
    rows[15] = "2023-11-16 18:15:15.6805900,115,abc\n"  # line 17: the header is line 1
    path = _write(tmp_path / "trace.csv", [AZURE_HEADER, *rows])
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert str(error.value) == (
        f"{path} line 17: field 'GeneratedTokens': expected a non-negative integer, got 'abc'"
    )
    result = load_trace(path, skip_bad=True)
    assert (len(result.workload), result.skipped) == (19, 1)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "2023-11-16 18:15:02.1,50,0\n",
            "field 'GeneratedTokens': expected at least 1 (a request decodes >= 1 token), got 0",
        ),
        ("2023-11-16 18:15:02.1,-4,3\n", "field 'ContextTokens': expected a non-negative integer"),
        ("2023-11-16 18:15:02.1,50\n", "field 'GeneratedTokens': missing"),
        ("16/11/2023 18:15,50,3\n", "field 'TIMESTAMP': expected a timestamp like"),
        ("2023-02-30 18:15:02,50,3\n", "field 'TIMESTAMP': expected a valid date"),
    ],
)
def test_each_kind_of_bad_azure_row(tmp_path, row, message):
    path = _write(tmp_path / "bad.csv", [AZURE_HEADER, *_azure_rows(2), row])
    with pytest.raises(TraceError, match="^" + str(path) + " line 4: ") as error:
        load_trace(path)
    assert message in str(error.value)


def test_bad_jsonl_rows_are_named_or_skipped_and_counted(tmp_path):
    good = '{"ready_s": 1, "prompt_tokens": 5, "output_tokens": 2}\n'
    lines = [
        good,
        "{not json\n",
        '{"ready_s": 2, "prompt_tokens": 5}\n',
        "[1, 2]\n",
        '{"ready_s": 3, "prompt_tokens": 5, "output_tokens": 0}\n',
        '{"ready_s": "soon", "prompt_tokens": 5, "output_tokens": 1}\n',
        good,
    ]
    path = _write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(TraceError) as error:
        load_trace(path)
    assert str(error.value).startswith(f"{path} line 2: invalid JSON")
    result = load_trace(path, skip_bad=True)
    assert (len(result.workload), result.skipped) == (2, 5)
    (tmp_path / "missing.jsonl").write_text("".join([good, lines[2]]))
    with pytest.raises(TraceError, match="line 2: field 'output_tokens': missing"):
        load_trace(tmp_path / "missing.jsonl")


def test_bad_mooncake_row(tmp_path):
    path = _write(
        tmp_path / "moon.jsonl",
        [
            '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n',
            '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": 7}\n',
        ],
    )
    with pytest.raises(TraceError, match=r"line 2: field 'hash_ids': expected a list, got 7"):
        load_trace(path)
    assert load_trace(path, "mooncake", skip_bad=True).skipped == 1


def test_output_min_filtered_rows_are_not_skipped(tmp_path):
    path = _write(tmp_path / "t.csv", [AZURE_HEADER, *_azure_rows(5)])
    result = load_trace(path, output_min=13)
    assert result.workload.output_tokens.tolist() == [13, 14]
    assert result.skipped == 0


def test_missing_file_and_missing_columns(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(TraceError, match=f"^{missing}: no such file$"):
        load_trace(missing)
    path = _write(tmp_path / "cols.csv", ["TIMESTAMP,ContextTokens\n", "2023-11-16 18:15:00,1\n"])
    with pytest.raises(TraceError, match="line 1: missing column 'GeneratedTokens'"):
        load_trace(path, "azure")
    generic = _write(tmp_path / "g.csv", ["prompt_tokens,output_tokens\n", "1,2\n"])
    with pytest.raises(TraceError, match="line 1: missing column 'ready_s or timestamp'"):
        load_trace(generic)
    empty = _write(tmp_path / "empty.csv", [])
    with pytest.raises(TraceError, match="empty file"):
        load_trace(empty)


# --- re-timing ---------------------------------------------------------------------------


def _uniform_workload(ready: list[float]) -> Workload:
    n = len(ready)
    return Workload.from_arrays("w", ready, [1000] * n, [100] * n)


def test_retime_rate_scale_divides_inter_arrival_times():
    workload = _uniform_workload([0.0, 1.0, 3.0, 7.0])
    faster = retime(workload, rate_scale=2.0)
    assert faster.ready_s.tolist() == [0.0, 0.5, 1.5, 3.5]
    assert retime(workload, rate_scale=0.5).ready_s.tolist() == [0.0, 2.0, 6.0, 14.0]
    assert faster.prompt_tokens is workload.prompt_tokens


def test_retime_load_matches_hand_arithmetic():
    workload = _uniform_workload([0.0, 1.0, 3.0, 7.0, 8.0])
    model = StepModel(a_ms_per_token=1e-4, b_ms=10.0)
    # Full batch of 4: 4 * (1000 + 100/2) = 4,200 KV tokens -> 0.42 + 10 = 10.42 ms a step.
    # Capacity: 2 workers * 4 tokens / 0.01042 s = 767.75 tok/s; load 0.5 -> 3.8388 req/s.
    expected_rate = 0.5 * (2 * 4 / 0.01042) / 100
    rate = target_arrival_rate(workload, 0.5, workers=2, batch=4, step_model=model)
    assert rate == pytest.approx(expected_rate)
    loaded = retime(workload, load=0.5, workers=2, batch=4, step_model=model)
    assert (len(loaded) - 1) / loaded.ready_s[-1] == pytest.approx(expected_rate)
    # The shape of the arrivals is kept: only the time axis is scaled.
    assert loaded.ready_s / loaded.ready_s[-1] == pytest.approx(workload.ready_s / 8.0)


def test_retime_load_spaces_simultaneous_arrivals_evenly():
    workload = _uniform_workload([5.0] * 4)
    model = StepModel(a_ms_per_token=0.0, b_ms=50.0)
    # 1 worker, batch 10: 10 tokens per 50 ms = 200 tok/s = 2 req/s at load 1.
    loaded = retime(workload, load=1.0, workers=1, batch=10, step_model=model)
    assert loaded.ready_s.tolist() == pytest.approx([5.0, 5.5, 6.0, 6.5])


def test_retime_argument_errors():
    workload = _uniform_workload([0.0, 1.0])
    with pytest.raises(ValueError, match="exactly one of rate_scale or load"):
        retime(workload)
    with pytest.raises(ValueError, match="exactly one of rate_scale or load"):
        retime(workload, rate_scale=2.0, load=1.0)
    with pytest.raises(ValueError, match="needs workers, batch and step_model"):
        retime(workload, load=1.0, workers=8)
    with pytest.raises(ValueError, match="rate_scale must be a positive number"):
        retime(workload, rate_scale=0.0)
    with pytest.raises(ValueError, match="load must be a positive number"):
        retime(workload, load=-1.0, workers=1, batch=1, step_model=StepModel())


# --- resolve_workload --------------------------------------------------------------------


def test_resolve_workload_takes_paths_and_synthetic_presets():
    from_path = resolve_workload(str(SLICE_2024), output_min=1001)
    assert len(from_path.workload) == 11
    synthetic = resolve_workload("synthetic:small", seed=3, limit=50)
    assert synthetic.source == "synthetic:small seed=3"
    assert len(synthetic.workload) == 50
    assert synthetic.workload.ready_s[0] == 0.0
    with pytest.raises(ValueError, match="unknown synthetic preset 'nope'"):
        resolve_workload("synthetic:nope")
