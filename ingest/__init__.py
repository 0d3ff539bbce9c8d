"""Event schema and sources: HTTP, files, tap proxy, metrics poller, traces, emulated fleet."""
