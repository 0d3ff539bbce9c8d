"""Per worker: the mirror's view of each decode worker (KV tokens, active requests) and
the age of each engine's scraped telemetry."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from shadow.dashboards.panels import (
    COUNT,
    FLEET,
    SECONDS,
    TOKENS,
    WORKER,
    bar_gauge_panel,
    base_dashboard,
    prom_query,
    row,
    stat_panel,
    timeline_panel,
    timeseries_panel,
)


def build() -> dashboard.Dashboard:
    """The `shadow-per-worker` dashboard, unnumbered (the catalog numbers the panels)."""
    selected = f"{{{FLEET}, {WORKER}}}"
    builder = base_dashboard(
        "shadow-per-worker",
        "Shadow: per-worker",
        "The mirror's view of each decode worker (KV tokens, active requests) and the age "
        "of each engine's scraped telemetry, keyed on the worker label.",
    )
    builder.with_row(row("KV load"))
    builder.with_panel(
        timeseries_panel(
            "KV tokens per worker",
            "KV tokens each worker holds in the mirror: the barrier waits for the largest.",
            TOKENS,
            [
                prom_query(
                    f"sum by (worker) (shadow_mirror_kv_tokens{selected})", "worker {{worker}}"
                )
            ],
            width=16,
        )
    )
    builder.with_panel(
        bar_gauge_panel(
            "KV tokens per worker (now)",
            "The latest KV load per worker.",
            TOKENS,
            [
                prom_query(
                    f"sum by (worker) (shadow_mirror_kv_tokens{selected})",
                    "{{worker}}",
                    instant=True,
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "KV spread across workers",
            "max - min KV load over the selected workers, and the fleet's imbalance over all.",
            TOKENS,
            [
                prom_query(
                    f"max(shadow_mirror_kv_tokens{selected}) - min(shadow_mirror_kv_tokens"
                    f"{selected})",
                    "max - min (selected workers)",
                ),
                prom_query(f"max(shadow_observed_imbalance_tokens{{{FLEET}}})", "fleet imbalance"),
            ],
            width=24,
        )
    )
    builder.with_row(row("Active requests"))
    builder.with_panel(
        timeseries_panel(
            "Active requests per worker",
            "Requests decoding on each worker in the mirror.",
            COUNT,
            [
                prom_query(
                    f"sum by (worker) (shadow_mirror_active_requests{selected})",
                    "worker {{worker}}",
                )
            ],
            width=16,
        )
    )
    builder.with_panel(
        bar_gauge_panel(
            "Active requests per worker (now)",
            "The latest active count per worker.",
            COUNT,
            [
                prom_query(
                    f"sum by (worker) (shadow_mirror_active_requests{selected})",
                    "{{worker}}",
                    instant=True,
                )
            ],
            width=8,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Ready pool",
            "Requests waiting for a slot (fleet-wide): non-zero means every worker is full.",
            COUNT,
            [prom_query(f"sum(shadow_pool_requests{{{FLEET}}})", "ready requests")],
            width=24,
            height=6,
        )
    )
    builder.with_row(row("Engine telemetry"))
    builder.with_panel(
        timeseries_panel(
            "Telemetry age per worker",
            "Seconds since the last good scrape of each engine's /metrics.",
            SECONDS,
            [
                prom_query(
                    f"max by (worker) (shadow_telemetry_age_seconds{selected})",
                    "worker {{worker}}",
                )
            ],
            width=10,
        )
    )
    builder.with_panel(
        timeline_panel(
            "Telemetry stale per worker",
            "Stale when an engine's metrics are older than the service's staleness limit.",
            [
                prom_query(
                    f"max by (worker) (shadow_telemetry_stale{selected})",
                    "worker {{worker}}",
                )
            ],
            {"0": ("fresh", "green"), "1": ("stale", "red")},
            width=10,
        )
    )
    builder.with_panel(
        stat_panel(
            "Stale workers",
            "Engines whose telemetry is stale now.",
            COUNT,
            [prom_query(f"sum(shadow_telemetry_stale{selected})", "stale", instant=True)],
            width=4,
            height=8,
            thresholds=((None, "green"), (1, "red")),
        )
    )
    return builder
