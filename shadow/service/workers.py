"""Worker processes beside the ingest process: one for the decision audit, one for
window replays. On a small machine they put the second core to work, so the audit and
the counterfactual replays never hold up the acknowledgement of events."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from shadow.service.footprint import HeapTrimmer, limit_heap_arenas
from shadow.service.heaptrace import start_heap_trace
from shadow.service.interpreter import tune_interpreter
from shadow.service.plugins import import_policy_modules
from shadow.stream.audit import AuditConfig, start_worker
from shadow.stream.invariants import InvariantConfig


def exit_with_parent(cleanup: Callable[[], None] | None = None) -> None:
    """A worker whose parent died (SIGKILL leaves pool children behind) exits too, after
    `cleanup` (what it started itself and would otherwise orphan: the real-vLLM demo's
    engines kept running, 1.8 GB each, after a service that was killed)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        if cleanup is not None:
            with contextlib.suppress(Exception):
                cleanup()
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def ignore_stop_signals() -> None:
    """Ctrl-C, `timeout` and `kill -- -PGID` signal the whole process group. The server
    stops its workers itself once the batches in flight are answered; a worker that died
    first failed them instead (a broken pool: 500s and a traceback on the way out)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


#: the worker processes' default niceness (`ServiceSettings.workers_nice`)
WORKERS_NICE = 10


def yield_to_ingest(nice: int) -> None:
    """Lower this worker process's scheduling priority by `nice` (0: leave it).

    The audit and the counterfactual replays are derived work: they may fall behind and
    catch up (the audit then samples, and says so), where the ingest process acknowledges
    events whose sources buffer only so much. On two cores the three processes shared the
    CPU equally when all were busy, so ingest got what the workers left it: at 40,000
    events/s with the counterfactuals on (`shadow bench load`) the senders fell 8.8 s
    behind. Niced, the workers take the cycles ingest does not use (docs/RELIABILITY.md)."""
    if nice > 0:
        os.nice(nice)


def _audit_init(
    config: AuditConfig,
    invariants: InvariantConfig | None,
    sweep: float,
    policy_modules: tuple[str, ...] = (),
    nice: int = WORKERS_NICE,
) -> None:
    limit_heap_arenas()
    yield_to_ingest(nice)
    exit_with_parent()
    ignore_stop_signals()
    import_policy_modules(policy_modules)
    start_worker(config, invariants, sweep)
    tune_interpreter()
    HeapTrimmer().start()
    start_heap_trace("audit")


def _window_init(policy_modules: tuple[str, ...] = (), nice: int = WORKERS_NICE) -> None:
    limit_heap_arenas()
    yield_to_ingest(nice)
    exit_with_parent()
    ignore_stop_signals()
    import_policy_modules(policy_modules)
    tune_interpreter()
    start_heap_trace("windows")


def audit_worker(
    config: AuditConfig,
    invariants: InvariantConfig | None = None,
    sweep_every_s: float = 5.0,
    policy_modules: tuple[str, ...] = (),
    nice: int = WORKERS_NICE,
) -> ProcessPoolExecutor:
    """One process holding the audit follower (its replica mirror persists across
    batches); give it the pipeline's invariant settings so ghost sweeps match, and the
    settings' `policy_modules` so it knows the policies they register. `nice`: how far
    it yields the cores to ingest (`yield_to_ingest`)."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_audit_init,
        initargs=(config, invariants, sweep_every_s, tuple(policy_modules), nice),
    )


def window_worker(
    policy_modules: tuple[str, ...] = (), nice: int = WORKERS_NICE
) -> ProcessPoolExecutor:
    """One process for window replays (pure functions of their specs)."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_window_init,
        initargs=(tuple(policy_modules), nice),
    )
