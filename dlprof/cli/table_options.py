"""The options every command that prints tables shares: ``--wide``, ``-f/--format``,
``-n/--limit`` and ``--kind``, each spelt and defaulted the same way everywhere.

    @click.command("top")
    @kind_option(default=("op",), help_text="Kinds of slice, a table each.")
    @limit_option("Rows to show")
    @format_option()
    @wide_option
    def command(kinds: tuple[str, ...], limit: int, fmt: str) -> int: ...

Tables fit the terminal by default: ``$COLUMNS`` when set (piped too), else the terminal's
width, else 80 (:mod:`dlprof.viewers.screen`). ``--wide`` shows every column and whole names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import click

from dlprof.cli.common import AliasedChoice, AliasedOption
from dlprof.keys import TableFormat
from dlprof.viewers.screen import PIPED_WIDTH, set_wide

# Rows (or names, groups, steps) a table command shows unless -n says otherwise.
DEFAULT_LIMIT = 15


def _set_wide(_context: click.Context, _parameter: click.Parameter, value: bool) -> None:
    # Set on every call, so one command run in-process after another never inherits --wide.
    set_wide(value)


wide_option = click.option(
    "--wide", is_flag=True, expose_value=False, callback=_set_wide, is_eager=True,
    help=f"Show every column and whole names, however wide. Default: fit $COLUMNS, else the "
         f"terminal's width, else {PIPED_WIDTH} (piped or written to a file); lesser columns go first.")


def format_option(formats: Sequence[TableFormat] = tuple(TableFormat),
                  help_text: str = "Tables for a person, or every column as CSV or JSON for a script.",
                  aliases: Mapping[str, TableFormat] | None = None) -> Callable[..., Any]:
    """``-f/--format``: ``table`` for a person, ``csv`` or ``json`` for a script.

    Args:
        formats: the formats this command can print, ``table`` first.
        help_text: what each format gives for this command.
        aliases: older names of a format that the command still takes (``text`` for ``table``).

    Returns:
        The click decorator; the value reaches the command as ``fmt``, a format's name.
    """
    choice = AliasedChoice([str(f) for f in formats], {old: str(new) for old, new in (aliases or {}).items()})
    return click.option("-f", "--format", "fmt", type=choice, default=str(TableFormat.TABLE),
                        show_default=True, help=help_text)


def limit_option(what: str, note: str = "", hidden_aliases: Sequence[str] = ()) -> Callable[..., Any]:
    """``-n/--limit N``, :data:`DEFAULT_LIMIT` by default, 0 for all.

    Args:
        what: what is counted, as the help's first words ("Rows to show", "Names per kind").
        note: a sentence more, where the limit does something of its own.
        hidden_aliases: older names the option still answers to (``run --top``).

    Returns:
        The click decorator; the value reaches the command as ``limit``.
    """
    return click.option("-n", "--limit", "limit", cls=AliasedOption, hidden_aliases=hidden_aliases,
                        type=click.IntRange(min=0), default=DEFAULT_LIMIT, show_default=True,
                        metavar="N", help=f"{what} (0: all).{' ' + note if note else ''}")


def kind_option(help_text: str, default: Sequence[str] = ()) -> Callable[..., Any]:
    """``--kind KIND``, repeatable: slices of any of these kinds (op, module, kernel, ...).

    Args:
        help_text: what several kinds give for this command, and the default in words when
            ``default`` is empty.
        default: the kinds taken without the option.

    Returns:
        The click decorator; the value reaches the command as ``kinds``, a tuple.
    """
    return click.option("--kind", "kinds", multiple=True, default=tuple(default), metavar="KIND",
                        show_default=bool(default), help=help_text)
