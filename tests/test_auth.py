"""Bearer tokens with roles on a real server: every write refuses a missing, wrong or
under-privileged token; reads need a token once a read token exists; tokens never show
in the server's output or in an error."""

from __future__ import annotations

import json

import httpx
import pytest

from shadow.service.http.auth import TokenTable, check, required_role
from shadow.service.settings import load_settings
from tests.service_helpers import Server

INGEST = "ingest-token-0123456789abcdef"
OPERATOR = "operator-token-0123456789abcdef"
READ = "read-token-0123456789abcdef"
WRONG = "wrong-token-0123456789abcdef"
EVENTS = "\n".join(
    json.dumps(e)
    for e in [
        {"type": "worker", "ts": 1.0, "worker": "w0", "capacity": 4},
        {"type": "ready", "ts": 1.5, "request_id": "r1", "prompt_tokens": 10},
        {"type": "dispatch", "ts": 2.0, "request_id": "r1", "worker": "w0"},
    ]
)
#: every write endpoint, with a body it would accept, and the role it needs
WRITES = [
    ("/v1/events", {"content": EVENTS, "headers": {"content-type": "application/x-ndjson"}},
     "ingest"),
    ("/v1/flush", {}, "ingest"),
    ("/v1/route", {"json": {"requests": [{"request_id": "x", "prompt_tokens": 5}]}}, "ingest"),
    ("/v1/fleets/default/mode", {"json": {"action": "freeze", "reason": "test"}}, "operator"),
    ("/v1/fleets/default/gate/dry-run", {"json": {"candidate": "br0"}}, "operator"),
    ("/v1/fleets/default/gate", {"json": {"candidate": "br0", "dry_run": True}}, "operator"),
]  # fmt: skip
TOKEN_OF = {"ingest": INGEST, "operator": OPERATOR, "read": READ}


def _config(path, *, with_read: bool = True):
    entries = [("sources", INGEST, "ingest"), ("oncall", OPERATOR, "operator")]
    if with_read:
        entries.append(("dashboards", READ, "read"))
    path.write_text(
        "".join(
            f'[[tokens]]\nname = "{n}"\ntoken = "{t}"\nroles = ["{r}"]\n' for n, t, r in entries
        )
    )
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("auth")
    running = Server(root / "shadow.duckdb", _config(root / "service.toml")).start()
    yield running
    running.stop()


def bearer(token: str | None) -> dict[str, str]:
    return {} if token is None else {"authorization": f"Bearer {token}"}


@pytest.mark.parametrize(("path", "request_kwargs", "role"), WRITES)
def test_every_write_refuses_missing_wrong_and_underprivileged_tokens(
    server, path, request_kwargs, role
):
    running = server
    headers = dict(request_kwargs.get("headers", {}))
    kwargs = {k: v for k, v in request_kwargs.items() if k != "headers"}
    with httpx.Client(base_url=running.url, timeout=30) as client:
        for token, status in [(None, 401), (WRONG, 401)] + [
            (TOKEN_OF[other], 403) for other in TOKEN_OF if other != role and other != "read"
        ] + [(READ, 403)]:  # fmt: skip
            response = client.post(path, headers={**headers, **bearer(token)}, **kwargs)
            assert response.status_code == status, (path, token, response.text)
            assert WRONG not in response.text and INGEST not in response.text
            if status == 401:
                assert response.headers["www-authenticate"].startswith("Bearer")
        allowed = client.post(path, headers={**headers, **bearer(TOKEN_OF[role])}, **kwargs)
        assert allowed.status_code not in (401, 403), allowed.text


def test_reads_need_a_token_once_a_read_token_exists(server):
    running = server
    with httpx.Client(base_url=running.url, timeout=30) as client:
        for path in ("/v1/fleets", "/metrics", "/openapi.json", "/v1/audit/log"):
            assert client.get(path).status_code == 401
            assert client.get(path, headers=bearer(WRONG)).status_code == 401
            assert client.get(path, headers=bearer(INGEST)).status_code == 403
            assert client.get(path, headers=bearer(READ)).status_code == 200
            assert client.get(path, headers=bearer(OPERATOR)).status_code == 200
        for path in ("/healthz", "/", "/decisions", "/static/vendor/uPlot.min.css"):
            assert client.get(path).status_code == 200, path
        metrics = client.get("/metrics", headers=bearer(READ)).text
        assert 'shadow_auth_denied_total{status="401"}' in metrics


def test_tokens_never_reach_the_logs(server):
    """Runs last of the module's server tests: it stops the server to read its output."""
    running = server
    with httpx.Client(base_url=running.url, timeout=30) as client:
        client.post("/v1/events", content="not json", headers=bearer(INGEST))
        client.get(f"/v1/fleets?token={WRONG[:4]}", headers=bearer(WRONG))
    running.stop()
    output = running.process.stdout.read().decode(errors="replace")
    for token in (INGEST, OPERATOR, READ, WRONG):
        assert token not in output


def test_without_read_tokens_reads_are_open_and_writes_still_closed(tmp_path):
    running = Server(tmp_path / "db.duckdb", _config(tmp_path / "s.toml", with_read=False))
    running.start()
    try:
        with httpx.Client(base_url=running.url, timeout=30) as client:
            assert client.get("/v1/fleets").status_code == 200
            assert client.post("/v1/flush").status_code == 401
            assert client.post("/v1/flush", headers=bearer(OPERATOR)).status_code == 403
            assert client.post("/v1/flush", headers=bearer(INGEST)).status_code == 200
    finally:
        running.stop()


def test_non_loopback_needs_tokens_and_tokens_come_from_env(monkeypatch):
    with pytest.raises(ValueError, match=r"refusing to listen on 0\.0\.0\.0 without tokens"):
        load_settings(None, host="0.0.0.0")
    monkeypatch.setenv("SHADOW_TOKENS_INGEST", f"{INGEST},{INGEST}x")
    monkeypatch.setenv("SHADOW_TOKENS_OPERATOR", OPERATOR)
    settings = load_settings(None, host="0.0.0.0")
    assert [(t.name, t.roles) for t in settings.tokens] == [
        ("env-ingest-1", ["ingest"]), ("env-ingest-2", ["ingest"]),
        ("env-operator-1", ["operator"]),
    ]  # fmt: skip
    assert INGEST not in repr(settings)
    monkeypatch.setenv("SHADOW_TOKENS_READ", "short")
    with pytest.raises(ValueError, match="at least 16 characters") as error:
        load_settings(None)
    assert "short" not in str(error.value)


def test_roles_and_check_rules():
    table = TokenTable([("a", INGEST, ["ingest"]), ("b", OPERATOR, ["operator"])])
    assert required_role("POST", "/v1/events") == "ingest"
    assert required_role("POST", "/v1/anything-new") == "operator"
    assert required_role("POST", "/v1/fleets/default/gate") == "operator"
    # Flagger's webhook is a dry run Flagger posts without a header: read, not operator
    assert required_role("POST", "/v1/fleets/default/gate/flagger") == "read"
    assert required_role("POST", "/v1/fleets/a/b/gate/flagger") == "operator"
    assert required_role("GET", "/static/app.js") is None
    assert check(table, "GET", "/v1/fleets", None) is None  # no read token configured
    assert check(table, "POST", "/v1/events", f"Bearer {INGEST}") is None
    assert check(table, "POST", "/v1/events", f"bearer  {INGEST} ") is None
    assert check(table, "POST", "/v1/events", INGEST).status == 401  # no scheme
    denied = check(table, "POST", "/v1/fleets/x/mode", f"Bearer {INGEST}")
    assert denied.status == 403 and "'a'" in denied.message and INGEST not in denied.message
    assert check(table, "GET", "/v1/fleets", f"Bearer {OPERATOR}") is None
