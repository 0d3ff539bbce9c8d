"""What the promotion gate decides on: plain, frozen data, assembled elsewhere.

The gate itself never reads a database; whoever gathers the evidence (windows, audit,
invariants, calibration) builds these and hands them to `decide`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WINDOW_METRIC_KEYS = (
    "imbalance_mean",
    "throughput_tok_s",
    "tpot_p95_ms",
    "gap_mean",
    "step_ms_mean",
    "steps",
    "busy_s",
)


@dataclass(frozen=True)
class WindowPair:
    """One replay window: the incumbent, the candidate and the A/A run on the same snapshot.

    `aa` is the incumbent replayed against itself with other tie-break seeds (None when not
    run). `fidelity_*` are replayed incumbent / observed incumbent (None or NaN when the
    window has nothing observed to compare with).
    """

    window_index: int
    requests: int
    incumbent: dict[str, float]
    candidate: dict[str, float]
    aa: dict[str, float] | None = None
    fidelity_imbalance: float | None = None
    fidelity_step: float | None = None
    #: continuous runs: the window they started from (None: replayed on its own start)
    run_start: int | None = None
    #: the requests the runs' start state held (0: an empty fleet, so no warm-up)
    run_start_held: int | None = None
    #: per-request TPOTs (ms) of each arm in this window, which the gate pools for the
    #: TPOT P95 over requests (None: not stored; the gate then takes the window P95s)
    incumbent_tpot: tuple[float, ...] | None = None
    candidate_tpot: tuple[float, ...] | None = None
    aa_tpot: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Evidence:
    """Everything one gate run looks at, for one fleet, candidate and baseline.

    `calibration_auc` None means the candidate has no predictor (the guard does not
    apply); `decision_latency_p99_ms` None means the latency was not measured (missing
    evidence, never a pass). `step_ms_mean` is the measured mean step time in ms.
    """

    fleet: str
    candidate: str
    baseline: str
    since: float | None
    until: float | None
    windows: tuple[WindowPair, ...]
    decisions: int
    critical_violations: int
    candidate_errors: int
    decision_latency_p99_ms: float | None
    step_ms_mean: float | None
    calibration_auc: float | None
    evidence_ids: dict = field(default_factory=dict)
    disagreements: tuple[dict, ...] = ()
    #: requests dispatched in the range; more than `decisions` when the audit sampled
    #: (`audit_sampling`) or skipped some: the decisions are then a sample of these
    dispatches: int | None = None

    @property
    def audited_share(self) -> float | None:
        """Audited dispatches over dispatches (None: dispatches unknown or none)."""
        if not self.dispatches:
            return None
        return min(1.0, self.decisions / self.dispatches)
