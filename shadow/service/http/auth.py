"""Bearer tokens with roles: who may send events, who may change a fleet's mode.

Roles: `ingest` (event sources and the router: POST /v1/events, /v1/flush, /v1/route),
`operator` (mode changes and recorded gate runs; may also read), `read` (GETs of the API,
the metrics and the docs, and Flagger's gate webhook, a dry run; required only once a read
token is configured). Tokens come from
the settings file (`[[tokens]]`) or the environment (`SHADOW_TOKENS_INGEST`,
`SHADOW_TOKENS_OPERATOR`, `SHADOW_TOKENS_READ`, comma-separated). A presented token is
compared with every configured one by `hmac.compare_digest` on SHA-256 digests, so
neither its content nor its length shows in the timing. Tokens are never logged and
never echoed in an error.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

Role = Literal["ingest", "operator", "read"]
ROLES: tuple[Role, ...] = ("ingest", "operator", "read")
#: roles that also grant another role's rights
IMPLIES: dict[str, frozenset[str]] = {"operator": frozenset({"read"})}
MIN_TOKEN_LENGTH = 16
OPEN_PATHS = ("/healthz",)
OPEN_PREFIXES = ("/static/",)
UI_PAGES = ("/", "/compare", "/decisions", "/integrity", "/gate", "/replays", "/sweeps")
_INGEST_WRITES = ("/v1/events", "/v1/flush", "/v1/route")
#: POSTs that only read: Flagger's gate webhook (a dry run; Flagger posts, sends no header)
_READ_POSTS = re.compile(r"^/v1/fleets/[^/]+/gate/flagger$")
_BEARER = re.compile(r"^\s*Bearer\s+(\S+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Denied:
    status: int  # 401: no or unknown token; 403: a valid token without the role
    message: str


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenTable:
    """The configured tokens as digests, each with its roles."""

    def __init__(self, entries: Iterable[tuple[str, str, Iterable[str]]]) -> None:
        self._entries: list[tuple[bytes, str, frozenset[str]]] = []
        for name, token, roles in entries:
            granted = set(roles)
            for role in list(granted):
                granted |= IMPLIES.get(role, frozenset())
            self._entries.append((_digest(token), name, frozenset(granted)))

    def __bool__(self) -> bool:
        return bool(self._entries)

    @property
    def read_required(self) -> bool:
        """Reads need a token only once a read-only token exists (the UI then asks)."""
        return any(roles == {"read"} for _, _, roles in self._entries)

    def identify(self, token: str) -> tuple[str, frozenset[str]] | None:
        """The name and roles of `token`; every entry is compared, match or not."""
        presented = _digest(token)
        found = None
        for digest, name, roles in self._entries:
            if hmac.compare_digest(presented, digest) and found is None:
                found = (name, roles)
        return found


def required_role(method: str, path: str) -> Role | None:
    """The role a request needs; None when it is open (health, the UI's static files)."""
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES) or path in UI_PAGES:
        return None
    if method in ("GET", "HEAD", "OPTIONS"):
        return "read"
    if path in _INGEST_WRITES:
        return "ingest"
    if _READ_POSTS.match(path):
        return "read"
    return "operator"  # every other write: mode changes, gate actions, and any added later


def check(table: TokenTable, method: str, path: str, authorization: str | None) -> Denied | None:
    """None when the request may proceed, else why not (never quoting the token)."""
    role = required_role(method, path)
    if role is None or not table or (role == "read" and not table.read_required):
        return None
    match = _BEARER.match(authorization or "")
    if match is None:
        return Denied(401, f"{method} {path} needs a bearer token with role '{role}'")
    found = table.identify(match.group(1))
    if found is None:
        return Denied(401, "the bearer token is not valid")
    name, roles = found
    if role not in roles:
        return Denied(403, f"token '{name}' lacks role '{role}' for {method} {path}")
    return None


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerAuth:
    """Checks every HTTP request's bearer token (`check`) before the app sees it, as plain
    ASGI (Starlette's `@app.middleware("http")` costs a task group a request); counts
    refusals by status in `denied`."""

    def __init__(self, app: ASGIApp, tokens: TokenTable, denied: Counter[int]) -> None:
        self.app = app
        self.tokens = tokens
        self.denied = denied

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refused = check(
            self.tokens, request.method, request.url.path, request.headers.get("authorization")
        )
        if refused is None:
            await self.app(scope, receive, send)
            return
        self.denied[refused.status] += 1
        headers = {"WWW-Authenticate": 'Bearer realm="shadow"'} if refused.status == 401 else {}
        response = JSONResponse({"detail": refused.message}, status_code=refused.status,
                                headers=headers)  # fmt: skip
        await response(scope, receive, send)
