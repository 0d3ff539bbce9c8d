"""schemathesis against the running service's own OpenAPI document, over real HTTP: for
every operation, generated valid and invalid inputs never get a 5xx and every response
matches the documented schema.

Requests go out through httpx: the `requests` transport schemathesis ships with breaks
beside urllib3-future (pulled in by grafana-client's niquests), and httpx is what this
project's clients use anyway.
"""

from __future__ import annotations

import os

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance

from tests.service_helpers import Server, batches, post, record

EXAMPLES = int(os.environ.get("SHADOW_FUZZ_EXAMPLES", "25"))  # more: a deeper local run


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A server holding a little of everything: events, decisions, a gate run."""
    root = tmp_path_factory.mktemp("fuzz")
    log = root / "events.jsonl"
    record(log, 200)
    server = Server(root / "shadow.duckdb").start()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for body in batches(log):
            post(client, server.url, body)
        client.post("/v1/flush")
        client.post("/v1/fleets/default/gate/dry-run", json={"candidate": "br0"})
        yield server.url, client
    server.stop()


def _document() -> dict:
    """The OpenAPI document, from the app itself (the server serves exactly this one)."""
    from shadow.service.http.app import create_app
    from shadow.service.settings import load_settings

    return create_app(load_settings(None)).openapi()


schema = schemathesis.openapi.from_dict(_document())


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_server_errors_and_responses_match_the_schema(case, live):
    url, client = live
    kwargs = case.as_transport_kwargs(base_url=url)
    response = client.request(
        kwargs["method"],
        kwargs["url"],
        params=kwargs.get("params"),
        headers=kwargs.get("headers"),
        json=kwargs.get("json"),
        content=kwargs.get("data"),
    )
    case.validate_response(
        response,
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
    )
