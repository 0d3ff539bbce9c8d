"""Where cells run: in this process, on a local process pool, or as Ray tasks.

Every executor ships each distinct workload to its workers once (a pool initializer per
process; `ray.put` once, the reference passed to every task), runs `run_cell`, and yields
results as cells finish, so the caller can store each one at once (a sweep stopped halfway
keeps what it finished).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self

from shadow.replay.workload import Workload
from shadow.sweep.cell import run_cell


@dataclass(frozen=True)
class CellTask:
    """A cell to run: its key, which workload (by digest), its parameters."""

    key: str
    workload: str
    params: Mapping[str, Any]
    steps: bool = False


@dataclass(frozen=True)
class CellOutcome:
    """A finished cell: `result` from `run_cell`, or `error` (the exception, one line)."""

    task: CellTask
    result: dict[str, Any] | None
    error: str | None = None
    detail: str | None = None


class Executor(Protocol):
    """Runs cells; a context manager that owns its workers (pool, Ray runtime)."""

    name: str
    workers: int

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...

    def run(
        self, tasks: Sequence[CellTask], workloads: Mapping[str, Workload]
    ) -> Iterator[CellOutcome]: ...


def _failure(task: CellTask, error: BaseException) -> CellOutcome:
    detail = "".join(traceback.format_exception(error))
    return CellOutcome(task, None, f"{type(error).__name__}: {error}", detail)


class SerialExecutor:
    """Cells one after another in this process (`--jobs 1`, tests)."""

    name = "serial"
    workers = 1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def run(
        self, tasks: Sequence[CellTask], workloads: Mapping[str, Workload]
    ) -> Iterator[CellOutcome]:
        for task in tasks:
            try:
                result = run_cell(workloads[task.workload], task.params, task.steps)
            except Exception as error:  # one bad cell must not lose the others
                yield _failure(task, error)
            else:
                yield CellOutcome(task, result)


# -- the process pool -------------------------------------------------------------------

_worker_workloads: Mapping[str, Workload] = {}


def _install(workloads: Mapping[str, Workload]) -> None:
    """Pool initializer: each process receives the workloads once, not once per cell."""
    global _worker_workloads
    _worker_workloads = workloads


def _pool_cell(workload: str, params: Mapping[str, Any], steps: bool) -> dict[str, Any]:
    return run_cell(_worker_workloads[workload], params, steps)


class PoolExecutor:
    """A local process pool (spawned processes: no inherited threads or open databases)."""

    name = "pool"

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=exc is None, cancel_futures=True)
            self._pool = None

    def run(
        self, tasks: Sequence[CellTask], workloads: Mapping[str, Workload]
    ) -> Iterator[CellOutcome]:
        if not tasks:
            return
        used = {task.workload for task in tasks}
        self._pool = ProcessPoolExecutor(
            max_workers=min(self.workers, len(tasks)),
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_install,
            initargs=({k: v for k, v in workloads.items() if k in used},),
        )
        pending: dict[Future[dict[str, Any]], CellTask] = {
            self._pool.submit(_pool_cell, task.workload, dict(task.params), task.steps): task
            for task in tasks
        }
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                task = pending.pop(future)
                error = future.exception()
                if error is None:
                    yield CellOutcome(task, future.result())
                else:
                    yield _failure(task, error)
        self._pool.shutdown()
        self._pool = None


# -- Ray ----------------------------------------------------------------------------------


class RayUnavailable(RuntimeError):
    """Ray is not installed or the cluster cannot be reached."""


class RayExecutor:
    """Cells as Ray tasks (one CPU each) on a local runtime or an existing cluster.

    `address=None` starts a local runtime with `workers` CPUs (all cores by default); an
    address (`auto`, `ray://head:10001`, `head:6379`) connects to a cluster, whose nodes
    need this package installed. A runtime already initialised in this process is used
    as it is and left running.
    """

    name = "ray"

    def __init__(self, address: str | None = None, workers: int | None = None) -> None:
        self.address = address
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.init_seconds = 0.0
        self._owned = False

    def __enter__(self) -> Self:
        try:
            import ray
        except ImportError:
            raise RayUnavailable(
                "Ray is not installed: pip install 'balanceroute-shadow[ray]'"
            ) from None
        if ray.is_initialized():
            self.workers = int(ray.cluster_resources().get("CPU", self.workers))
            return self
        started = time.perf_counter()
        try:
            if self.address is None:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.address, log_to_driver=False)
        except Exception as error:  # ConnectionError, RuntimeError, ... depending on version
            raise RayUnavailable(f"cannot start or reach Ray ({self.address}): {error}") from None
        self.init_seconds = time.perf_counter() - started
        self._owned = True
        self.workers = int(ray.cluster_resources().get("CPU", self.workers))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            import ray

            ray.shutdown()
            self._owned = False

    def run(
        self, tasks: Sequence[CellTask], workloads: Mapping[str, Workload]
    ) -> Iterator[CellOutcome]:
        import ray

        if not tasks:
            return
        # The object store holds each workload once; every task gets the reference, and
        # Ray resolves it in the worker (zero-copy for the numpy arrays on one node).
        refs = {key: ray.put(workloads[key]) for key in {task.workload for task in tasks}}
        remote = ray.remote(num_cpus=1)(run_cell)
        pending = {
            remote.remote(refs[task.workload], dict(task.params), task.steps): task
            for task in tasks
        }
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    task = pending.pop(ref)
                    try:
                        result = ray.get(ref)
                    except Exception as error:  # RayTaskError wraps the cell's exception
                        cause = getattr(error, "cause", None)
                        yield _failure(task, cause if isinstance(cause, Exception) else error)
                    else:
                        yield CellOutcome(task, result)
        finally:
            for ref in pending:
                ray.cancel(ref)
