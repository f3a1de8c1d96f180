"""Whether a run's tables can be read as the store's: partition names and Parquet schemas.

A run directory is files anyone can copy, edit or truncate. Before its tables are queried, each
partition's name and each Parquet file's footer (its schema, not its data) are checked, so that
a damaged file fails in one line naming it instead of a query failing deep inside an engine, or
worse, answering with empty or wrong figures::

    problem = table_problem(run_dir, StoreTable.SLICES)
    # "slices/rank=0/part-00000.parquet: column 'start_ns' is string, not an integer"

Columns a file lacks are allowed (a run written before a column existed reads with it null),
except those every version of the store wrote (:data:`REQUIRED_COLUMNS`).

Nothing in a run may lead outside it (:func:`outside_problem`): dlprof makes no links, so a link
to a place elsewhere (``slices`` pointing at another run, a part at ``/etc/shadow``) is damage,
refused before a table is read or a save made final, so that a run copied or crafted reads and
writes only itself.

:func:`framing_problem` is the check that needs no library at all (``dlprof ls`` loads none): a Parquet
file starts and ends with ``PAR1`` and states its footer's length before the last, so a file
truncated, emptied or overwritten shows without parsing anything. The footers are read with
DuckDB, which a reading command loads anyway, so checking a run loads no Arrow.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path

from dlprof.engine.sources import STORE_COLUMNS
from dlprof.keys import StoreTable
from dlprof.store.layout import CHUNK_GLOB, PART_GLOB
from dlprof.store.safe_files import not_a_file

RANK_PREFIX = "rank="
# Each file's columns as its footer states them: name -> (type as Arrow names it, kind of values).
Footers = Mapping[Path, Mapping[str, tuple[str, str]]]
_MAGIC = b"PAR1"
# The leading magic, and at the end the footer's length (4 bytes, little-endian) and the magic.
_FRAMING_BYTES = 3 * len(_MAGIC)

# The columns without which a table means nothing; every version of the store wrote them.
REQUIRED_COLUMNS: dict[StoreTable, tuple[str, ...]] = {
    StoreTable.SLICES: ("id", "pid", "tid", "kind", "name", "start_ns", "dur_ns"),
    StoreTable.COUNTERS: ("pid", "track", "ts_ns", "value"),
    StoreTable.METRICS: ("slice_id", "metric", "value"),
    StoreTable.MEMORY: ("pid", "ts_ns", "bytes"),
    StoreTable.SERIES: ("ts_ns", "metric", "value"),
}


def partition_problem(run_dir: Path, table: StoreTable) -> str | None:
    """A table's partition directory whose name is not ``rank=<integer>``, in words.

    Args:
        run_dir: the run directory.
        table: which table.

    Returns:
        One line naming the first such directory, or None when every one is well named.
    """
    table_dir = run_dir / str(table)
    if not table_dir.is_dir():
        return None
    for entry in sorted(table_dir.iterdir()):
        if entry.name.startswith(RANK_PREFIX) and entry.is_dir() and rank_of(entry.name) is None:
            return f"{table}/{entry.name}: a partition's name must be rank=<integer>"
    return None


def rank_of(name: str) -> int | None:
    """The rank a partition directory's name gives (``rank=3``: 3), or None if it gives none."""
    key, _, value = name.partition("=")
    return int(value) if key == "rank" and value.isascii() and value.isdigit() else None


def framing_problem(path: Path) -> str | None:
    """Whether ``path`` is shaped as a Parquet file, read from its first and last bytes only.

    Args:
        path: a file.

    Returns:
        What is wrong in words (truncated, not Parquet), or None when the framing is sound.
    """
    what = not_a_file(path)
    if what == "no such file":
        return None  # a chunk made final and removed since the partition was listed
    if what is not None:  # a FIFO would wait for a writer forever
        return f"{what}, not a Parquet file"
    try:
        with path.open("rb") as file:
            head = file.read(len(_MAGIC))
            size = file.seek(0, 2)
            if size < _FRAMING_BYTES:
                return f"damaged Parquet file (only {size} bytes)"
            file.seek(size - 2 * len(_MAGIC))
            tail = file.read(2 * len(_MAGIC))
    except FileNotFoundError:
        return None  # a chunk made final and removed since the partition was listed
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    if head != _MAGIC or tail[4:] != _MAGIC:
        return "damaged Parquet file (no PAR1 marker: truncated, or not Parquet)"
    (footer,) = struct.unpack("<I", tail[:4])
    if footer > size - _FRAMING_BYTES:
        return f"damaged Parquet file (a footer of {footer} bytes in a file of {size})"
    return None


def outside_problem(run_dir: Path) -> str | None:
    """The first entry of a run that is a link leading outside the run, in words.

    Args:
        run_dir: the run directory (itself reached through a link or not).

    Returns:
        One line naming the entry (relative to the run directory), or None when every link in
        the run (dlprof makes none) stays inside it.
    """
    try:
        root = run_dir.resolve()
    except (OSError, RuntimeError) as error:
        return f"cannot be resolved ({error})"
    for directory, subdirectories, files in os.walk(run_dir, onerror=None):
        for name in [*subdirectories, *files]:
            entry = Path(directory) / name
            if not entry.is_symlink():
                continue  # os.walk does not enter links, so what it walks is inside
            try:
                inside = entry.resolve().is_relative_to(root)
            except (OSError, RuntimeError):  # a loop of links
                inside = False
            if not inside:
                return f"{entry.relative_to(run_dir)}: a link to a place outside the run"
    return None


def files_problem(run_dir: Path) -> str | None:
    """The first badly named partition or badly framed file of a run, or a link out of it,
    without Arrow.

    Args:
        run_dir: the run directory.

    Returns:
        One line naming the partition or file (relative to the run directory), or None.
    """
    outside = outside_problem(run_dir)
    if outside is not None:
        return outside
    for table in StoreTable:
        problem = partition_problem(run_dir, table)
        if problem is not None:
            return problem
        for path in _files(run_dir, table):
            problem = framing_problem(path)
            if problem is not None:
                return f"{path.relative_to(run_dir)}: {problem}"
    return None


def table_problem(run_dir: Path, table: StoreTable, footers: Footers | None = None) -> str | None:
    """What makes a table unreadable as the store's, in one line; None when nothing does.

    Checks partition names and, for every part and loose chunk, that its footer reads, that it
    holds the required columns and that each column of the store's schema it holds has the
    schema's kind of type (integer, floating point, string). No row is read.

    Args:
        run_dir: the run directory.
        table: which table.
        footers: the files' columns read already (see :func:`run_problem`); others are read here.

    Returns:
        The first problem found, naming the file relative to the run directory, or None.
    """
    problem = partition_problem(run_dir, table)
    if problem is not None:
        return problem
    expected = {name: _sql_family(kind) for name, kind in STORE_COLUMNS[table]}
    for path in _files(run_dir, table):
        where = path.relative_to(run_dir)
        # A footer read already was read after its framing was checked (run_problem).
        known = footers.get(path) if footers is not None else None
        framing = None if known is not None else framing_problem(path)
        if framing is not None:
            return f"{where}: {framing}"
        try:
            columns = known if known is not None else _footer_columns(path)
        except FileNotFoundError:
            continue  # a chunk made final and removed since the partition was listed
        except ValueError as error:
            return f"{where}: damaged Parquet file ({error})"
        missing = [name for name in REQUIRED_COLUMNS[table] if name not in columns]
        if missing:
            return f"{where}: no column {', '.join(repr(name) for name in missing)}"
        for name, (type_name, have) in columns.items():
            if name in expected and have != expected[name]:
                return f"{where}: column '{name}' is {type_name}, not {expected[name]}"
    return None


def run_problem(run_dir: Path) -> str | None:
    """The first link out of a run (:func:`outside_problem`) or problem of any of its tables
    (see :func:`table_problem`), or None.

    Every file's footer is read in one query; only if one of them does not read are they read
    again one by one, to name it.
    """
    outside = outside_problem(run_dir)
    if outside is not None:
        return outside
    # Only files framed as Parquet go to DuckDB (a FIFO among them would keep it waiting); the
    # others are named by table_problem.
    footers = _all_footers([path for table in StoreTable for path in _files(run_dir, table)
                            if framing_problem(path) is None and path.is_file()])
    for table in StoreTable:
        problem = table_problem(run_dir, table, footers)
        if problem is not None:
            return problem
    return None


def _files(run_dir: Path, table: StoreTable) -> Iterator[Path]:
    table_dir = run_dir / str(table)
    if not table_dir.is_dir():
        return
    for directory in sorted(table_dir.iterdir()):
        if directory.is_dir() and rank_of(directory.name) is not None:
            # Every file, chunks a part replaced included: telling which those are reads the
            # parts' footers, which is what is being checked.
            yield from sorted(directory.glob(PART_GLOB))
            yield from sorted(directory.glob(CHUNK_GLOB))


# Parquet's physical and converted types as Arrow names them (what a user who wrote the file
# with pandas or pyarrow knows), and the kind of values each holds.
_INTEGER, _FLOAT, _STRING = "an integer", "a floating-point number", "a string"
_PHYSICAL = {"INT64": ("int64", _INTEGER), "INT32": ("int32", _INTEGER), "FLOAT": ("float", _FLOAT),
             "DOUBLE": ("double", _FLOAT), "BOOLEAN": ("bool", "bool"), "INT96": ("timestamp", "timestamp"),
             "BYTE_ARRAY": ("binary", "binary"), "FIXED_LEN_BYTE_ARRAY": ("fixed_size_binary", "binary")}
_CONVERTED = {"UTF8": ("string", _STRING), "INT_8": ("int8", _INTEGER), "INT_16": ("int16", _INTEGER),
              "UINT_8": ("uint8", _INTEGER), "UINT_16": ("uint16", _INTEGER), "UINT_32": ("uint32", _INTEGER),
              "UINT_64": ("uint64", _INTEGER), "DATE": ("date32", "date"), "DECIMAL": ("decimal", "decimal")}


def _footer_columns(path: Path) -> dict[str, tuple[str, str]]:
    """Each column of a Parquet file's footer: its type as Arrow names it, and its kind of values.

    Read by DuckDB (its default connection), which every reading command loads anyway, so
    checking a run needs no Arrow.

    Raises:
        FileNotFoundError: the file is gone.
        ValueError: the footer does not read (the reader's words).
    """
    import duckdb

    try:
        rows = duckdb.execute(
            "SELECT name, type, converted_type FROM parquet_schema(?) WHERE num_children IS NULL",
            [str(path)]).fetchall()
    except duckdb.Error as error:
        if not path.exists():
            raise FileNotFoundError(path) from None
        raise ValueError(str(error).splitlines()[0].removeprefix("Invalid Input Error: ")) from None
    return {str(name): _type_of(physical, converted) for name, physical, converted in rows}


def _all_footers(paths: list[Path]) -> Footers | None:
    """The columns of every file's footer, in one query; None if any of them does not read."""
    import duckdb

    if not paths:
        return {}
    try:
        rows = duckdb.execute(
            "SELECT file_name, name, type, converted_type FROM parquet_schema(?) WHERE num_children IS NULL",
            [[str(path) for path in paths]]).fetchall()
    except duckdb.Error:
        return None
    footers: dict[Path, dict[str, tuple[str, str]]] = {path: {} for path in paths}
    by_name = {str(path): path for path in paths}
    for file_name, name, physical, converted in rows:
        footers[by_name[file_name]][str(name)] = _type_of(physical, converted)
    return footers


def _type_of(physical: str | None, converted: str | None) -> tuple[str, str]:
    """A column's type as Arrow names it and its kind of values, from its Parquet types."""
    return _CONVERTED.get(str(converted)) or _PHYSICAL.get(str(physical)) or (str(physical).lower(), "other")


def _sql_family(sql_type: str) -> str:
    """The kind of values a column of the store holds, from its SQL type."""
    if sql_type in ("BIGINT", "INT", "SMALLINT"):
        return _INTEGER
    return _FLOAT if sql_type in ("FLOAT", "DOUBLE") else _STRING
