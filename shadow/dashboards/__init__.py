"""Grafana dashboards for the shadow service, built from code and provisioned over HTTP.

The dashboards are written with grafana-foundation-sdk builders so a panel is reviewed as
code, and exported to `dashboards/*.json` so the committed JSON is never edited by hand
(`tests/test_dashboards.py` rebuilds it and compares). Every query uses only the metric
names of `shadow/service/metrics.py`, every panel reads the `${datasource}` variable, and
`provision` pushes the same models into a Grafana folder with grafana-client.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as dashboard_model
from grafana_foundation_sdk.models import heatmap as heatmap_model
from grafana_foundation_sdk.models import prometheus as prometheus_model

TAG = "balanceroute-shadow"
DATASOURCE_NAME = "shadow-prometheus"
DEFAULT_FOLDER = "balanceroute-shadow"

#: Every `${datasource}` panel and query points here: the dashboards carry no datasource uid.
DATASOURCE = dashboard_model.DataSourceRef(type_val="prometheus", uid="${datasource}")

#: Grafana unit ids. Grafana has no token unit, so tokens are a custom suffix.
TOKENS = "suffix: tok"
TOKENS_PER_S = "suffix: tok/s"
SECONDS = "s"
RATIO = "none"
SHARE = "percentunit"
COUNT = "short"
PER_SECOND = "ops"
REQUESTS_PER_SECOND = "reqps"

FLEET = 'fleet="$fleet"'
POLICY = 'policy=~"$policy"'
WORKER = 'worker=~"$worker"'
RATE = "[$__rate_interval]"

Target = cogbuilder.Builder[Any]
PanelBuilder = cogbuilder.Builder[dashboard_model.Panel]


# -- small builders ------------------------------------------------------------------------


def _query(
    expr: str, legend: str, *, instant: bool = False, heatmap_format: bool = False
) -> Target:
    """One Prometheus target; the ref id is assigned by the panel so targets stay short."""
    query = (
        prometheus.Dataquery()
        .expr(expr)
        .legend_format(legend)
        .datasource(DATASOURCE)
        .editor_mode(prometheus_model.QueryEditorMode.CODE)
    )
    if instant:
        query.instant()
    else:
        query.range()
    if heatmap_format:
        query.format(prometheus_model.PromQueryFormat.HEATMAP)
    return query


def _with_targets(panel: Any, targets: Sequence[Target]) -> Any:
    """Attach targets with ref ids A, B, C... (Grafana needs them unique per panel)."""
    for index, target in enumerate(targets):
        panel.with_target(target.ref_id(chr(ord("A") + index)))
    return panel


def _legend(*calcs: str) -> common.VizLegendOptions:
    """A visible table legend so every series can be read with its last and max values."""
    return (
        common.VizLegendOptions()
        .show_legend(True)
        .display_mode(common_model.LegendDisplayMode.TABLE)
        .placement(common_model.LegendPlacement.BOTTOM)
        .calcs(list(calcs or ("lastNotNull", "max")))
    )


def _thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds; the first step is the base (value None)."""
    return (
        dashboard.ThresholdsConfig()
        .mode(dashboard_model.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_model.Threshold(value=value, color=color) for value, color in steps])
    )


def _timeseries(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    width: int = 12,
    height: int = 8,
    bars: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    threshold_lines: Sequence[tuple[float | None, str]] = (),
) -> PanelBuilder:
    """A time series panel with a table legend and a shared tooltip."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .legend(_legend())
        .tooltip(
            common.VizTooltipOptions()
            .mode(common_model.TooltipDisplayMode.MULTI)
            .sort(common_model.SortOrder.DESCENDING)
        )
        .line_width(1)
        .fill_opacity(10)
        .show_points(common_model.VisibilityMode.NEVER)
    )
    if bars:
        panel.draw_style(common_model.GraphDrawStyle.BARS).fill_opacity(80)
    if minimum is not None:
        panel.min(minimum)
    if maximum is not None:
        panel.max(maximum)
    if threshold_lines:
        panel.thresholds(_thresholds(*threshold_lines)).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(common_model.GraphTresholdsStyleMode.DASHED)
        )
    return _with_targets(panel, targets)


def _stat(
    title: str,
    description: str,
    unit: str,
    targets: Sequence[Target],
    *,
    width: int = 4,
    height: int = 4,
    thresholds: Sequence[tuple[float | None, str]] = ((None, "green"),),
    show_name: bool = False,
    names_only: bool = False,
) -> PanelBuilder:
    """A single-value panel on the last value; `names_only` shows the series name (mode)."""
    text_mode = common_model.BigValueTextMode.VALUE
    if names_only:
        text_mode = common_model.BigValueTextMode.NAME
    elif show_name:
        text_mode = common_model.BigValueTextMode.VALUE_AND_NAME
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(height)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .text_mode(text_mode)
        .color_mode(common_model.BigValueColorMode.VALUE)
        .graph_mode(common_model.BigValueGraphMode.NONE)
        .justify_mode(common_model.BigValueJustifyMode.AUTO)
        .orientation(common_model.VizOrientation.AUTO)
        .thresholds(_thresholds(*thresholds))
    )
    return _with_targets(panel, targets)


def _bars(
    title: str, description: str, unit: str, targets: Sequence[Target], *, width: int = 12
) -> PanelBuilder:
    """A horizontal bar gauge: one bar per series, like vLLM's per-engine view."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .span(width)
        .height(8)
        .min(0)
        .display_mode(common_model.BarGaugeDisplayMode.GRADIENT)
        .orientation(common_model.VizOrientation.HORIZONTAL)
        .show_unfilled(True)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        .thresholds(_thresholds((None, "green")))
    )
    return _with_targets(panel, targets)


def _timeline(
    title: str,
    description: str,
    targets: Sequence[Target],
    mapping: dict[str, tuple[str, str]],
    *,
    width: int = 12,
) -> PanelBuilder:
    """A state timeline whose 0/1 values are mapped to words and colours."""
    options = {
        value: dashboard_model.ValueMappingResult(text=text, color=color, index=index)
        for index, (value, (text, color)) in enumerate(sorted(mapping.items()))
    }
    panel = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(RATIO)
        .span(width)
        .height(8)
        .legend(_legend("lastNotNull"))
        .show_value(common_model.VisibilityMode.NEVER)
        .merge_values(True)
        .fill_opacity(80)
        .mappings([dashboard_model.ValueMap(options=options)])
        .thresholds(_thresholds((None, "green")))
    )
    return _with_targets(panel, targets)


def _row(title: str) -> dashboard.Row:
    return dashboard.Row(title).datasource(DATASOURCE)


def _variables() -> list[cogbuilder.Builder[dashboard_model.VariableModel]]:
    """`datasource`, `fleet`, and the multi-value `policy` and `worker` (All = `.*`)."""
    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        dashboard.QueryVariable("fleet")
        .label("Fleet")
        .datasource(DATASOURCE)
        .query("label_values(shadow_mirror_kv_tokens, fleet)")
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_model.VariableSort.ALPHABETICAL_ASC),
        dashboard.QueryVariable("policy")
        .label("Policy")
        .datasource(DATASOURCE)
        .query('label_values(shadow_window_imbalance_tokens{fleet="$fleet"}, policy)')
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_model.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dashboard_model.VariableOption(selected=True, text="All", value="$__all")),
        dashboard.QueryVariable("worker")
        .label("Worker")
        .datasource(DATASOURCE)
        .query('label_values(shadow_mirror_kv_tokens{fleet="$fleet"}, worker)')
        .refresh(dashboard_model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dashboard_model.VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dashboard_model.VariableOption(selected=True, text="All", value="$__all")),
    ]


def _dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    """Shared settings: tags, variables, time, refresh, and links to the other three."""
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .timezone("browser")
        .time("now-1h", "now")
        .refresh("30s")
        .tooltip(dashboard_model.DashboardCursorSync.CROSSHAIR)
        .variables(_variables())
        .link(
            dashboard.DashboardLink("Shadow dashboards")
            .type(dashboard_model.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


# -- the four dashboards -------------------------------------------------------------------


def _overview() -> dashboard.Dashboard:
    window = f'{{{FLEET}, {POLICY}, policy!="observed"}}'
    observed = f'{{{FLEET}, policy="observed"}}'
    builder = _dashboard(
        "shadow-overview",
        "Shadow: fleet overview",
        "What the incumbent router did and what every shadow policy would have done on the "
        "same traffic (latest 30-second window replay), with the ratios the gate uses.",
    )
    builder.with_row(_row("Now"))
    builder.with_panel(
        _stat(
            "Mode",
            "Who answers /v1/route: shadow (incumbent routes), live (the promoted policy), "
            "fallback (round-robin after a guard tripped) or latched.",
            RATIO,
            [_query(f"max by (mode) (shadow_mode{{{FLEET}}}) == 1", "{{mode}}", instant=True)],
            names_only=True,
        )
    )
    builder.with_panel(
        _stat(
            "Fallback trips (24 h)",
            "Guard trips that sent /v1/route to the fallback in the last 24 hours.",
            COUNT,
            [_query(f"max(shadow_fallback_trips{{{FLEET}}})", "trips", instant=True)],
            thresholds=((None, "green"), (1, "red")),
        )
    )
    builder.with_panel(
        _stat(
            "Critical violations",
            "Critical invariant violations stored since the database began "
            "(double dispatch, over capacity, invalid shadow decision).",
            COUNT,
            [
                _query(
                    f'sum(shadow_invariant_violations_total{{{FLEET}, severity="critical"}}) '
                    "or vector(0)",
                    "critical",
                    instant=True,
                )
            ],
            thresholds=((None, "green"), (1, "red")),
        )
    )
    builder.with_panel(
        _stat(
            "Ready pool",
            "Requests waiting in the mirror's ready pool.",
            COUNT,
            [_query(f"sum(shadow_pool_requests{{{FLEET}}})", "requests", instant=True)],
        )
    )
    builder.with_panel(
        _stat(
            "Imbalance now",
            "max - min KV tokens across workers in the mirror right now.",
            TOKENS,
            [
                _query(
                    f"max(shadow_observed_imbalance_tokens{{{FLEET}}})", "imbalance", instant=True
                )
            ],
        )
    )
    builder.with_panel(
        _stat(
            "Events accepted",
            "Router and engine events accepted per second.",
            PER_SECOND,
            [
                _query(
                    f'sum(rate(shadow_events_total{{{FLEET}, outcome="accepted"}}{RATE}))',
                    "events/s",
                )
            ],
        )
    )
    builder.with_row(_row("Observed vs counterfactual"))
    builder.with_panel(
        _timeseries(
            "Imbalance per policy",
            "Mean per-step max - min KV load in the latest window: each policy replayed from "
            "the observed start state, against what was observed.",
            TOKENS,
            [
                _query(f"shadow_window_imbalance_tokens{window}", "{{policy}}"),
                _query(f"shadow_window_imbalance_tokens{observed}", "observed (window)"),
                _query(f"shadow_observed_imbalance_tokens{{{FLEET}}}", "observed (mirror now)"),
            ],
        )
    )
    builder.with_panel(
        _timeseries(
            "Barrier gap per policy",
            "Mean per-step gap I(k) = G * max L - sum L in the latest window.",
            TOKENS,
            [
                _query(f"shadow_window_gap_tokens{window}", "{{policy}}"),
                _query(f"shadow_window_gap_tokens{observed}", "observed (window)"),
                _query(f"shadow_observed_gap_tokens{{{FLEET}}}", "observed (mirror now)"),
            ],
        )
    )
    for title, description, unit, metric in (
        ("Throughput per policy", "Output tokens per second in the latest window.",
         TOKENS_PER_S, "shadow_window_throughput_tokens_per_second"),
        ("TPOT P95 per policy", "95th percentile time per output token in the latest window.",
         SECONDS, "shadow_window_tpot_p95_seconds"),
        ("Step time per policy",
         "Mean decode step time in the latest window (the step model T = a * max L + b).",
         SECONDS, "shadow_window_step_seconds"),
    ):  # fmt: skip
        builder.with_panel(
            _timeseries(
                title,
                description,
                unit,
                [
                    _query(f"{metric}{window}", "{{policy}}"),
                    _query(f"{metric}{observed}", "observed"),
                ],
                width=8,
            )
        )
    builder.with_row(_row("Ratios vs the incumbent's replay"))
    for metric, title, better in (
        ("imbalance", "Imbalance ratio vs incumbent", "below 1 is better"),
        ("throughput", "Throughput ratio vs incumbent", "above 1 is better"),
        ("tpot_p95", "TPOT P95 ratio vs incumbent", "below 1 is better"),
    ):
        builder.with_panel(
            _timeseries(
                title,
                f"Latest window: the policy's {metric} over the incumbent's replay ({better}).",
                RATIO,
                [
                    _query(
                        f'shadow_window_ratio{{{FLEET}, {POLICY}, metric="{metric}"}}',
                        "{{policy}}",
                    )
                ],
                width=8,
                threshold_lines=((None, "green"), (1, "orange")),
            )
        )
    builder.with_row(_row("Violations"))
    builder.with_panel(
        _timeseries(
            "New invariant violations by severity",
            "Violations stored per interval (one per incident), by severity.",
            COUNT,
            [
                _query(
                    "sum by (severity) (increase(shadow_invariant_violations_total"
                    f"{{{FLEET}}}{RATE}))",
                    "{{severity}}",
                )
            ],
            width=24,
            bars=True,
        )
    )
    return builder


def _per_worker() -> dashboard.Dashboard:
    selected = f"{{{FLEET}, {WORKER}}}"
    builder = _dashboard(
        "shadow-per-worker",
        "Shadow: per-worker",
        "The mirror's view of each decode worker (KV tokens, active requests) and the age "
        "of each engine's scraped telemetry, keyed on the worker label.",
    )
    builder.with_row(_row("KV load"))
    builder.with_panel(
        _timeseries(
            "KV tokens per worker",
            "KV tokens each worker holds in the mirror: the barrier waits for the largest.",
            TOKENS,
            [_query(f"sum by (worker) (shadow_mirror_kv_tokens{selected})", "worker {{worker}}")],
            width=16,
        )
    )
    builder.with_panel(
        _bars(
            "KV tokens per worker (now)",
            "The latest KV load per worker.",
            TOKENS,
            [
                _query(
                    f"sum by (worker) (shadow_mirror_kv_tokens{selected})",
                    "{{worker}}",
                    instant=True,
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        _timeseries(
            "KV spread across workers",
            "max - min KV load over the selected workers, and the fleet's imbalance over all.",
            TOKENS,
            [
                _query(
                    f"max(shadow_mirror_kv_tokens{selected}) - min(shadow_mirror_kv_tokens"
                    f"{selected})",
                    "max - min (selected workers)",
                ),
                _query(f"max(shadow_observed_imbalance_tokens{{{FLEET}}})", "fleet imbalance"),
            ],
            width=24,
        )
    )
    builder.with_row(_row("Active requests"))
    builder.with_panel(
        _timeseries(
            "Active requests per worker",
            "Requests decoding on each worker in the mirror.",
            COUNT,
            [
                _query(
                    f"sum by (worker) (shadow_mirror_active_requests{selected})",
                    "worker {{worker}}",
                )
            ],
            width=16,
        )
    )
    builder.with_panel(
        _bars(
            "Active requests per worker (now)",
            "The latest active count per worker.",
            COUNT,
            [
                _query(
                    f"sum by (worker) (shadow_mirror_active_requests{selected})",
                    "{{worker}}",
                    instant=True,
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        _timeseries(
            "Ready pool",
            "Requests waiting for a slot (fleet-wide): non-zero means every worker is full.",
            COUNT,
            [_query(f"sum(shadow_pool_requests{{{FLEET}}})", "ready requests")],
            width=24,
            height=6,
        )
    )
    builder.with_row(_row("Engine telemetry"))
    builder.with_panel(
        _timeseries(
            "Telemetry age per worker",
            "Seconds since the last good scrape of each engine's /metrics.",
            SECONDS,
            [
                _query(
                    f"max by (worker) (shadow_telemetry_age_seconds{selected})",
                    "worker {{worker}}",
                )
            ],
            width=10,
        )
    )
    builder.with_panel(
        _timeline(
            "Telemetry stale per worker",
            "Stale when an engine's metrics are older than the service's staleness limit.",
            [
                _query(
                    f"max by (worker) (shadow_telemetry_stale{selected})",
                    "worker {{worker}}",
                )
            ],
            {"0": ("fresh", "green"), "1": ("stale", "red")},
            width=10,
        )
    )
    builder.with_panel(
        _stat(
            "Stale workers",
            "Engines whose telemetry is stale now.",
            COUNT,
            [_query(f"sum(shadow_telemetry_stale{selected})", "stale", instant=True)],
            width=4,
            height=8,
            thresholds=((None, "green"), (1, "red")),
        )
    )
    return builder


def _decisions() -> dashboard.Dashboard:
    selected = f"{{{FLEET}, {POLICY}}}"
    bucket = f"shadow_route_decision_seconds_bucket{{{POLICY}}}"
    builder = _dashboard(
        "shadow-decisions",
        "Shadow: decisions",
        "The decision audit (each dispatch re-decided by every shadow policy on the "
        "incumbent's snapshot) and the latency of live routing on POST /v1/route.",
    )
    builder.with_row(_row("Agreement with the incumbent"))
    builder.with_panel(
        _stat(
            "Agreement now",
            "Share of audited dispatches where the policy chose the incumbent's worker.",
            SHARE,
            [
                _query(
                    f"max by (policy) (shadow_decision_agreement_ratio{selected})",
                    "{{policy}}",
                    instant=True,
                )
            ],
            width=8,
            height=8,
            show_name=True,
        )
    )
    builder.with_panel(
        _timeseries(
            "Agreement ratio per policy",
            "Share of audited dispatches where the policy chose the incumbent's worker.",
            SHARE,
            [_query(f"max by (policy) (shadow_decision_agreement_ratio{selected})", "{{policy}}")],
            width=16,
            minimum=0,
            maximum=1,
        )
    )
    builder.with_row(_row("Regret and volume"))
    builder.with_panel(
        _timeseries(
            "Mean regret per policy",
            "Mean gap change (BR-0 F-score) the best choice had over the incumbent's choice.",
            TOKENS,
            [_query(f"max by (policy) (shadow_decision_regret_tokens{selected})", "{{policy}}")],
        )
    )
    builder.with_panel(
        _timeseries(
            "Audited decisions per second",
            "Dispatches audited per second, per shadow policy.",
            PER_SECOND,
            [
                _query(
                    f"sum by (policy) (rate(shadow_decisions_total{selected}{RATE}))",
                    "{{policy}}",
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        _stat(
            "Audited decisions",
            "Dispatches audited since the database began, per shadow policy.",
            COUNT,
            [
                _query(
                    f"sum by (policy) (shadow_decisions_total{selected})",
                    "{{policy}}",
                    instant=True,
                )
            ],
            width=4,
            height=8,
            show_name=True,
        )
    )
    builder.with_row(_row("POST /v1/route latency"))
    builder.with_panel(
        _timeseries(
            "/v1/route latency quantiles by policy",
            "P50/P95/P99 of the time the live policy took to answer POST /v1/route.",
            SECONDS,
            [
                _query(
                    f"histogram_quantile({quantile}, sum by (le, policy) (rate({bucket}{RATE})))",
                    f"{{{{policy}}}} p{label}",
                )
                for quantile, label in ((0.5, "50"), (0.95, "95"), (0.99, "99"))
            ],
            width=16,
        )
    )
    builder.with_panel(
        _timeseries(
            "/v1/route mean latency",
            "Mean answer time per policy.",
            SECONDS,
            [
                _query(
                    "sum by (policy) (rate(shadow_route_decision_seconds_sum"
                    f"{{{POLICY}}}{RATE})) / sum by (policy) (rate("
                    f"shadow_route_decision_seconds_count{{{POLICY}}}{RATE}))",
                    "{{policy}}",
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        _timeseries(
            "/v1/route requests per second",
            "Routing answers per second, per policy.",
            REQUESTS_PER_SECOND,
            [
                _query(
                    "sum by (policy) (rate(shadow_route_decision_seconds_count"
                    f"{{{POLICY}}}{RATE}))",
                    "{{policy}}",
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        heatmap.Panel()
        .title("/v1/route latency distribution")
        .description("Answers per latency bucket over time (all selected policies).")
        .datasource(DATASOURCE)
        .unit(COUNT)
        .span(16)
        .height(8)
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(SECONDS))
        .cell_values(heatmap.CellValues().unit(COUNT))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(heatmap_model.HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .scale(heatmap_model.HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
        )
        .show_legend()
        .show_tooltip()
        .hide_from(common.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        .with_target(
            _query(f"sum by (le) (increase({bucket}{RATE}))", "{{le}}", heatmap_format=True).ref_id(
                "A"
            )
        )
    )
    return builder


def _integrity() -> dashboard.Dashboard:
    violations = f"shadow_invariant_violations_total{{{FLEET}}}"
    builder = _dashboard(
        "shadow-integrity",
        "Shadow: integrity",
        "Whether the evidence can be trusted: invariant violations, replay fidelity, the "
        "step model, mirror vs engine agreement, telemetry staleness, ingest, and the "
        "mode/fallback history.",
    )
    builder.with_row(_row("Invariant violations"))
    builder.with_panel(
        _timeseries(
            "New violations by kind",
            "Violations stored per interval (one per incident), by kind.",
            COUNT,
            [_query(f"sum by (kind) (increase({violations}{RATE}))", "{{kind}}")],
            bars=True,
        )
    )
    builder.with_panel(
        _timeseries(
            "New violations by severity",
            "Violations stored per interval, by severity (critical blocks promotion).",
            COUNT,
            [_query(f"sum by (severity) (increase({violations}{RATE}))", "{{severity}}")],
            bars=True,
        )
    )
    builder.with_panel(
        _bars(
            "Violations by kind and severity (total)",
            "Violations stored since the database began.",
            COUNT,
            [
                _query(
                    f"sum by (kind, severity) ({violations})",
                    "{{kind}} ({{severity}})",
                    instant=True,
                )
            ],
            width=16,
        )
    )
    builder.with_panel(
        _stat(
            "Critical violations (total)",
            "Critical violations stored since the database began.",
            COUNT,
            [
                _query(
                    f'sum(shadow_invariant_violations_total{{{FLEET}, severity="critical"}}) '
                    "or vector(0)",
                    "critical",
                    instant=True,
                )
            ],
            width=8,
            height=8,
            thresholds=((None, "green"), (1, "red")),
        )
    )
    builder.with_row(_row("Replay fidelity and the step model"))
    builder.with_panel(
        _timeseries(
            "Replay fidelity: incumbent replay / observed",
            "Latest window: the incumbent's counterfactual replay over what was observed; "
            "near 1 means the replay can be trusted (dashed lines at 0.9 and 1.1).",
            RATIO,
            [_query(f"shadow_replay_fidelity_ratio{{{FLEET}}}", "{{metric}}")],
            threshold_lines=((None, "red"), (0.9, "green"), (1.1, "red")),
        )
    )
    builder.with_panel(
        _timeseries(
            "Step model: seconds per KV token (a)",
            "Fitted a of T = a * max L + b (per KV token of the most loaded worker).",
            SECONDS,
            [_query(f"shadow_step_model_seconds_per_token{{{FLEET}}}", "a")],
            width=6,
        )
    )
    builder.with_panel(
        _timeseries(
            "Step model: fixed seconds (b)",
            "Fitted b of T = a * max L + b (the fixed part of a step).",
            SECONDS,
            [_query(f"shadow_step_model_fixed_seconds{{{FLEET}}}", "b")],
            width=6,
        )
    )
    builder.with_row(_row("Mirror, telemetry and ingest"))
    builder.with_panel(
        _timeseries(
            "Mirror state mismatches",
            "Engine steps where the mirror's load or active count differed from the engine's.",
            COUNT,
            [
                _query(
                    f"sum(increase(shadow_mirror_state_mismatches_total{{{FLEET}}}{RATE}))",
                    "mismatched steps",
                )
            ],
            width=8,
            bars=True,
        )
    )
    builder.with_panel(
        _timeseries(
            "Stale engines",
            "Engines whose scraped telemetry is older than the staleness limit.",
            COUNT,
            [_query(f"sum(shadow_telemetry_stale{{{FLEET}}})", "stale engines")],
            width=8,
            minimum=0,
        )
    )
    builder.with_panel(
        _timeseries(
            "Oldest telemetry",
            "Age of the oldest last good scrape across engines.",
            SECONDS,
            [_query(f"max(shadow_telemetry_age_seconds{{{FLEET}}})", "oldest scrape")],
            width=8,
        )
    )
    builder.with_panel(
        _timeseries(
            "Events by type and outcome",
            "Events per second by type and outcome (accepted, duplicate), and malformed "
            "events rejected (not attributable to a fleet).",
            PER_SECOND,
            [
                _query(
                    f"sum by (type, outcome) (rate(shadow_events_total{{{FLEET}}}{RATE}))",
                    "{{type}} {{outcome}}",
                ),
                _query(f"sum(rate(shadow_events_rejected_total{RATE}))", "rejected (malformed)"),
            ],
            width=24,
        )
    )
    builder.with_row(_row("Mode and fallback"))
    builder.with_panel(
        _timeline(
            "Mode timeline",
            "The fleet's mode over time: shadow, live, fallback or latched.",
            [_query(f"max by (mode) (shadow_mode{{{FLEET}}})", "{{mode}}")],
            {"0": ("", "transparent"), "1": ("current", "blue")},
            width=16,
        )
    )
    builder.with_panel(
        _timeseries(
            "Fallback trips (rolling 24 h)",
            "Guard trips in the last 24 hours; each sent /v1/route to the fallback.",
            COUNT,
            [_query(f"max(shadow_fallback_trips{{{FLEET}}})", "trips in 24 h")],
            width=8,
            minimum=0,
        )
    )
    return builder


#: filename stem -> builder; the stems are the files in dashboards/.
BUILDERS = {
    "shadow-overview": _overview,
    "shadow-per-worker": _per_worker,
    "shadow-decisions": _decisions,
    "shadow-integrity": _integrity,
}


# -- public API ------------------------------------------------------------------------------


def _to_json(model: dashboard_model.Dashboard) -> dict[str, Any]:
    """Number the panels (Grafana needs unique ids) and encode the model as plain JSON."""
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return json.loads(json.dumps(model, cls=JSONEncoder))


def build_dashboards() -> dict[str, dict[str, Any]]:
    """Every dashboard as a Grafana JSON model, keyed by its file name (`<uid>.json`)."""
    return {f"{name}.json": _to_json(build().build()) for name, build in BUILDERS.items()}


def render(dashboard_json: dict[str, Any]) -> str:
    """The committed text of a dashboard: sorted keys, indent 2, trailing newline."""
    return json.dumps(dashboard_json, indent=2, sort_keys=True) + "\n"


def export(directory: Path) -> list[Path]:
    """Write every dashboard to `directory` (created if missing); the same bytes every run."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, model in sorted(build_dashboards().items()):
        path = directory / filename
        path.write_text(render(model))
        written.append(path)
    return written


def iter_panels(dashboard_json: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in dashboard_json.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def promql_expressions(dashboard_json: dict[str, Any]) -> list[str]:
    """Every target's PromQL expression, in panel order (variable queries excluded)."""
    return [
        target["expr"]
        for panel in iter_panels(dashboard_json)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


# -- provisioning --------------------------------------------------------------------------


class ProvisionError(RuntimeError):
    """Provisioning failed for a reason a person can act on (the message says which)."""


def _folder_uid(title: str) -> str:
    """A stable folder uid from its title, so reruns find the folder they created."""
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:40].strip("-")
    return slug or "balanceroute-shadow"


def _with_datasource(model: dict[str, Any], name: str, uid: str) -> dict[str, Any]:
    """Preselect the provisioned datasource in the `datasource` variable."""
    model = copy.deepcopy(model)
    for variable in model["templating"]["list"]:
        if variable["name"] == "datasource":
            variable["current"] = {"selected": True, "text": name, "value": uid}
    return model


def _grafana_api(url: str, token: str) -> Any:
    from grafana_client import GrafanaApi

    base = url.rstrip("/")
    if re.match(r"^https?://[^/]+/.+", base):
        base += "/"  # grafana-client appends "api" to the path prefix verbatim
    return GrafanaApi.from_url(base, credential=token, timeout=10.0)


def _find_folder(api: Any, title: str, uid: str) -> dict[str, Any] | None:
    hits = api.search.search_dashboards(query=title, type_="dash-folder")
    for hit in hits or []:
        if hit.get("uid") == uid or hit.get("title") == title:
            return {"uid": hit["uid"], "title": hit.get("title", title)}
    return None


def _ensure_folder(api: Any, title: str) -> dict[str, Any]:
    from grafana_client.client import GrafanaClientError

    uid = _folder_uid(title)
    found = _find_folder(api, title, uid)
    if found is not None:
        return found | {"action": "reused"}
    try:
        created = api.folder.create_folder(title, uid=uid)
    except GrafanaClientError as error:
        if error.status_code not in (409, 412):  # created concurrently: look again
            raise
        found = _find_folder(api, title, uid)
        if found is None:
            raise
        return found | {"action": "reused"}
    return {"uid": created["uid"], "title": created.get("title", title), "action": "created"}


def _ensure_datasource(api: Any, url: str) -> dict[str, Any]:
    from grafana_client.client import GrafanaClientError

    wanted = {"type": "prometheus", "access": "proxy", "url": url}
    try:
        existing = api.datasource.get_datasource_by_name(DATASOURCE_NAME)
    except GrafanaClientError as error:
        if error.status_code != 404:
            raise
        existing = None
    if existing is None:
        body = {
            "name": DATASOURCE_NAME,
            "uid": DATASOURCE_NAME,
            "isDefault": False,
            "jsonData": {"httpMethod": "POST"},
        } | wanted
        created = api.datasource.create_datasource(body)
        source = created.get("datasource", {})
        return {
            "name": DATASOURCE_NAME,
            "uid": source.get("uid", DATASOURCE_NAME),
            "url": url,
            "action": "created",
        }
    uid = existing.get("uid", DATASOURCE_NAME)
    if all(existing.get(key) == value for key, value in wanted.items()):
        return {"name": DATASOURCE_NAME, "uid": uid, "url": url, "action": "unchanged"}
    keep = (
        "name",
        "uid",
        "type",
        "access",
        "url",
        "isDefault",
        "jsonData",
        "basicAuth",
        "basicAuthUser",
        "withCredentials",
        "version",
    )
    body = {key: existing[key] for key in keep if key in existing} | wanted
    api.datasource.update_datasource_by_uid(uid, body)
    return {"name": DATASOURCE_NAME, "uid": uid, "url": url, "action": "updated"}


def provision(
    url: str,
    token: str,
    *,
    folder: str = DEFAULT_FOLDER,
    datasource_url: str | None = None,
) -> dict[str, Any]:
    """Push the dashboards into Grafana at `url`; safe to rerun (folder and datasource are
    reused, dashboards overwritten by uid). With `datasource_url`, a Prometheus datasource
    named `shadow-prometheus` is created or pointed there and preselected in the dashboards.

    Returns what was done: `{"grafana", "folder", "datasource", "dashboards"}`; raises
    `ProvisionError` with a readable message on refused connections, bad tokens and
    Grafana errors.
    """
    import niquests
    from grafana_client.client import (
        GrafanaClientError,
        GrafanaException,
        GrafanaTimeoutError,
        GrafanaUnauthorizedError,
    )

    api = _grafana_api(url, token)
    try:
        folder_info = _ensure_folder(api, folder)
        source = None
        if datasource_url is not None:
            source = _ensure_datasource(api, datasource_url)
        results = []
        for _, model in sorted(build_dashboards().items()):
            if source is not None:
                model = _with_datasource(model, source["name"], source["uid"])
            answer = api.dashboard.update_dashboard(
                {
                    "dashboard": model,
                    "folderUid": folder_info["uid"],
                    "overwrite": True,
                    "message": "provisioned by `shadow dashboards provision`",
                }
            )
            version = answer.get("version")
            results.append(
                {
                    "uid": answer.get("uid", model["uid"]),
                    "title": model["title"],
                    "url": answer.get("url"),
                    "version": version,
                    "action": "created" if version == 1 else "updated",
                }
            )
    except GrafanaUnauthorizedError as error:
        raise ProvisionError(
            f"Grafana at {url} rejected the token (401 Unauthorized): check --token "
            "(a service account token with the Editor or Admin role)"
        ) from error
    except GrafanaTimeoutError as error:
        raise ProvisionError(f"Grafana at {url} did not answer in time: {error}") from error
    except GrafanaClientError as error:
        hint = " (the token lacks permission: Editor or Admin needed)"
        raise ProvisionError(
            f"Grafana at {url} refused a request: {error.message}"
            f"{hint if error.status_code == 403 else ''}"
        ) from error
    except GrafanaException as error:
        raise ProvisionError(f"Grafana at {url} failed: {error.message}") from error
    except niquests.exceptions.ConnectionError as error:
        raise ProvisionError(
            f"cannot connect to Grafana at {url} (connection refused or host unreachable)"
        ) from error
    except (niquests.exceptions.RequestException, ValueError) as error:
        raise ProvisionError(f"talking to Grafana at {url} failed: {error}") from error
    return {"grafana": url, "folder": folder_info, "datasource": source, "dashboards": results}
