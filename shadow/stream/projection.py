"""BR-H's projection of a mirrored fleet, kept across the decision audit's dispatches.

Rebuilding `Lhat[g, h]` for every dispatch costs a prediction and a bincount over every
active request (~32,000 at G = 256, B = 128). Between two dispatches of one admission
round only the worker that took the first request changed, so only its row is rebuilt:
the mirror's per-worker `version` says which workers changed, the predictor's `version`
whether every prediction still holds (a completion it learned changes them all, and then
the whole projection is rebuilt, unless the audited BR-H's round just made it).

A row rebuilt alone is exactly the row of a full rebuild: predictions are per request,
and the projection sums integer token counts (exact in float64), so neither the order of
the requests nor which others are in the sum changes a bit of it.
"""

from __future__ import annotations

import numpy as np

from shadow.policies.balanceroute import project_loads
from shadow.policies.snapshot import FleetSnapshot
from shadow.predict.predictors import Predictor
from shadow.stream.mirror import FleetMirror


class MaintainedProjection:
    """The projection of one mirror's fleet, rebuilt where it changed since the last call."""

    def __init__(self, predictor: Predictor, horizon: int, full_rebuild_share: float = 0.25):
        """Past `full_rebuild_share` of the workers changed, one full rebuild is cheaper
        than a gather per changed worker."""
        self.predictor = predictor
        self.horizon = horizon
        self.full_rebuild_share = full_rebuild_share
        self._projection: np.ndarray | None = None
        self._versions = np.zeros(0, dtype=np.int64)
        self._predictor_version: int | None = None
        #: rows rebuilt alone, and rebuilds of every row (what `current` saved, for tests
        #: and the benchmark)
        self.rows_rebuilt = 0
        self.full_rebuilds = 0
        #: projections made by the round and kept as they were (`current`'s `made`)
        self.adopted = 0

    def current(
        self, mirror: FleetMirror, snapshot: FleetSnapshot, made: np.ndarray | None = None
    ) -> np.ndarray:
        """`Lhat` of the mirror now; `snapshot` is its `snapshot()` of now (the caller has
        it already), with or without its active set (`with_active=False`: a dispatch
        after the first of a round needs no scan of every active request). The changed
        workers' rows are read from the mirror's requests of those workers; a full
        rebuild takes the snapshot's active set, or the mirror's when it has none.

        `made` is a projection of the mirror now, made already with this predictor and
        horizon (the audited BR-H's own round): it is kept as it is, where a round's first
        dispatch would otherwise project the fleet a second time (after a completion the
        predictor learned from, which is most rounds, that is a full rebuild). It becomes
        this object's own.

        The returned array is this object's own: callers must not write to it
        (`BalanceRouteHorizon.admit` copies a projection it is given)."""
        versions = mirror.worker_versions()
        predictor_version = getattr(self.predictor, "version", None)
        if made is not None:
            self._projection = made
            self._versions = versions
            self._predictor_version = predictor_version
            self.adopted += 1
            return made
        projection = self._projection
        if (
            projection is None
            or predictor_version is None
            or predictor_version != self._predictor_version
            or versions.shape != self._versions.shape
        ):
            return self._rebuild(mirror, snapshot, versions, predictor_version)
        load = snapshot.load
        changed = np.flatnonzero(versions != self._versions)
        if changed.size:
            if changed.size > self.full_rebuild_share * versions.shape[0]:
                return self._rebuild(mirror, snapshot, versions, predictor_version)
            local = mirror.active_of(changed)
            contribution = self.predictor.predict(local, self.horizon).contribution
            projection[changed] = project_loads(load[changed], local, contribution, self.horizon)
            self._versions = versions
            self.rows_rebuilt += int(changed.size)
        return projection

    def _rebuild(
        self,
        mirror: FleetMirror,
        snapshot: FleetSnapshot,
        versions: np.ndarray,
        predictor_version: int | None,
    ) -> np.ndarray:
        active = snapshot.active
        if len(active) != mirror.running:  # a snapshot taken without its active set
            active = mirror.snapshot().active
        contribution = self.predictor.predict(active, self.horizon).contribution
        self._projection = project_loads(snapshot.load, active, contribution, self.horizon)
        self._versions = versions
        self._predictor_version = predictor_version
        self.full_rebuilds += 1
        return self._projection
