"""Decisions: the decision audit against the incumbent and the latency of live routing."""

from __future__ import annotations

from grafana_foundation_sdk.builders import common, dashboard, heatmap
from grafana_foundation_sdk.models import heatmap as heatmap_model

from shadow.dashboards.panels import (
    COUNT,
    DATASOURCE,
    FLEET,
    PER_SECOND,
    POLICY,
    RATE,
    REQUESTS_PER_SECOND,
    SECONDS,
    SHARE,
    TOKENS,
    base_dashboard,
    prom_query,
    row,
    stat_panel,
    timeseries_panel,
)


def build() -> dashboard.Dashboard:
    """The `shadow-decisions` dashboard, unnumbered (the catalog numbers the panels)."""
    selected = f"{{{FLEET}, {POLICY}}}"
    bucket = f"shadow_route_decision_seconds_bucket{{{POLICY}}}"
    builder = base_dashboard(
        "shadow-decisions",
        "Shadow: decisions",
        "The decision audit (each dispatch re-decided by every shadow policy on the "
        "incumbent's snapshot) and the latency of live routing on POST /v1/route.",
    )
    builder.with_row(row("Agreement with the incumbent"))
    builder.with_panel(
        stat_panel(
            "Agreement now",
            "Share of audited dispatches where the policy chose the incumbent's worker.",
            SHARE,
            [
                prom_query(
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
        timeseries_panel(
            "Agreement ratio per policy",
            "Share of audited dispatches where the policy chose the incumbent's worker.",
            SHARE,
            [
                prom_query(
                    f"max by (policy) (shadow_decision_agreement_ratio{selected})", "{{policy}}"
                )
            ],
            width=16,
            minimum=0,
            maximum=1,
        )
    )
    builder.with_row(row("Regret and volume"))
    builder.with_panel(
        timeseries_panel(
            "Mean regret per policy",
            "Mean gap change (BR-0 F-score) the best choice had over the incumbent's choice.",
            TOKENS,
            [
                prom_query(
                    f"max by (policy) (shadow_decision_regret_tokens{selected})", "{{policy}}"
                )
            ],
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Audited decisions per second",
            "Dispatches audited per second, per shadow policy.",
            PER_SECOND,
            [
                prom_query(
                    f"sum by (policy) (rate(shadow_decisions_total{selected}{RATE}))",
                    "{{policy}}",
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        stat_panel(
            "Audited decisions",
            "Dispatches audited since the database began, per shadow policy.",
            COUNT,
            [
                prom_query(
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
    builder.with_row(row("POST /v1/route latency"))
    builder.with_panel(
        timeseries_panel(
            "/v1/route latency quantiles by policy",
            "P50/P95/P99 of the time the live policy took to answer POST /v1/route.",
            SECONDS,
            [
                prom_query(
                    f"histogram_quantile({quantile}, sum by (le, policy) (rate({bucket}{RATE})))",
                    f"{{{{policy}}}} p{label}",
                )
                for quantile, label in ((0.5, "50"), (0.95, "95"), (0.99, "99"))
            ],
            width=16,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "/v1/route mean latency",
            "Mean answer time per policy.",
            SECONDS,
            [
                prom_query(
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
        timeseries_panel(
            "/v1/route requests per second",
            "Routing answers per second, per policy.",
            REQUESTS_PER_SECOND,
            [
                prom_query(
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
            prom_query(
                f"sum by (le) (increase({bucket}{RATE}))", "{{le}}", heatmap_format=True
            ).ref_id("A")
        )
    )
    return builder
