"""The ``dlprof`` command line: ``main(argv) -> int``, usable in-process and as a program."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click

import dlprof.cli
from dlprof import __version__
from dlprof.cli.common import UsageError
from dlprof.store.reader import RunError

# Modules of dlprof.cli that are not subcommands; every other one defines `command`.
_NOT_SUBCOMMANDS = frozenset({"main", "common"})
SUBCOMMANDS = tuple(
    sorted(m.name for m in pkgutil.iter_modules(dlprof.cli.__path__) if m.name not in _NOT_SUBCOMMANDS)
)


@click.group(
    help="dlprof: profile deep-learning programs; see where the time and memory go.\n\n"
    "Start with `dlprof run train.py`, then `dlprof top`.",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="dlprof")
def cli() -> None:
    pass


for _name in SUBCOMMANDS:
    cli.add_command(importlib.import_module(f"dlprof.cli.{_name}").command)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status instead of exiting."""
    try:
        result = cli.main(args=argv, prog_name="dlprof", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.ClickException as error:
        error.show()
        return error.exit_code
    except click.exceptions.Abort:
        print("dlprof: aborted", file=sys.stderr)
        return 130
    except (UsageError, RunError) as error:
        print(f"dlprof: error: {error}", file=sys.stderr)
        return 2
    return result if isinstance(result, int) else 0


def entry() -> None:
    sys.exit(main())
