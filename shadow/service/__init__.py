"""The shadow service: ingest pipeline, storage, HTTP API."""
