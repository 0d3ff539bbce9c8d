"""Record the response bytes vLLM's own serving code produces, with the truth beside them.

The fixtures in tests/data/vllm_streams/ feed tests/test_openai_stream.py: the tap's
token accounting is only as good as the bytes it is tested on, and bytes from our own
emulator agree with our own assumptions. Two sources, both vLLM 0.32's serving code:

- `server`: a real vLLM server (CPU build, the tiny model of shadow/world/tiny_model.py
  with dummy weights), one engine, requests sent one at a time. The truth of each
  request is the engine's own count: the change of `vllm:generation_tokens_total` on
  `/metrics` across the request (and `usage` where the client asked for it, which must
  agree). Server A is plain (one output per chunk); server B runs `--stream-interval 4`
  (multi-token chunks) and `--reasoning-parser deepseek_r1` (reasoning deltas).
- `scripted`: vLLM's `OpenAIServingCompletion.completion_stream_generator` driven by a
  scripted generator of `RequestOutput`s, for what dummy weights cannot reach: finish
  `repetition`, an engine failure mid-stream (finish `error`, which vLLM turns into
  `data: {"error": ...}` then `[DONE]`), and vllm-ascend's `stop` / `stop_reason:
  "recomputed"` (its last output carries no token), and tool calls (a call forced with
  `tool_choice: "required"` on dummy weights wanders inside the JSON grammar until
  `max_tokens`; the chat serving code with vLLM's hermes tool parser streams a scripted
  call as `tool_calls` deltas). The truth is the scripted token ids.

Each case is `<case>.bin` (the body exactly as read from the socket, or as yielded by the
serving code) and `<case>.json` (the request, how the bytes arrived, and the truth per
choice: tokens generated, finish reason, stop reason).

Regenerate everything (one command, from the repository root; it starts and stops the
servers itself, one at a time):

    flock /tmp/vllm.lock env PYTHONPATH=$PWD "$SHADOW_VLLM_PYTHON" \
        scripts/record_vllm_streams.py

`--only scripted` (no server) or `--only server`; `--out DIR` to write elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "vllm_streams"
MODEL = "tiny"
_GEN_TOKENS = re.compile(rb"^vllm:generation_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.M)

PROMPT = "The decode workers meet at a barrier every step, so the most loaded one"
MESSAGES = [{"role": "user", "content": "负载均衡 决定 每一步 的 速度 — route it, please."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "route",
            "description": "Send the request to a worker.",
            "parameters": {
                "type": "object",
                "properties": {"worker": {"type": "string", "enum": ["w0", "w1"]}},
                "required": ["worker"],
                "additionalProperties": False,
            },
        },
    }
]
USAGE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}

#: (case, endpoint, request fields beyond model/prompt, expected finish per choice)
SERVER_A: list[tuple[str, str, dict[str, Any], str]] = [
    ("cmpl_stream_no_usage", "completions", {"stream": True, "max_tokens": 24}, "length"),
    ("cmpl_stream_usage", "completions",
     {"stream": True, "max_tokens": 24, "stream_options": USAGE}, "length"),
    ("cmpl_stream_continuous_usage", "completions",
     {"stream": True, "max_tokens": 24, "stream_options": CONTINUOUS}, "length"),
    ("cmpl_empty_text", "completions", {"stream": True, "max_tokens": 40}, "length"),
    ("cmpl_nonstream", "completions", {"stream": False, "max_tokens": 20}, "length"),
    ("cmpl_stream_n2_usage", "completions",
     {"stream": True, "max_tokens": 16, "n": 2, "stream_options": USAGE}, "length"),
    ("cmpl_stream_n2_no_usage", "completions",
     {"stream": True, "max_tokens": 16, "n": 2}, "length"),
    ("chat_stream_no_usage", "chat", {"stream": True, "max_tokens": 24}, "length"),
    ("chat_stream_usage", "chat",
     {"stream": True, "max_tokens": 24, "stream_options": USAGE}, "length"),
    ("chat_stream_continuous_usage", "chat",
     {"stream": True, "max_tokens": 24, "stream_options": CONTINUOUS}, "length"),
    ("chat_nonstream", "chat", {"stream": False, "max_tokens": 20}, "length"),
    ("chat_stream_n2_no_usage", "chat", {"stream": True, "max_tokens": 12, "n": 2}, "length"),
    ("chat_nonstream_n2", "chat", {"stream": False, "max_tokens": 12, "n": 2}, "length"),
]  # fmt: skip
SERVER_B: list[tuple[str, str, dict[str, Any], str]] = [
    ("cmpl_multitoken_no_usage", "completions", {"stream": True, "max_tokens": 30}, "length"),
    ("cmpl_multitoken_usage", "completions",
     {"stream": True, "max_tokens": 30, "stream_options": USAGE}, "length"),
    ("chat_reasoning_no_usage", "chat", {"stream": True, "max_tokens": 30}, "length"),
    ("chat_reasoning_usage", "chat",
     {"stream": True, "max_tokens": 30, "stream_options": USAGE}, "length"),
]  # fmt: skip


def write_case(out: Path, case: str, body: bytes, meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{case}.bin").write_bytes(body)
    (out / f"{case}.json").write_text(json.dumps({"case": case, **meta}, indent=1) + "\n")
    print(f"{case}: {len(body)} bytes, truth {meta['truth']}", flush=True)


# -- real server ---------------------------------------------------------------------------


def tiny_model_with_think_tokens(directory: Path) -> Path:
    """The tiny model plus `<think>`/`</think>` (deepseek_r1's reasoning parser needs
    them in the vocabulary); the config's vocab grows to match."""
    from tokenizers import Tokenizer

    from shadow.world.tiny_model import build_tiny_model

    build_tiny_model(directory)
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.save(str(directory / "tokenizer.json"))
    config = json.loads((directory / "config.json").read_text())
    config["vocab_size"] = tokenizer.get_vocab_size()
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL, "--load-format", "dummy", "--enforce-eager",
        "--dtype", "bfloat16", "--max-model-len", "4096", "--port", str(port),
        "--seed", "21", *extra,
    ]  # fmt: skip
    log = open(model / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (model / "server.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"vLLM exited:\n{tail}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_server(process)
    raise RuntimeError("vLLM did not become ready in 180 s")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    with_group = process.pid
    try:
        os.killpg(with_group, signal.SIGTERM)
        process.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(with_group, signal.SIGKILL)
        process.wait(timeout=10)


def generated_total(client: httpx.Client, base: str) -> float:
    """The engine's own count of tokens generated so far (all engines of the page)."""
    page = client.get(f"{base}/metrics").content
    return sum(float(value) for value in _GEN_TOKENS.findall(page))


def settled_total(client: httpx.Client, base: str, before: float) -> float:
    """The counter after a request, once it stopped moving (the engine is idle)."""
    last = generated_total(client, base)
    for _ in range(20):
        time.sleep(0.15)
        now = generated_total(client, base)
        if now == last and now > before:
            return now
        last = now
    return last


def record_server(out: Path, model: Path, extra: list[str], cases: list[Any]) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server(model, port, extra)
    try:
        with httpx.Client(timeout=120) as client:
            for case, endpoint, fields, finish in cases:
                record_one(client, base, out, case, endpoint, fields, finish, extra)
    except Exception:
        print((model / "server.log").read_text(errors="replace")[-3000:], file=sys.stderr)
        raise
    finally:
        stop_server(process)


def record_one(
    client: httpx.Client, base: str, out: Path, case: str, endpoint: str,
    fields: dict[str, Any], finish: str, server_args: list[str],
) -> None:  # fmt: skip
    body: dict[str, Any] = {"model": MODEL, "ignore_eos": True, "seed": 7, **fields}
    if endpoint == "chat":
        body["messages"] = MESSAGES
        path = "/v1/chat/completions"
    else:
        body["prompt"] = PROMPT
        path = "/v1/completions"
    n = body.get("n", 1)
    before = generated_total(client, base)
    arrivals: list[int] = []
    raw = bytearray()
    headers = {"X-Request-Id": f"fixture-{case.replace('_', '-')}"}
    with client.stream("POST", base + path, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{case}: HTTP {response.status_code}: {response.read()[:500]!r}")
        for piece in response.iter_raw():
            arrivals.append(len(piece))
            raw += piece
    engine_tokens = int(settled_total(client, base, before) - before)
    text = bytes(raw)
    reasons, usage_total = _reasons_and_usage(text, bool(body["stream"]))
    if sorted(reasons) != list(range(n)) or set(reasons.values()) != {finish}:
        raise RuntimeError(f"{case}: expected finish {finish!r} for {n} choices, got {reasons}")
    if usage_total is not None and usage_total != engine_tokens:
        raise RuntimeError(f"{case}: usage {usage_total} != engine count {engine_tokens}")
    if n == 1:
        per_choice = [engine_tokens]
    else:  # ignore_eos + finish length: each child generated max_tokens
        per_choice = [body["max_tokens"]] * n
        if sum(per_choice) != engine_tokens:
            raise RuntimeError(f"{case}: {per_choice} do not add up to {engine_tokens}")
    if case == "cmpl_empty_text" and b'"text":"","logprobs":null,"finish_reason":null' not in text:
        raise RuntimeError(f"{case}: no empty-text chunk before the finish; change the prompt")
    truth = [
        {"index": i, "tokens": tokens, "finish_reason": finish, "stop_reason": None}
        for i, tokens in enumerate(per_choice)
    ]
    write_case(out, case, text, {
        "source": "server", "endpoint": endpoint, "stream": bool(body["stream"]), "n": n,
        "request": body, "server_args": server_args, "arrivals": arrivals,
        "engine_generation_tokens": engine_tokens, "truth": truth,
    })  # fmt: skip


def _reasons_and_usage(text: bytes, stream: bool) -> tuple[dict[int, str], int | None]:
    """What the response says (a sanity check of the recording, not the truth)."""
    messages = []
    if stream:
        for line in text.split(b"\n"):
            if line.startswith(b"data: {"):
                messages.append(json.loads(line[6:]))
    else:
        messages.append(json.loads(text))
    reasons: dict[int, str] = {}
    usage = None
    for message in messages:
        for choice in message.get("choices") or ():
            if choice.get("finish_reason"):
                reasons[choice["index"]] = choice["finish_reason"]
        if (message.get("usage") and not message.get("choices")) or not stream:
            usage = (message.get("usage") or {}).get("completion_tokens", usage)
    return reasons, usage


# -- vLLM's serving code driven by scripted engine outputs -------------------------------


def scripted_cases() -> list[dict[str, Any]]:
    """Each case: `steps`, the engine outputs in order as (choice, token ids), and the
    finish and stop reason of each choice's last output. Ids are of the tiny tokenizer,
    several of them single bytes of multi-byte characters. An `error` finish makes vLLM's
    serving code end the whole stream with an error object: choices still running then
    end as `error` too (vLLM aborts them), with what they had generated."""
    one = [(0, [300, 301]), (0, [302]), (0, [303]), (0, [303, 303]), (0, [303])]
    return [
        {"case": "cmpl_repetition", "endpoint": "completions", "n": 1, "steps": one,
         "finish": {0: ("repetition", None)}, "stream_options": None},
        {"case": "cmpl_repetition_usage", "endpoint": "completions", "n": 1,
         "steps": [(0, [300]), (0, [301]), (0, [303, 303, 303]), (0, [303])],
         "finish": {0: ("repetition", None)}, "stream_options": USAGE},
        {"case": "cmpl_error_midstream", "endpoint": "completions", "n": 1,
         "steps": [(0, [410]), (0, [411, 412]), (0, [413]), (0, [414])],
         "finish": {0: ("error", None)}, "stream_options": None},
        {"case": "cmpl_error_midstream_usage", "endpoint": "completions", "n": 1,
         "steps": [(0, [410]), (0, [411]), (0, [412]), (0, [])],
         "finish": {0: ("error", None)}, "stream_options": USAGE},
        {"case": "cmpl_recomputed", "endpoint": "completions", "n": 1,
         "steps": [(0, [500]), (0, [501, 502]), (0, [503]), (0, [])],
         "finish": {0: ("stop", "recomputed")}, "stream_options": None},
        {"case": "cmpl_recomputed_usage", "endpoint": "completions", "n": 1,
         "steps": [(0, [500]), (0, [501]), (0, [])],
         "finish": {0: ("stop", "recomputed")}, "stream_options": USAGE},
        {"case": "chat_repetition_usage", "endpoint": "chat", "n": 1, "steps": one,
         "finish": {0: ("repetition", None)}, "stream_options": USAGE},
        {"case": "chat_error_midstream_n2", "endpoint": "chat", "n": 2,
         "steps": [(0, [600]), (1, [601]), (0, [602, 603]), (1, [604]), (0, [605]),
                   (1, [606]), (1, [607])],
         "finish": {0: ("length", None), 1: ("error", None)}, "stream_options": USAGE},
        {"case": "chat_reasoning_scripted", "endpoint": "chat", "n": 1,
         "reasoning_parser": "deepseek_r1",
         "steps": [(0, [300, 301]), (0, [302]), (0, [THINK_END]), (0, [303, 304]), (0, [305])],
         "finish": {0: ("length", None)}, "stream_options": None},
        {"case": "chat_reasoning_scripted_usage", "endpoint": "chat", "n": 1,
         "reasoning_parser": "deepseek_r1",
         "steps": [(0, [310]), (0, [311, 312, 313]), (0, [THINK_END, 314]), (0, [315])],
         "finish": {0: ("stop", None)}, "stream_options": USAGE},
        {"case": "chat_tool_calls_scripted", "endpoint": "chat", "n": 1,
         "tool_parser": "hermes", "text": TOOL_TEXT, "per_step": 2,
         "finish": {0: ("stop", None)}, "served_finish": "tool_calls", "stream_options": None},
        {"case": "chat_tool_calls_scripted_usage", "endpoint": "chat", "n": 1,
         "tool_parser": "hermes", "text": TOOL_TEXT, "per_step": 3,
         "finish": {0: ("stop", None)}, "served_finish": "tool_calls", "stream_options": USAGE},
        {"case": "cmpl_recomputed_n2_usage", "endpoint": "completions", "n": 2,
         "steps": [(0, [700]), (1, [701]), (1, [702]), (0, [703, 704]), (1, []), (0, [705])],
         "finish": {0: ("length", None), 1: ("stop", "recomputed")}, "stream_options": USAGE},
    ]  # fmt: skip


#: a hermes-style tool call as a model writes it; vLLM's hermes parser streams it as
#: `tool_calls` deltas and serves the engine's `stop` as `tool_calls`
TOOL_TEXT = '<tool_call>\n{"name": "route", "arguments": {"worker": "w1"}}\n</tool_call>'
#: stands for `</think>` in scripted steps (its id is known once the tokenizer is built)
THINK_END = -1


def record_scripted(out: Path) -> None:
    from tokenizers import Tokenizer
    from vllm.tokenizers import get_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_model_with_think_tokens(Path(tmp) / "model")
        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
        hf_tokenizer = get_tokenizer(str(model))
    end = tokenizer.token_to_id("</think>")
    for spec in scripted_cases():
        if "text" in spec:  # the text as the engine would emit it, `per_step` tokens each
            ids, k = tokenizer.encode(spec["text"]).ids, spec["per_step"]
            spec["steps"] = [(0, ids[i : i + k]) for i in range(0, len(ids), k)]
        spec["steps"] = [
            (c, [end if t == THINK_END else t for t in ids]) for c, ids in spec["steps"]
        ]
        record_scripted_case(out, tokenizer, hf_tokenizer, spec)


def _serving(
    endpoint: str, reasoning_parser: str | None, hf_tokenizer: Any, tool_parser: str | None = None
) -> Any:
    """vLLM's serving object without an engine: its stream generators read only these."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    cls = OpenAIServingChat if endpoint == "chat" else OpenAIServingCompletion
    serving = object.__new__(cls)
    serving.enable_force_include_usage = False
    serving.enable_prompt_tokens_details = False
    serving.enable_per_request_metrics = False
    serving.system_fingerprint = None
    if endpoint == "chat":
        serving.parser_cls = None
        serving.model_config = None
        if reasoning_parser:
            from vllm.parser.parser_manager import ParserManager

            serving.parser_cls = ParserManager.get_parser(
                reasoning_parser_name=reasoning_parser, tokenizer=hf_tokenizer
            )
        if tool_parser:
            from vllm.parser.parser_manager import ParserManager

            serving.enable_auto_tools = True
            serving.parser_cls = ParserManager.get_parser(
                tool_parser_name=tool_parser, enable_auto_tools=True, tokenizer=hf_tokenizer
            )
        serving.response_role = "assistant"
        serving._include_reasoning_tokens_details = bool(reasoning_parser)
        serving.enable_log_outputs = False
        serving.request_logger = None
    return serving


def record_scripted_case(
    out: Path, tokenizer: Any, hf_tokenizer: Any, spec: dict[str, Any]
) -> None:
    from vllm.entrypoints.generate.base.protocol import RequestResponseMetadata
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.outputs import CompletionOutput, RequestOutput

    case, endpoint, n = spec["case"], spec["endpoint"], spec["n"]
    base = f"fixture-{case.replace('_', '-')}"
    request_id = f"chatcmpl-{base}" if endpoint == "chat" else f"cmpl-{base}"
    steps = spec["steps"]
    last_step = {choice: k for k, (choice, _) in enumerate(steps)}
    texts: list[str] = [""] * len(steps)
    for choice in range(n):
        mine = [k for k, (c, _) in enumerate(steps) if c == choice]
        for k, text in zip(mine, _incremental_texts(tokenizer, [steps[k][1] for k in mine]),
                           strict=True):  # fmt: skip
            texts[k] = text
    prompt_ids = tokenizer.encode(PROMPT).ids
    fields: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "stream": True, "n": n}
    if spec["stream_options"]:
        fields["stream_options"] = spec["stream_options"]
    if endpoint == "chat":
        fields["messages"] = MESSAGES
        if spec.get("tool_parser"):
            fields["tools"], fields["tool_choice"] = TOOLS, "auto"
        request: Any = ChatCompletionRequest(**fields)
    else:
        fields["prompt"] = PROMPT
        request = CompletionRequest(**fields)

    async def results() -> Any:
        for k, (choice, ids) in enumerate(steps):
            reason, stop = spec["finish"][choice] if last_step[choice] == k else (None, None)
            output = CompletionOutput(choice, texts[k], ids, None, None,
                                      finish_reason=reason, stop_reason=stop)  # fmt: skip
            res = RequestOutput(f"{request_id}-0", PROMPT, prompt_ids, None, [output],
                                k == len(steps) - 1)  # fmt: skip
            yield res if endpoint == "chat" else (0, res)

    async def collect() -> list[str]:
        serving = _serving(
            endpoint, spec.get("reasoning_parser"), hf_tokenizer, spec.get("tool_parser")
        )
        metadata = RequestResponseMetadata(request_id=request_id)
        if endpoint == "chat":
            generator = serving.chat_completion_stream_generator(
                request, results(), request_id, MODEL, [], hf_tokenizer, metadata
            )
        else:
            generator = serving.completion_stream_generator(
                request, [{}], results(), request_id, 1764547200, MODEL, 1, None, metadata
            )
        return [piece async for piece in generator]

    pieces = asyncio.run(collect())
    # the truth: what each choice's engine outputs carried, up to the first error (vLLM
    # stops reading the engine there and aborts the choices still running)
    failed = next((k for k, (c, _) in enumerate(steps)
                   if spec["finish"][c][0] == "error" and last_step[c] == k), None)  # fmt: skip
    truth = []
    for choice in range(n):
        upto = len(steps) if failed is None else failed + 1
        mine = [ids for c, ids in steps[:upto] if c == choice]
        reason, stop = spec["finish"][choice]
        if failed is not None and last_step[choice] > failed:
            reason, stop = "error", None
        reason = spec.get("served_finish", reason)  # what vLLM tells the client
        truth.append({"index": choice, "tokens": sum(map(len, mine)), "finish_reason": reason,
                      "stop_reason": stop})  # fmt: skip
    write_case(out, case, "".join(pieces).encode(), {
        "source": "scripted", "endpoint": endpoint, "stream": True, "n": n,
        "request": fields, "arrivals": [len(p.encode()) for p in pieces],
        "scripted_outputs": [[c, ids] for c, ids in steps], "truth": truth,
        "reasoning_parser": spec.get("reasoning_parser"), "tool_parser": spec.get("tool_parser"),
        "engine_finish": {c: f[0] for c, f in spec["finish"].items()},
    })  # fmt: skip


def _incremental_texts(tokenizer: Any, outputs: list[list[int]]) -> list[str]:
    """The text each output adds, as vLLM's incremental detokenizer streams it: a token
    that ends mid-character adds nothing until the character completes."""
    texts, ids, shown = [], [], ""
    for chunk in outputs:
        ids.extend(chunk)
        full = tokenizer.decode(ids)
        stable = full.rstrip("\ufffd")
        texts.append(stable[len(shown) :] if stable.startswith(shown) else "")
        shown = stable if stable.startswith(shown) else shown
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", choices=("scripted", "server"))
    parser.add_argument("--cases", help="comma-separated server cases to record (default all)")
    args = parser.parse_args()
    wanted = set(args.cases.split(",")) if args.cases else None

    def pick(cases: list[Any]) -> list[Any]:
        return [c for c in cases if wanted is None or c[0] in wanted]

    if args.only != "server":
        record_scripted(args.out)
    if args.only != "scripted":
        with tempfile.TemporaryDirectory() as tmp:
            model = tiny_model_with_think_tokens(Path(tmp) / "model")
            if pick(SERVER_A):
                record_server(args.out, model, [], pick(SERVER_A))
            extra = ["--stream-interval", "4", "--reasoning-parser", "deepseek_r1"]
            if pick(SERVER_B):
                record_server(args.out, model, extra, pick(SERVER_B))


if __name__ == "__main__":
    main()
