"""Integrity: whether the evidence can be trusted (invariant violations, replay fidelity,
the step model, mirror vs engine, telemetry, ingest, mode and fallback history)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from shadow.dashboards.panels import (
    COUNT,
    FLEET,
    PER_SECOND,
    RATE,
    RATIO,
    SECONDS,
    bar_gauge_panel,
    base_dashboard,
    prom_query,
    row,
    stat_panel,
    timeline_panel,
    timeseries_panel,
)


def build() -> dashboard.Dashboard:
    """The `shadow-integrity` dashboard, unnumbered (the catalog numbers the panels)."""
    violations = f"shadow_invariant_violations_total{{{FLEET}}}"
    builder = base_dashboard(
        "shadow-integrity",
        "Shadow: integrity",
        "Whether the evidence can be trusted: invariant violations, replay fidelity, the "
        "step model, mirror vs engine agreement, telemetry staleness, ingest, and the "
        "mode/fallback history.",
    )
    builder.with_row(row("Invariant violations"))
    builder.with_panel(
        timeseries_panel(
            "New violations by kind",
            "Violations stored per interval (one per incident), by kind.",
            COUNT,
            [prom_query(f"sum by (kind) (increase({violations}{RATE}))", "{{kind}}")],
            bars=True,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "New violations by severity",
            "Violations stored per interval, by severity (critical blocks promotion).",
            COUNT,
            [prom_query(f"sum by (severity) (increase({violations}{RATE}))", "{{severity}}")],
            bars=True,
        )
    )
    builder.with_panel(
        bar_gauge_panel(
            "Violations by kind and severity (total)",
            "Violations stored since the database began.",
            COUNT,
            [
                prom_query(
                    f"sum by (kind, severity) ({violations})",
                    "{{kind}} ({{severity}})",
                    instant=True,
                )
            ],
            width=16,
        )
    )
    builder.with_panel(
        stat_panel(
            "Critical violations (total)",
            "Critical violations stored since the database began.",
            COUNT,
            [
                prom_query(
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
    builder.with_row(row("Replay fidelity and the step model"))
    builder.with_panel(
        timeseries_panel(
            "Replay fidelity: incumbent replay / observed",
            "Latest window: the incumbent's counterfactual replay over what was observed; "
            "near 1 means the replay can be trusted (dashed lines at 0.9 and 1.1).",
            RATIO,
            [prom_query(f"shadow_replay_fidelity_ratio{{{FLEET}}}", "{{metric}}")],
            threshold_lines=((None, "red"), (0.9, "green"), (1.1, "red")),
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Step model: seconds per KV token (a)",
            "Fitted a of T = a * max L + b (per KV token of the most loaded worker).",
            SECONDS,
            [prom_query(f"shadow_step_model_seconds_per_token{{{FLEET}}}", "a")],
            width=6,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Step model: fixed seconds (b)",
            "Fitted b of T = a * max L + b (the fixed part of a step).",
            SECONDS,
            [prom_query(f"shadow_step_model_fixed_seconds{{{FLEET}}}", "b")],
            width=6,
        )
    )
    builder.with_row(row("Mirror, telemetry and ingest"))
    builder.with_panel(
        timeseries_panel(
            "Mirror state mismatches",
            "Engine steps where the mirror's load or active count differed from the engine's.",
            COUNT,
            [
                prom_query(
                    f"sum(increase(shadow_mirror_state_mismatches_total{{{FLEET}}}{RATE}))",
                    "mismatched steps",
                )
            ],
            width=8,
            bars=True,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Stale engines",
            "Engines whose scraped telemetry is older than the staleness limit.",
            COUNT,
            [prom_query(f"sum(shadow_telemetry_stale{{{FLEET}}})", "stale engines")],
            width=8,
            minimum=0,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Oldest telemetry",
            "Age of the oldest last good scrape across engines.",
            SECONDS,
            [prom_query(f"max(shadow_telemetry_age_seconds{{{FLEET}}})", "oldest scrape")],
            width=8,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Events by type and outcome",
            "Events per second by type and outcome (accepted, duplicate), and malformed "
            "events rejected (not attributable to a fleet).",
            PER_SECOND,
            [
                prom_query(
                    f"sum by (type, outcome) (rate(shadow_events_total{{{FLEET}}}{RATE}))",
                    "{{type}} {{outcome}}",
                ),
                prom_query(
                    f"sum(rate(shadow_events_rejected_total{RATE}))", "rejected (malformed)"
                ),
            ],
            width=24,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Late events by source",
            "Events applied after later ones of their fleet, per second, by sender: one that "
            "lags past the reorder window (or whose clock is off). By type in the snapshot.",
            PER_SECOND,
            [
                prom_query(
                    f"sum by (source) (rate(shadow_late_events_total{{{FLEET}}}{RATE}))",
                    "{{source}}",
                )
            ],
            width=24,
        )
    )
    builder.with_row(row("Mode and fallback"))
    builder.with_panel(
        timeline_panel(
            "Mode timeline",
            "The fleet's mode over time: shadow, live, fallback or latched.",
            [prom_query(f"max by (mode) (shadow_mode{{{FLEET}}})", "{{mode}}")],
            {"0": ("", "transparent"), "1": ("current", "blue")},
            width=16,
        )
    )
    builder.with_panel(
        timeseries_panel(
            "Fallback trips (rolling 24 h)",
            "Guard trips in the last 24 hours; each sent /v1/route to the fallback.",
            COUNT,
            [prom_query(f"max(shadow_fallback_trips{{{FLEET}}})", "trips in 24 h")],
            width=8,
            minimum=0,
        )
    )
    return builder
