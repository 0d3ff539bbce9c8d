"""What every shadow dashboard shares: units, label filters, variables, the dashboard
frame and the panel builders, so the four dashboards differ only in what they show."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    dashboard,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models import common as common_model
from grafana_foundation_sdk.models import dashboard as dashboard_model
from grafana_foundation_sdk.models import prometheus as prometheus_model

TAG = "balanceroute-shadow"

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


# -- panel builders ------------------------------------------------------------------------


def prom_query(
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


def with_targets(panel: Any, targets: Sequence[Target]) -> Any:
    """Attach targets with ref ids A, B, C... (Grafana needs them unique per panel)."""
    for index, target in enumerate(targets):
        panel.with_target(target.ref_id(chr(ord("A") + index)))
    return panel


def table_legend(*calcs: str) -> common.VizLegendOptions:
    """A visible table legend so every series can be read with its last and max values."""
    return (
        common.VizLegendOptions()
        .show_legend(True)
        .display_mode(common_model.LegendDisplayMode.TABLE)
        .placement(common_model.LegendPlacement.BOTTOM)
        .calcs(list(calcs or ("lastNotNull", "max")))
    )


def absolute_thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    """Absolute thresholds; the first step is the base (value None)."""
    return (
        dashboard.ThresholdsConfig()
        .mode(dashboard_model.ThresholdsMode.ABSOLUTE)
        .steps([dashboard_model.Threshold(value=value, color=color) for value, color in steps])
    )


def timeseries_panel(
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
        .legend(table_legend())
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
        panel.thresholds(absolute_thresholds(*threshold_lines)).thresholds_style(
            common.GraphThresholdsStyleConfig().mode(common_model.GraphTresholdsStyleMode.DASHED)
        )
    return with_targets(panel, targets)


def stat_panel(
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
        .thresholds(absolute_thresholds(*thresholds))
    )
    return with_targets(panel, targets)


def bar_gauge_panel(
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
        .thresholds(absolute_thresholds((None, "green")))
    )
    return with_targets(panel, targets)


def timeline_panel(
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
        .legend(table_legend("lastNotNull"))
        .show_value(common_model.VisibilityMode.NEVER)
        .merge_values(True)
        .fill_opacity(80)
        .mappings([dashboard_model.ValueMap(options=options)])
        .thresholds(absolute_thresholds((None, "green")))
    )
    return with_targets(panel, targets)


def row(title: str) -> dashboard.Row:
    return dashboard.Row(title).datasource(DATASOURCE)


def variables() -> list[cogbuilder.Builder[dashboard_model.VariableModel]]:
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


def base_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
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
        .variables(variables())
        .link(
            dashboard.DashboardLink("Shadow dashboards")
            .type(dashboard_model.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )
