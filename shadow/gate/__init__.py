"""The promotion gate: pure decision logic over gathered evidence (GATE.md).

`decide(evidence, thresholds)` gives a `GateReport`: one row per metric with its role,
the verdict (PASS 0, FAIL 1, INCONCLUSIVE 3, MARGINAL 4, ERROR 5) and the one sentence
naming the rule that decided it. No I/O here except `load_thresholds`.
"""

from shadow.gate.evidence import WINDOW_METRIC_KEYS, Evidence, WindowPair
from shadow.gate.report import (
    EXIT_CODES,
    ROLES,
    SCHEMA_VERSION,
    USAGE_EXIT_CODE,
    GateReport,
    MetricRow,
    explain,
)
from shadow.gate.statistics import BootstrapResult, histogram_text, paired_ratio_bootstrap
from shadow.gate.thresholds import (
    GATE_METRICS,
    Thresholds,
    ThresholdsError,
    load_thresholds,
    thresholds_from_mapping,
)
from shadow.gate.verdict import decide

__all__ = [
    "EXIT_CODES",
    "GATE_METRICS",
    "ROLES",
    "SCHEMA_VERSION",
    "USAGE_EXIT_CODE",
    "WINDOW_METRIC_KEYS",
    "BootstrapResult",
    "Evidence",
    "GateReport",
    "MetricRow",
    "Thresholds",
    "ThresholdsError",
    "WindowPair",
    "decide",
    "explain",
    "histogram_text",
    "load_thresholds",
    "paired_ratio_bootstrap",
    "thresholds_from_mapping",
]
