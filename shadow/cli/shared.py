"""What the command modules share: the consoles, the error exit, the default database, the
policy list, and the options several commands take with the same meaning."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from shadow.policies import POLICY_NAMES

console = Console()
err_console = Console(stderr=True)

DEFAULT_DB = Path("shadow.duckdb")
#: the default of every `--policies`: each policy the registry knows, in its order
ALL_POLICIES = ",".join(POLICY_NAMES)

UrlOption = Annotated[
    str | None, typer.Option(help="A running service (e.g. http://127.0.0.1:8321) instead of --db.")
]
DbOption = Annotated[Path, typer.Option(help="DuckDB file (when the service is stopped).")]


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error the way every command does and return the exit to raise. Never
    wrapped: a terminal wraps long lines itself, and a CI log or a pipe must get the
    sentence whole (Rich would cut it at 80 columns there). The message is text, not markup:
    `pip install -e '.[vllm]'` must not lose its brackets."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


def _split(names: str) -> list[str]:
    return [name.strip() for name in names.split(",") if name.strip()]


def policy_names(policies: str) -> list[str]:
    """The names of a `--policies` value, each one the registry knows (else a usage error
    that lists the known ones)."""
    names = _split(policies)
    unknown = [name for name in names if name not in POLICY_NAMES]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown policy {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(POLICY_NAMES)}",
            param_hint="--policies",
        )
    return names
