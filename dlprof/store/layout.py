"""Where a rank's rows are: which files of a partition hold the run, for writers and readers.

A table's partition (``slices/rank=0/``) holds final parts, ``part-NNNNN.parquet``, one per
window (a save of the session, or an import), and, until they are made final, raw chunks,
``chunk-<source>-NNNNNN.parquet``::

    files = rank_files(run / "slices" / "rank=0")
    files.parts           # final: nested, attributed, sorted
    files.loose_chunks    # raw rows no part holds yet (a run killed, a worker that saved late)

A part's footer names the chunks it replaced (``dlprof.sources``); a chunk named there is not
loose even if it is still on disk (its process was killed between writing the part and removing
the chunk), so every row is counted once. Footers are read only when both kinds are present.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dlprof.keys import StoreTable

PART_GLOB = "part-*.parquet"
CHUNK_GLOB = "chunk-*.parquet"
# In a part's footer: the names of the chunk files the part replaced, comma-separated.
SOURCES_KEY = "dlprof.sources"
# Where the saves of a session wait, in its run directory, until they are made final.
PENDING = "pending"


def rank_dir(run_dir: Path, table: StoreTable, rank: int) -> Path:
    """The partition of one table and one rank."""
    return run_dir / str(table) / f"rank={rank}"


def part_name(number: int) -> str:
    """The file name of window ``number``'s part."""
    return f"part-{number:05d}.parquet"


@dataclass
class RankFiles:
    """The files of one partition, by what they hold."""

    parts: list[Path] = field(default_factory=list)
    loose_chunks: list[Path] = field(default_factory=list)
    replaced_chunks: list[Path] = field(default_factory=list)  # still on disk, held by a part


def rank_files(directory: Path) -> RankFiles:
    """The parts and chunks of one partition, in name order."""
    if not directory.is_dir():
        return RankFiles()
    # Chunks first: a writer writes a save's part before it removes the save's chunks, so a
    # listing that finds the chunks gone finds the part (parts first could find neither).
    chunks = sorted(directory.glob(CHUNK_GLOB))
    parts = sorted(directory.glob(PART_GLOB))
    if not chunks or not parts:
        return RankFiles(parts, chunks)
    import pyarrow as pa  # only here: listing a partition needs no Arrow
    import pyarrow.parquet as pq

    replaced: set[str] = set()
    for part in parts:
        if not part.is_file():
            continue  # a FIFO or a directory under a part's name: damage, which readers report
        try:
            metadata = pq.read_schema(part).metadata or {}
        except (OSError, pa.ArrowInvalid):
            continue  # a damaged part replaces nothing; readers name it (store.integrity)
        replaced.update(metadata.get(SOURCES_KEY.encode(), b"").decode().split(","))
    return RankFiles(
        parts,
        [chunk for chunk in chunks if chunk.name not in replaced],
        [chunk for chunk in chunks if chunk.name in replaced],
    )
