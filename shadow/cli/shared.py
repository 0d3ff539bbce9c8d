"""What the command modules share: the consoles, the error exit, the default database, the
policy list, and the options several commands take with the same meaning."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from shadow.policies import POLICY_NAMES

console = Console()
#: errors and notes are never wrapped by Rich: a terminal wraps long lines itself, and a CI
#: log or a pipe (drawn at 80 columns) must get each sentence whole
err_console = Console(stderr=True, soft_wrap=True)

DEFAULT_DB = Path("shadow.duckdb")
#: the default of every `--policies`: each policy the registry knows, in its order
ALL_POLICIES = ",".join(POLICY_NAMES)

UrlOption = Annotated[
    str | None, typer.Option(help="A running service (e.g. http://127.0.0.1:8321) instead of --db.")
]
DbOption = Annotated[Path, typer.Option(help="DuckDB file (when the service is stopped).")]
#: where the benchmarks (`bench ingest`, `bench load`, `bench fleet`, ...) keep their files
BenchWorkdir = Annotated[
    Path | None,
    typer.Option(
        help="Keep the recording and databases here (default: a temporary folder, "
        "removed afterwards)."
    ),
]


def sized_table(
    title: str | None,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    left: int = 1,
    width: int | None = None,
    **options: object,
) -> Table:
    """A table whose columns are sized by their cells (markup aside), so no number is cut.

    Past the console's width (80 in a CI log, which has no terminal) Rich shrinks all
    columns alike and cuts numbers to '0.1…'. Here each column is as wide as its longest
    cell and header; when that is too wide for the console, the headers wrap at their
    spaces, and then the cells too (a number has none, so it stays whole). Too many
    columns still do not fit: keep a table's longest words within ~50 characters.
    The first `left` columns are names, justified left; `width`: the console's."""

    def widths(text: str) -> tuple[int, int]:
        """(the text's width, its longest word's): parsed once, markup aside."""
        plain = Text.from_markup(text).plain
        return len(plain), max(map(len, plain.split()), default=0)

    heads = [widths(header) for header in headers]
    cells = [[widths(row[i]) for row in rows] for i in range(len(headers))]
    whole = [max((w for w, _ in column), default=0) for column in cells]
    word = [max((w for _, w in column), default=0) for column in cells]
    candidates = (  # the first that fits: all whole, the headers wrapped, everything wrapped
        [max(h, c) for (h, _), c in zip(heads, whole, strict=True)],
        [max(h, c) for (_, h), c in zip(heads, whole, strict=True)],
        [max(h, c) for (_, h), c in zip(heads, word, strict=True)],
    )
    room = console.width if width is None else width
    chosen = next((w for w in candidates if sum(w) + 3 * len(w) + 1 <= room), candidates[-1])
    table = Table(title=title, **options)  # type: ignore[arg-type]
    for i, (header, column_width) in enumerate(zip(headers, chosen, strict=True)):
        table.add_column(header, justify="left" if i < left else "right", width=column_width)
    for row in rows:
        table.add_row(*row)
    return table


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print an error the way every command does and return the exit to raise. Never
    wrapped: a terminal wraps long lines itself, and a CI log or a pipe must get the
    sentence whole (Rich would cut it at 80 columns there). The message is text, not markup:
    `pip install -e '.[vllm]'` must not lose its brackets."""
    err_console.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


class ParagraphSummaries(TyperGroup):
    """A group whose command list shows each command's first paragraph as one paragraph.
    Typer's Rich mode keeps a docstring's line breaks there, so a summary wrapped in the
    source broke mid-sentence in an 80-column terminal."""

    def get_command(self, ctx, cmd_name):  # type: ignore[no-untyped-def]
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.short_help is None and command.help:
            first = inspect.cleandoc(command.help).split("\n\n")[0]
            if not first.startswith("\b"):  # Click's mark for a paragraph kept as written
                command.short_help = " ".join(first.split())
        return command


def command_group(help: str) -> typer.Typer:
    """A `shadow` sub-command group (`bench`, `db`, `mode`, ...), made one way: each
    command listed with its summary as one paragraph (`ParagraphSummaries`), and its help
    printed when it is called without a command."""
    return typer.Typer(cls=ParagraphSummaries, help=help, no_args_is_help=True)


class WholeErrorsGroup(ParagraphSummaries):
    """The `shadow` group: off a terminal, a usage error is Click's plain lines, not
    Typer's Rich panel, which is drawn at 80 columns there and cuts the sentence (and any
    path in it) across lines. On a terminal, the panel as before."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             windows_expand_args=True, **extra):  # fmt: skip
        import sys

        if not standalone_mode or sys.stderr.isatty():
            return super().main(args, prog_name, complete_var, standalone_mode,
                                windows_expand_args, **extra)  # fmt: skip
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args,
                                **extra)  # fmt: skip
        except typer.Abort:
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        except typer.TyperException as error:  # Click's usage errors (Typer vendors Click)
            if not hasattr(error, "show"):
                raise
            error.show()
            sys.exit(getattr(error, "exit_code", 1))
        sys.exit(code if isinstance(code, int) else 0)


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
