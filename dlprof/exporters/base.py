"""What every exporter is: the :class:`Exporter` face, its errors and progress ticker.

The slice walks several exporters share are in :mod:`dlprof.exporters.slice_walks`.

An exporter turns a loaded run into one or more files. Subclasses name their format, file
extension and whether the file is binary as class attributes (the registry builds its maps from
them) and implement :meth:`Exporter.write`; :meth:`Exporter.export` checks the run first::

    class CsvExporter(Exporter):
        format_name = "csv"
        file_extension = ".csv"
        binary = False
        description = "one row per slice"

        def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]: ...
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from rich.progress import Progress, TaskID

from dlprof.keys import StoreTable
from dlprof.store import scan
from dlprof.store.reader import Run
from dlprof.store.safe_files import atomic_binary

# Rows turned into Python objects at a time: large enough that per-batch costs vanish, small
# enough that a run of millions of slices never sits in memory as Python objects all at once.
BATCH_ROWS = 20_000



class ExportError(Exception):
    """A run cannot be exported; the message is one line a person can act on."""


class Ticker:
    """Advances one task of a rich progress bar, or does nothing when there is no bar."""

    def __init__(self, progress: Progress | None, description: str, total: int) -> None:
        self._progress = progress
        self._task: TaskID | None = (
            progress.add_task(description, total=total) if progress is not None else None
        )

    def advance(self, rows: int) -> None:
        """Count ``rows`` more rows as written."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task, rows)


class Exporter(ABC):
    """Writes a run in one file format."""

    format_name: ClassVar[str]  # the --format choice, e.g. "chrome"
    file_extension: ClassVar[str]  # with its dot, e.g. ".json"
    binary: ClassVar[bool]  # False for text formats
    description: ClassVar[str]  # one line for help texts

    def __init__(self, batch_rows: int = BATCH_ROWS) -> None:
        """Args:
        batch_rows: rows turned into events at a time; bounds the memory an export needs.
        """
        if batch_rows < 1:
            raise ValueError(f"batch_rows must be at least 1, not {batch_rows}")
        self.batch_rows = batch_rows

    def output_paths(self, run: Run, path: Path) -> list[Path]:
        """The files :meth:`export` writes for ``run`` when asked for ``path``.

        Args:
            run: the run to export.
            path: the file the caller asked for.

        Returns:
            By default ``[path]``; a format with one file per rank says which files instead.
        """
        return [path]

    def export(self, run: Run, path: Path, progress: Progress | None = None) -> list[Path]:
        """Write ``run`` in this format.

        Args:
            run: the loaded run.
            path: the file to write (its directory is created if missing).
            progress: a rich progress bar to add a task to, or None for none.

        Returns:
            The files written, as :meth:`output_paths` names them.

        Raises:
            ExportError: the run holds no slices.
            RunError: a file of the run is damaged (exporters read the files, not the engine).
        """
        run.check_tables()
        # Counted from the files' footers: no table is read for it.
        if scan.rows(run, StoreTable.SLICES) == 0:
            raise ExportError(f"{run.path}: the run holds no slices ({run.status}); nothing to export")
        rows = sum(scan.rows(run, t) for t in (StoreTable.SLICES, StoreTable.COUNTERS, StoreTable.MEMORY))
        ticker = Ticker(progress, f"{self.format_name}: {run.path.name}", rows)
        return self.write(run, Path(path), ticker)

    @abstractmethod
    def write(self, run: Run, path: Path, ticker: Ticker) -> list[Path]:
        """Write a run known to hold slices; advance ``ticker`` by every row written."""


# A binary file that appears at its path only once complete (an export that fails or is
# interrupted leaves no half file that looks like a trace), never written through a link.
# Several files of one export go through safe_files.atomic_files: all of them, or none.
atomic_output = atomic_binary
# The buffer of an export's output file.
OUTPUT_BUFFER = 1 << 20
