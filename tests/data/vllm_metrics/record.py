"""Record real vLLM `/metrics` pages of a data-parallel (DP = 2) server, idle and under load.

The poller's fixtures must be what vLLM itself serves, not what we believe it serves, so
they are recorded from a real server: the tiny model (`shadow/world/tiny_model.py`) with
dummy weights on the CPU build. Under load each rank holds a different, known number of
requests (pinned with `X-data-parallel-rank`), so a test can tell the ranks apart.

Recorded with (from the worktree root, holding the machine's one-vLLM-server lock):

    flock /tmp/vllm.lock env PYTHONPATH=$PWD "$SHADOW_VLLM_PYTHON" \
        tests/data/vllm_metrics/record.py tests/data/vllm_metrics

`tests/test_poller.py` imports `VllmServer` and `pinned_load` from here for its live test.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

#: requests pinned to each DP rank under load (different, so the ranks cannot be confused)
PINNED = {"0": 5, "1": 2}
MAX_TOKENS = 1200


#: the repository root: the vLLM process imports this project's code (its plugin) from it
ROOT = Path(__file__).resolve().parents[3]


def build_model(python: str, directory: Path) -> Path:
    """The tiny model, built by `python` (the vLLM interpreter has `tokenizers`; the
    project's own venv need not)."""
    code = "import sys, pathlib; from shadow.world.tiny_model import build_tiny_model; "
    code += "build_tiny_model(pathlib.Path(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([python, "-c", code, str(directory)], env=env, check=True, timeout=300)
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class VllmServer:
    """A real vLLM OpenAI server with `--data-parallel-size dp` on loopback, in its own
    process group so that stopping it stops every engine process it started."""

    def __init__(self, python: str, model_dir: Path, dp: int = 2, log: Path | None = None):
        self.python = python
        self.model_dir = model_dir
        self.dp = dp
        self.port = free_port()
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180.0) -> VllmServer:
        env = {
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            # first: a sitecustomize asking for AMX, which vLLM's CPU attention uses
            # without asking (shadow.world.real_vllm.engine_environment)
            "PYTHONPATH": os.pathsep.join([str(ROOT / "shadow" / "world" / "amx_site"), str(ROOT)]),
        }
        command = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", "tiny",
            "--load-format", "dummy", "--enforce-eager", "--dtype", "bfloat16",
            "--max-model-len", "4096", "--port", str(self.port), "--host", "127.0.0.1",
            "--data-parallel-size", str(self.dp),
        ]  # fmt: skip
        out = open(self.log, "wb") if self.log is not None else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.process.returncode} (log {self.log})")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(self.url + "/v1/models", timeout=2) as response,
            ):
                if response.status == 200:
                    return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM not ready after {timeout_s} s (log {self.log})")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            return response.read().decode()

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _complete(url: str, rank: str, max_tokens: int) -> None:
    body = json.dumps(
        {
            "model": "tiny",
            "prompt": "The decode workers meet at a barrier every step.",
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    request = urllib.request.Request(
        url + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json", "X-data-parallel-rank": rank},
    )
    # the server stops with these streams still open: the end of one is no error here
    with (
        contextlib.suppress(OSError, http.client.HTTPException),
        urllib.request.urlopen(request, timeout=600) as response,
    ):
        while response.read(65536):
            pass


def pinned_load(
    url: str, pinned: dict[str, int] = PINNED, max_tokens: int = MAX_TOKENS
) -> list[threading.Thread]:
    """Start `pinned[rank]` streaming completions on each rank (daemon threads)."""
    threads = [
        threading.Thread(target=_complete, args=(url, rank, max_tokens), daemon=True)
        for rank, count in pinned.items()
        for _ in range(count)
    ]
    for thread in threads:
        thread.start()
    return threads


def held(text: str, rank: str) -> float:
    """running + waiting of `rank`, read off the page line by line (no parser)."""
    total = 0.0
    for line in text.splitlines():
        for name in ("vllm:num_requests_running{", "vllm:num_requests_waiting{"):
            if line.startswith(name) and f'engine="{rank}"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def wait_for(server: VllmServer, check: Callable[[str], bool], timeout_s: float) -> str:
    """The first page that passes `check`, or the last one after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = server.metrics()
        if check(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def record(out: Path, python: str = sys.executable) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(python, Path(tmp) / "tiny")
        with VllmServer(python, model, dp=2, log=Path(tmp) / "vllm.log") as server:
            (out / "dp2_idle.prom").write_text(server.metrics())
            threads = pinned_load(server.url)
            loaded = wait_for(server, lambda t: all(held(t, r) == n for r, n in PINNED.items()), 60)
            (out / "dp2_load.prom").write_text(loaded)
            for thread in threads:
                thread.join(timeout=300)
            after = wait_for(server, lambda t: held(t, "0") == held(t, "1") == 0, 30)
            (out / "dp2_after.prom").write_text(after)
    (out / "dp2_load.json").write_text(
        json.dumps({"pinned": PINNED, "max_tokens": MAX_TOKENS}, indent=2) + "\n"
    )


if __name__ == "__main__":
    record(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
