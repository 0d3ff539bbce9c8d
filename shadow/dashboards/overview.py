"""The fleet overview: what the incumbent did, what every shadow policy would have
done on the same traffic, and the ratios the gate uses."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from shadow.dashboards.panels import (
    COUNT,
    FLEET,
    PER_SECOND,
    POLICY,
    RATE,
    RATIO,
    SECONDS,
    TOKENS,
    TOKENS_PER_S,
    base_dashboard,
    prom_query,
    row,
    stat_panel,
    timeseries_panel,
)


def build() -> dashboard.Dashboard:
    """The `shadow-overview` dashboard, unnumbered (the catalog numbers the panels)."""
    window = f'{{{FLEET}, {POLICY}, policy!="observed"}}'
    observed = f'{{{FLEET}, policy="observed"}}'
    builder = base_dashboard(
        "shadow-overview",
        "Shadow: fleet overview",
        "What the incumbent router did and what every shadow policy would have done on the "
        "same traffic (latest 30-second window replay), with the ratios the gate uses.",
    )
    builder.with_row(row("Now"))
    builder.with_panel(
        stat_panel(
            "Mode",
            "Who answers /v1/route: shadow (incumbent routes), live (the promoted policy), "
            "fallback (round-robin after a guard tripped) or latched.",
            RATIO,
            [prom_query(f"max by (mode) (shadow_mode{{{FLEET}}}) == 1", "{{mode}}", instant=True)],
            names_only=True,
        )
    )
    builder.with_panel(
        stat_panel(
            "Fallback trips (24 h)",
            "Guard trips that sent /v1/route to the fallback in the last 24 hours.",
            COUNT,
            [prom_query(f"max(shadow_fallback_trips{{{FLEET}}})", "trips", instant=True)],
            thresholds=((None, "green"), (1, "red")),
        )
    )
    builder.with_panel(
        stat_panel(
            "Critical violations",
            "Critical invariant violations stored since the database began "
            "(double dispatch, over capacity, invalid shadow decision).",
            COUNT,
            [
                prom_query(
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
        stat_panel(
            "Ready pool",
            "Requests waiting in the mirror's ready pool.",
            COUNT,
            [prom_query(f"sum(shadow_pool_requests{{{FLEET}}})", "requests", instant=True)],
        )
    )
    builder.with_panel(
        stat_panel(
            "Imbalance now",
            "max - min KV tokens across workers in the mirror right now.",
            TOKENS,
            [
                prom_query(
                    f"max(shadow_observed_imbalance_tokens{{{FLEET}}})", "imbalance", instant=True
                )
            ],
        )
    )
    builder.with_panel(
        stat_panel(
            "Events accepted",
            "Router and engine events accepted per second.",
            PER_SECOND,
            [
                prom_query(
                    f'sum(rate(shadow_events_total{{{FLEET}, outcome="accepted"}}{RATE}))',
                    "events/s",
                )
            ],
        )
    )
    builder.with_row(row("Observed vs counterfactual"))
    builder.with_panel(
        timeseries_panel(
            "Imbalance per policy",
            "Mean per-step max - min KV load in the latest window: each policy replayed from "
            "the observed start state, against what was observed.",
            TOKENS,
            [
                prom_query(f"shadow_window_imbalance_tokens{window}", "{{policy}}"),
                prom_query(f"shadow_window_imbalance_tokens{observed}", "observed (window)"),
                prom_query(f"shadow_observed_imbalance_tokens{{{FLEET}}}", "observed (mirror now)"),
            ],
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Barrier gap per policy",
            "Mean per-step gap I(k) = G * max L - sum L in the latest window.",
            TOKENS,
            [
                prom_query(f"shadow_window_gap_tokens{window}", "{{policy}}"),
                prom_query(f"shadow_window_gap_tokens{observed}", "observed (window)"),
                prom_query(f"shadow_observed_gap_tokens{{{FLEET}}}", "observed (mirror now)"),
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
            timeseries_panel(
                title,
                description,
                unit,
                [
                    prom_query(f"{metric}{window}", "{{policy}}"),
                    prom_query(f"{metric}{observed}", "observed"),
                ],
                width=8,
            )
        )
    builder.with_row(row("Ratios vs the incumbent's replay"))
    for metric, title, better in (
        ("imbalance", "Imbalance ratio vs incumbent", "below 1 is better"),
        ("throughput", "Throughput ratio vs incumbent", "above 1 is better"),
        ("tpot_p95", "TPOT P95 ratio vs incumbent", "below 1 is better"),
    ):
        builder.with_panel(
            timeseries_panel(
                title,
                f"Latest window: the policy's {metric} over the incumbent's replay ({better}).",
                RATIO,
                [
                    prom_query(
                        f'shadow_window_ratio{{{FLEET}, {POLICY}, metric="{metric}"}}',
                        "{{policy}}",
                    )
                ],
                width=8,
                threshold_lines=((None, "green"), (1, "orange")),
            )
        )
    builder.with_row(row("Violations"))
    builder.with_panel(
        timeseries_panel(
            "New invariant violations by severity",
            "Violations stored per interval (one per incident), by severity.",
            COUNT,
            [
                prom_query(
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
