"""``--wide``, the option every command that prints tables shares.

    @click.command("top")
    @wide_option
    def command(...): ...

Tables fit the terminal by default: ``$COLUMNS`` when set (piped too), else the terminal's
width, else 80 (:mod:`dlprof.viewers.screen`). ``--wide`` shows every column and whole names.
"""

from __future__ import annotations

import click

from dlprof.viewers.screen import PIPED_WIDTH, set_wide


def _set_wide(_context: click.Context, _parameter: click.Parameter, value: bool) -> None:
    # Set on every call, so one command run in-process after another never inherits --wide.
    set_wide(value)


wide_option = click.option(
    "--wide", is_flag=True, expose_value=False, callback=_set_wide, is_eager=True,
    help=f"Show every column and whole names, however wide. Default: fit $COLUMNS, else the "
         f"terminal's width, else {PIPED_WIDTH} (piped or written to a file); lesser columns go first.")
