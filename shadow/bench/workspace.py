"""Where a benchmark keeps its recording and databases: a folder the user named (kept),
or a temporary one removed afterwards (a 5-minute load run leaves ~75 MB)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def workspace(workdir: Path | None, prefix: str) -> Iterator[Path]:
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir
        return
    with tempfile.TemporaryDirectory(prefix=prefix) as root:
        yield Path(root)
