"""Benchmarks that print numbers: speed targets are checked here, not in timed unit tests."""
