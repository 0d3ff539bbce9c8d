"""`shadow audit`: verify the audit log's hash chain."""

from __future__ import annotations

from shadow.cli.client import ServiceClient, ServiceError, TokenFileOption
from shadow.cli.shared import DEFAULT_DB, DbOption, UrlOption, command_group, console, fail

audit_app = command_group("The tamper-evident audit log.")


@audit_app.command("verify")
def audit_verify(
    db: DbOption = DEFAULT_DB, url: UrlOption = None, token_file: TokenFileOption = None
) -> None:
    """Recompute the audit log's hash chain; exit 1 at the first row that does not match."""
    if url is not None:
        try:
            result = ServiceClient.connect(url, token_file).get_json("/v1/audit/verify")
        except ServiceError as error:
            raise fail(error.message, code=error.exit_code) from None
        ok, rows, bad, problem = (
            result["ok"],
            result["rows"],
            result["first_bad_seq"],
            result["problem"],
        )
    else:
        if not db.exists():
            raise fail(f"{db}: no such database", code=2)
        from shadow.modes import auditlog
        from shadow.storage import open_database

        with open_database(db) as database:
            verdict = auditlog.verify(database.engine)
        ok, rows, bad, problem = verdict.ok, verdict.rows, verdict.first_bad_seq, verdict.problem
    if ok:
        console.print(f"audit log intact: {rows} rows, hash chain verified")
        return
    raise fail(f"audit log broken at row {bad}: {problem}")
