"""What several subcommands share: finding the run they act on, and their errors."""

from __future__ import annotations

from pathlib import Path

import click

from dlprof.config import RUNS_DIR
from dlprof.store.manifest import MANIFEST_NAME
from dlprof.store.reader import Run, RunError, load


class UsageError(Exception):
    """Bad input from the user; main() prints it as one line and exits non-zero."""


def newest_run(parent: Path = RUNS_DIR) -> Path:
    """The most recently started run under ``parent``."""
    runs = [p for p in parent.glob("*") if (p / MANIFEST_NAME).is_file()] if parent.is_dir() else []
    if not runs:
        raise RunError(
            f"no runs under ./{parent}; profile a program first: dlprof run script.py"
        )
    return max(runs, key=lambda p: ((p / MANIFEST_NAME).stat().st_mtime, p.name))


def open_run(path: str | None) -> Run:
    """The run at ``path``, or the newest one under ./dlprof-runs when no path is given."""
    return load(Path(path) if path else newest_run())


run_argument = click.argument("run", required=False, metavar="[RUN]")
