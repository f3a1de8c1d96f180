"""The runs under a directory, one row each: what ``dlprof ls`` lists.

This is I/O over run directories (manifests, Parquet footers, file sizes), not analysis of one
run, so it lives beside the reader::

    list_runs(Path("dlprof-runs")).records()   # name, script, status, start_ns, duration_ns, ...

A directory whose ``run.json`` cannot be read is still listed, with status ``unreadable``, and
one whose partitions are badly named or whose Parquet files are truncated (their first and last
bytes tell) with status ``damaged``; ``problem`` says why, so that one damaged run never hides
the others and never shows as ``complete``. Only manifests are read (and, for a run that never
finished, its Parquet footers), so listing loads neither pandas nor a query engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dlprof.engine.rows import Rows
from dlprof.keys import StoreTable
from dlprof.store.integrity import files_problem, framing_problem
from dlprof.store.layout import rank_files
from dlprof.store.manifest import MANIFEST_NAME, Manifest, degraded_line
from dlprof.store.reader import Run, RunError, load

# The status shown for a directory holding a run.json that load() refuses.
UNREADABLE = "unreadable"
# The status shown for a run whose manifest reads but whose files do not (integrity.files_problem).
DAMAGED = "damaged"

COLUMNS = ("name", "script", "status", "start_ns", "duration_ns", "events", "size_bytes", "path",
           "problem")


def list_runs(parent: Path) -> Rows:
    """One row per run directory directly under ``parent``, newest first.

    Args:
        parent: the directory holding run directories (``./dlprof-runs`` by default in the CLI).

    Returns:
        Rows with :data:`COLUMNS`: ``status`` as the reader reports it (``killed`` for a run
        left ``running`` by a writer that is gone), or :data:`UNREADABLE` or :data:`DAMAGED`
        with ``problem`` saying why in one line ("" for a sound run; for a ``degraded`` one,
        why its recording is not whole); ``events`` the rows of every table (None when
        unknown); ``start_ns`` epoch nanoseconds (0 when the manifest has none). No rows (with
        the columns) when ``parent`` holds no runs or does not exist.
    """
    rows = [_row(directory) for directory in _run_dirs(parent)]
    # Runs without a start time (unreadable ones) sort by their manifest's age instead.
    rows.sort(key=lambda row: (row["start_ns"] or _mtime_ns(Path(row["path"]) / MANIFEST_NAME), row["name"]),
              reverse=True)
    return Rows(COLUMNS, [tuple(row[c] for c in COLUMNS) for row in rows])


def script_of(command: list[str]) -> str:
    """What a recorded command line ran: its first ``.py`` argument, or its ``-m`` module.

    ``python -m dlprof`` records dlprof's own ``__main__.py`` and ``-m dlprof``; both are passed
    over, as is the interpreter, so ``["python", "-m", "dlprof", "run", "-m", "app.train"]``
    gives ``app.train``.

    Args:
        command: the manifest's ``command``.

    Returns:
        The script as it was typed, the module name, or else the program's base name ("" for none).
    """
    args = list(command)
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "-m" and index + 1 < len(args):
            if args[index + 1] != "dlprof":
                return args[index + 1]
            index += 2
            continue
        if arg.endswith(".py") and not _is_dlprof_main(arg):
            return arg
        index += 1
    programs = [a for a in args if not _is_interpreter(a) and not a.startswith("-")]
    return Path(programs[0]).name if programs else ""


def run_size(path: Path) -> int:
    """Bytes on disk of every file under a run directory (links are not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue  # removed while we walked (a run being compacted)
    return total


def event_count(run: Run) -> int | None:
    """Rows in every table of a run: the manifest's counts, or else the Parquet footers.

    A run that never finished has no counts in its manifest; its chunk files' footers still say
    how many rows they hold, without reading any data.

    Args:
        run: a loaded run.

    Returns:
        The number of rows, or None when a file cannot be read.
    """
    if run.manifest.counts:
        return sum(run.manifest.counts.values())
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = 0
    for table in StoreTable:
        table_dir = run.path / str(table)
        if not table_dir.is_dir():
            continue
        for rank_dir in table_dir.glob("rank=*"):
            found = rank_files(rank_dir)
            files = found.parts + found.loose_chunks
            if any(framing_problem(f) is not None for f in files):
                return None  # not Parquet (a FIFO would wait for a writer for ever)
            try:
                total += sum(pq.read_metadata(f).num_rows for f in files)
            except (OSError, pa.ArrowInvalid):
                return None
    return total


def _run_dirs(parent: Path) -> list[Path]:
    if not parent.is_dir():
        return []
    return [p for p in parent.iterdir() if p.is_dir() and (p / MANIFEST_NAME).is_file()]


def _row(directory: Path) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": directory.name, "script": "", "status": UNREADABLE, "start_ns": 0,
        "duration_ns": 0, "events": None, "size_bytes": run_size(directory),
        "path": str(directory), "problem": "",
    }
    try:
        run = load(directory)
    except RunError as error:
        row["problem"] = without_run_path(str(error), directory)
        return row
    manifest: Manifest = run.manifest
    # The name stays the directory's: it is what a person passes as RUN, even for a copied run.
    row.update(
        script=script_of(manifest.command),
        status=str(run.status),
        start_ns=manifest.start_ns,
        duration_ns=manifest.duration_ns,
        events=event_count(run),
        problem=degraded_line(manifest.degraded),  # why the recording is not whole ("" when it is)
    )
    problem = files_problem(directory)
    if problem is not None:
        row.update(status=DAMAGED, problem=problem, events=None)
    return row


def without_run_path(message: str, directory: Path) -> str:
    """A load error's message without the run's path, for where the run is named already.

    Args:
        message: the error's message (``<run>/run.json: unreadable manifest (...)``).
        directory: the run directory.

    Returns:
        The message less its leading path.
    """
    for prefix in (f"{directory / MANIFEST_NAME}: ", f"{directory}: "):
        message = message.removeprefix(prefix)
    return message


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _is_dlprof_main(arg: str) -> bool:
    path = Path(arg)
    return path.name == "__main__.py" and path.parent.name == "dlprof"


def _is_interpreter(arg: str) -> bool:
    return Path(arg).name.startswith(("python", "pypy"))
