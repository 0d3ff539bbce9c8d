"""Window scheduling: due windows are evaluated (inline or in a worker process), stored
and judged; each fleet's step model is refitted from its engine steps first.

With `[windows] mode = "continuous"` (the default) a window is a piece of each policy's
continuous run (stream/continuous.py), whose state lives in the process that evaluates
the windows: the windows go there in index order, each only after every earlier one."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING

import numpy as np

from shadow.analysis.stepmodel import fit_step_model
from shadow.replay.workload import StepModel
from shadow.service.ingest.apply import FleetState
from shadow.service.store import ServiceStore
from shadow.service.window_runs import evaluate_continuous, evaluate_in_worker
from shadow.stream.windows import WindowResult, evaluate_window

if TYPE_CHECKING:
    from shadow.service.ingest.config import PipelineConfig

log = logging.getLogger("shadow.service.ingest.pipeline")
#: step-model fits held for the next windows' transaction before they are stored alone
MAX_FITS_WAITING = 64
#: seconds an evaluated window waits for the others still evaluating before it is stored
STORE_AFTER_S = 1.0


class WindowScheduler:
    """Evaluates the due windows of the fleets it is given and stores their results."""

    def __init__(
        self,
        store: ServiceStore,
        config: PipelineConfig,
        executor: Executor | None,
        fleets: dict[str, FleetState],
    ) -> None:
        self.store = store
        self.config = config
        self.executor = executor
        self.fleets = fleets
        self._pending: list[tuple[FleetState, Future[WindowResult]]] = []
        #: step-model fits not stored yet (fleet, fitted at, fit): each goes with the next
        #: windows stored (`ServiceStore.save_windows`), one transaction for both
        self._fits: list[tuple[str, float, object]] = []
        #: evaluated windows not stored yet, and since when the first of them waits
        self._done: list[tuple[FleetState, WindowResult, bool]] = []
        self._done_since = 0.0
        self.continuous = config.windows.mode == "continuous"
        #: this scheduler's runs in the evaluating process (another service's are others)
        self.owner = uuid.uuid4().hex
        self.windows_evaluated = 0
        #: called with (fleet state, window result) after each stored window (the modes)
        self.on_window: Callable[[FleetState, WindowResult], None] | None = None

    def step_model(self, state: FleetState) -> tuple[StepModel, bool]:
        """The fleet's calibrated step model, refitted from its engine steps."""
        if not state.step_samples:
            return self.config.default_step_model, False
        array = state.step_samples.array()
        # One fleet step is the worker steps that start together (a barrier), found by
        # start time: each engine numbers its own steps, so numbers name no fleet step.
        begin = array[:, 3] - array[:, 2] / 1000.0
        order = np.argsort(begin, kind="stable")
        begin, array = begin[order], array[order]
        starts = np.flatnonzero(np.r_[True, np.diff(begin) > 1e-6])
        max_kv = np.maximum.reduceat(array[:, 1], starts)
        duration = np.maximum.reduceat(array[:, 2], starts)
        ts = np.maximum.reduceat(array[:, 3], starts)
        fit = fit_step_model(
            max_kv, duration, ts=ts, min_samples=self.config.step_fit_min_samples,
            default=self.config.default_step_model,
        )  # fmt: skip
        state.fit = fit
        self._fits.append((state.fleet, state.mirror.now, fit))
        return fit.as_step_model(), not fit.fallback

    def schedule(self, *, close: bool = False) -> None:
        #: windows evaluated here (no executor), stored together at the end
        inline: list[tuple[FleetState, WindowResult, bool]] = []
        for state in self.fleets.values():
            tracker = state.tracker
            if close and tracker.current is not None:
                tracker.close(state.mirror.now, final=True)
            due = tracker.due(state.mirror.now, force=close)
            if self.continuous:  # in index order: a window only after every earlier one
                ready = set(due)
                due = []
                for index in sorted(tracker.windows):
                    if index not in ready:
                        break
                    due.append(index)
            if not due:
                continue
            fresh = [i for i in due if i not in state.stored_windows]
            for index in due:
                if index in state.stored_windows:
                    tracker.discard(index)
            if not fresh:
                continue
            model, fitted = self.step_model(state)
            for index in fresh:
                spec = tracker.spec(index, model, fitted)
                job = (evaluate_continuous, self.owner, spec) if self.continuous else (
                    evaluate_window, spec)  # fmt: skip
                if self.executor is None:
                    try:
                        result = job[0](*job[1:])
                    except Exception:
                        self._failed(state, index)
                    else:
                        inline.append((state, result, fitted))
                else:
                    future = self.executor.submit(evaluate_in_worker, *job)
                    future.fitted = fitted  # type: ignore[attr-defined]
                    future.index = index  # type: ignore[attr-defined]
                    self._pending.append((state, future))
        self._store(inline)
        self.collect()

    def collect(self, wait: bool = False) -> int:
        """Store finished window evaluations (all of them with `wait`)."""
        keep = []
        for state, future in self._pending:
            if wait or future.done():
                try:
                    result = future.result()
                except Exception:
                    self._failed(state, future.index)  # type: ignore[attr-defined]
                else:
                    if not self._done:
                        self._done_since = time.monotonic()
                    self._done.append((state, result, future.fitted))  # type: ignore[attr-defined]
            else:
                keep.append((state, future))
        self._pending = keep
        # The windows of many fleets fall due together and finish one by one: stored
        # together once none is still evaluating (or the first has waited long enough),
        # a transaction costs ~1 ms a window where one window alone cost ~10.
        waited = time.monotonic() - self._done_since >= STORE_AFTER_S
        if not (wait or waited or not self._pending):
            return 0
        done, self._done = self._done, []
        self._store(done, fits_too=wait)
        return len(done)

    def _failed(self, state: FleetState, index: int) -> None:
        """A window that cannot be replayed is logged and counted; ingest goes on."""
        state.window_failures += 1
        log.exception("fleet %s: window %d could not be replayed", state.fleet, index)

    def _store(
        self, done: list[tuple[FleetState, WindowResult, bool]], fits_too: bool = False
    ) -> None:
        """Store evaluated windows, with the fits made since the last store, in one
        transaction; then judge them. Fits alone wait for the next windows, unless
        `fits_too` (a drain) or many wait."""
        if not done and not (self._fits and (fits_too or len(self._fits) >= MAX_FITS_WAITING)):
            return
        self.store.save_windows([(result, fitted) for _, result, fitted in done], self._fits)
        self._fits = []
        for state, result, _ in done:
            for policy, (count, first) in result.errors.items():
                # counted as the gate's candidate errors by the audit; here the replay went on
                log.warning(
                    "fleet %s: window %d: %s raised in %d rounds (answered with Round-Robin): "
                    "%s", state.fleet, result.index, policy, count, first,
                )  # fmt: skip
            state.stored_windows.add(result.index)
            self.windows_evaluated += 1
            if self.on_window is not None:
                try:
                    self.on_window(state, result)
                except Exception:
                    log.exception("fleet %s: judging window %d failed", state.fleet, result.index)
