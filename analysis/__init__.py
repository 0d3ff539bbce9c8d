"""Metrics, step-time fit, statistics and reports computed from per-step series."""
