"""A worker whose parent dies runs its cleanup and exits (the real-vLLM demo's companion
stops the engines it started: before, a killed service left them running)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from shadow.world.process import REPO

CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from shadow.service.workers import exit_with_parent
    marks = Path(sys.argv[1])
    exit_with_parent(lambda: (marks / "cleaned").write_text("yes"))
    (marks / "ready").write_text("yes")
    time.sleep(60)
    """
)
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    from pathlib import Path
    marks = Path(sys.argv[1])
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], str(marks)])
    (marks / "child").write_text(str(child.pid))
    while not (marks / "ready").exists():
        time.sleep(0.05)
    os._exit(0)  # as a SIGKILL would: no cleanup of its own
    """
)


def test_a_dead_parent_leaves_no_worker_and_its_cleanup_runs(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", PARENT, str(tmp_path), CHILD], cwd=REPO,
                   check=True, timeout=60)  # fmt: skip
    deadline = time.monotonic() + 10
    while not (tmp_path / "cleaned").exists():
        assert time.monotonic() < deadline, "the orphaned worker never ran its cleanup"
        time.sleep(0.05)
    pid = int((tmp_path / "child").read_text())
    while Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid):
        assert time.monotonic() < deadline + 5, "the orphaned worker kept running"
        time.sleep(0.05)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return "zombie"
