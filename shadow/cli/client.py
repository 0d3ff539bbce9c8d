"""The CLI's client of a running service (`--url`): one place that attaches the bearer
token, and turns what can go wrong into a sentence and an exit code. `shadow gate`,
`shadow mode` and `shadow audit` all reach the service through it.

The token comes from `--token-file` or, without one, the `SHADOW_TOKEN` environment
variable (a CI secret); it is never printed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

TOKEN_ENV = "SHADOW_TOKEN"
#: a refused token or request is a usage error (the pipeline is misconfigured)
USAGE_EXIT = 2
#: a service that cannot be reached, or fails inside, is GATE.md's ERROR
UNREACHABLE_EXIT = 5

TokenFileOption = Annotated[
    Path | None,
    typer.Option(
        help=f"File holding the bearer token for --url (default: ${TOKEN_ENV}).",
        show_default=False,
    ),
]


class ServiceError(Exception):
    """The service could not give an answer: why, as a sentence; the HTTP status (None:
    no answer at all)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @property
    def exit_code(self) -> int:
        """5 unreachable or a server error, 2 refused (401/403) or invalid (422), else 1
        (the service said no: e.g. a mode change refused after a FAIL)."""
        if self.status is None or self.status >= 500:
            return UNREACHABLE_EXIT
        if self.status in (401, 403, 422):
            return USAGE_EXIT
        return 1


def read_token(token_file: Path | None) -> str | None:
    """The token of `--token-file` (whitespace around it ignored), else `$SHADOW_TOKEN`,
    else None. A file that cannot be read or is empty is an error naming the option."""
    if token_file is None:
        return os.environ.get(TOKEN_ENV, "").strip() or None
    try:
        token = token_file.read_text().strip()
    except OSError as error:
        raise ServiceError(
            f"--token-file: cannot read {token_file}: {error.strerror}", 422
        ) from None
    if not token:
        raise ServiceError(f"--token-file: {token_file} is empty", 422)
    return token


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(detail, list):  # FastAPI's validation errors: "field: problem"
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', [])[1:])}: {item.get('msg')}"
            for item in detail
        )
    return str(detail)


@dataclass(frozen=True)
class ServiceClient:
    """A running `shadow serve` at `url`, with the token to present (None: none)."""

    url: str
    token: str | None = None
    timeout: float = 120.0

    @classmethod
    def connect(cls, url: str, token_file: Path | None) -> ServiceClient:
        return cls(url.rstrip("/"), read_token(token_file))

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        ok: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        """The response, if its status is in `ok`; else a ServiceError with the service's
        sentence (a 401/403 names the role needed)."""
        headers = {"authorization": f"Bearer {self.token}"} if self.token else {}
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            response = httpx.request(
                method, f"{self.url}{path}", params=params, json=json, headers=headers,
                timeout=self.timeout,
            )  # fmt: skip
        except httpx.HTTPError as error:
            raise ServiceError(
                f"service unreachable: {method} {self.url}{path}: {error or type(error).__name__}"
            ) from None
        if response.status_code in ok:
            return response
        detail = _detail(response)
        if response.status_code in (401, 403):
            hint = "" if self.token else f" (no token: pass --token-file or set ${TOKEN_ENV})"
            raise ServiceError(
                f"refused by {self.url} ({response.status_code}): {detail}{hint}",
                response.status_code,
            )
        raise ServiceError(f"{self.url} answered {response.status_code}: {detail}",
                           response.status_code)  # fmt: skip

    def get_json(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params).json()

    def post_json(self, path: str, body: Any) -> Any:
        return self.request("POST", path, json=body).json()
