"""`shadow mode`: show or change a fleet's mode, on a running service or its database."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shadow.cli.client import ServiceClient, ServiceError, TokenFileOption
from shadow.cli.shared import DEFAULT_DB, DbOption, UrlOption, command_group, console, fail

mode_app = command_group(
    "A fleet's mode: shadow, live, fallback, latched. Every change needs --reason."
)


def _remote(url: str, token_file: Path | None, method: str, path: str, body: object = None):
    """The service's JSON answer, or the error exit with its sentence."""
    try:
        client = ServiceClient.connect(url, token_file)
        return client.request(method, path, json=body).json()
    except ServiceError as error:
        raise fail(error.message, code=error.exit_code) from None


def _mode_action(
    action: str, fleet: str, reason: str, db: Path, url: str | None,
    token_file: Path | None = None, **extra: object,
) -> None:  # fmt: skip
    if not reason.strip():
        raise typer.BadParameter("a reason is required", param_hint="--reason")
    if url is not None:
        body = {"action": action, "reason": reason, "actor": "cli", **{
            k: v for k, v in extra.items() if v is not None}}  # fmt: skip
        console.print_json(data=_remote(url, token_file, "POST", f"/v1/fleets/{fleet}/mode", body))
        return
    from shadow.modes import ModeError, ModeStore, freeze, reset, resume, set_mode
    from shadow.storage import open_database

    with open_database(db) as database:
        store = ModeStore(database.engine)
        functions = {"set": set_mode, "freeze": freeze, "resume": resume, "reset": reset}
        args: list[object] = [reason]
        kwargs: dict[str, object] = {}
        if action == "set":
            from shadow.gate.record import last_verdict

            policy = extra.get("policy") or store.get(fleet).policy
            args = [extra["mode"], reason, extra.get("policy")]
            kwargs["last_gate_verdict"] = last_verdict(database.engine, fleet, policy)
        try:
            store.apply(fleet, functions[action], *args, actor="cli", **kwargs)
        except ModeError as error:
            raise fail(str(error)) from None
        state = store.get(fleet)
        console.print(f"{fleet}: {state.mode.value} (policy {state.policy}, frozen {state.frozen})")


@mode_app.command("show")
def mode_show(
    fleet: Annotated[str, typer.Option()] = "default", db: DbOption = DEFAULT_DB,
    url: UrlOption = None, token_file: TokenFileOption = None,
) -> None:  # fmt: skip
    """Print a fleet's mode."""
    if url is not None:
        console.print_json(data=_remote(url, token_file, "GET", f"/v1/fleets/{fleet}/mode"))
        return
    from shadow.modes import ModeStore
    from shadow.storage import open_database

    with open_database(db) as database:
        state = ModeStore(database.engine).get(fleet)
    console.print(
        f"{fleet}: {state.mode.value}, policy {state.policy}, trips {len(state.trips)}, "
        f"healthy windows {state.healthy_windows}, frozen {state.frozen}, "
        f"last gate verdict {state.last_gate_verdict}"
    )


@mode_app.command("set")
def mode_set(
    mode: Annotated[str, typer.Argument(help="shadow, live, fallback or latched.")],
    reason: Annotated[str, typer.Option(help="Why (required, audited).")],
    fleet: Annotated[str, typer.Option()] = "default",
    policy: Annotated[str | None, typer.Option(help="The policy to promote (live).")] = None,
    db: DbOption = DEFAULT_DB,
    url: UrlOption = None,
    token_file: TokenFileOption = None,
) -> None:
    """Promote, demote or force a mode (promoting after a FAIL verdict is refused)."""
    _mode_action("set", fleet, reason, db, url, token_file, mode=mode, policy=policy)


def _operator_command(action: str, summary: str) -> None:
    """Register `shadow mode ACTION`: the same options for freeze, resume and reset."""

    def command(
        reason: Annotated[str, typer.Option(help="Why (required, audited).")],
        fleet: Annotated[str, typer.Option()] = "default",
        db: DbOption = DEFAULT_DB,
        url: UrlOption = None,
        token_file: TokenFileOption = None,
    ) -> None:
        _mode_action(action, fleet, reason, db, url, token_file)

    command.__doc__ = summary
    mode_app.command(action)(command)


_operator_command("freeze", "Stop automatic mode changes.")
_operator_command("resume", "Allow automatic mode changes again.")
_operator_command("reset", "Back to shadow from fallback or latched, trips cleared.")
