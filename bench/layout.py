"""Does another sort order or row-group size of the slices files make the analyses' queries faster?

    .venv/bin/python bench/layout.py RUN            # a run with many events (bench/scale.py's cache)

Rewrites RUN's slices into a temporary directory three ways and times DuckDB queries on each,
interleaved, in one process (median of ``--repeat``):

    as written      the store's track order (pid, device, tid, start), pyarrow's row groups
    small groups    the same order, 131,072 rows per row group
    by kind         sorted by (kind, start_ns), 131,072 rows per row group: a kind, or a time
                    range within it, reads only its row groups

Queries: top's aggregate of ops, the device-time join top and the op view use, one step's slices
(a time range), and the kernels alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlprof.store.schema import write_parquet

SMALL_GROUPS = 131_072
QUERIES = {
    "ops by name": "SELECT name, count(*), sum(dur_ns), sum(self_ns) FROM slices WHERE kind = 'op' GROUP BY name",
    "device time by launcher": (
        "SELECT o.name, sum(w.dur_ns) FROM slices w JOIN slices c ON c.correlation_id = w.correlation_id "
        "JOIN slices o ON o.id = c.parent_id WHERE w.kind IN ('kernel', 'memcpy', 'memset') "
        "AND c.kind = 'runtime' GROUP BY o.name"),
    "one step's slices": "SELECT kind, count(*), sum(dur_ns) FROM slices WHERE start_ns BETWEEN {low} AND {high} GROUP BY kind",
    "kernels": "SELECT name, count(*), sum(dur_ns) FROM slices WHERE kind = 'kernel' GROUP BY name",
}


def write_like_the_store(table: pa.Table, path: Path) -> None:
    """``dlprof.store.schema.write_parquet``'s encodings, with smaller row groups (and statistics
    on kind too, so a reader can skip the groups of other kinds)."""
    delta = {"id", "start_ns", "dur_ns", "self_ns", "parent_id"}
    pq.write_table(
        table, path, compression="zstd", row_group_size=SMALL_GROUPS,
        use_dictionary=[f.name for f in table.schema if pa.types.is_dictionary(f.type)],
        column_encoding={f.name: "DELTA_BINARY_PACKED" for f in table.schema
                         if f.name in delta and pa.types.is_int64(f.type)},
        dictionary_pagesize_limit=8 << 20, write_statistics=["start_ns", "kind"],
    )


def write_variants(run: Path, out: Path) -> dict[str, Path]:
    table = pq.read_table(next((run / "slices").glob("rank=*/part-*.parquet")))
    variants = {"as written": out / "written.parquet", "small groups": out / "small.parquet",
                "by kind": out / "kind.parquet"}
    write_parquet(table, variants["as written"])
    write_like_the_store(table, variants["small groups"])
    kind = pc.dictionary_decode(table.column("kind").combine_chunks())  # sort by value, not code
    order = pc.sort_indices(pa.table({"kind": kind, "start_ns": table.column("start_ns")}),
                            sort_keys=[("kind", "ascending"), ("start_ns", "ascending")])
    by_kind = table.take(order)
    write_like_the_store(by_kind, variants["by kind"])
    return variants


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        variants = write_variants(args.run, Path(scratch))
        connection = duckdb.connect()
        (low, high), = connection.sql(
            f"SELECT start_ns, start_ns + dur_ns FROM read_parquet('{variants['as written']}') "
            "WHERE kind = 'step' ORDER BY start_ns LIMIT 1 OFFSET 100").fetchall()
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeat):
            for label, path in variants.items():
                connection.execute(f"CREATE OR REPLACE VIEW slices AS SELECT * FROM read_parquet('{path}')")
                for query_name, query in QUERIES.items():
                    started = time.perf_counter()
                    connection.sql(query.format(low=low, high=high)).fetchall()
                    times.setdefault((label, query_name), []).append(time.perf_counter() - started)
        print("| query | " + " | ".join(variants) + " |")
        print("|---|" + "---:|" * len(variants))
        for query_name in QUERIES:
            cells = [f"{statistics.median(times[(label, query_name)]) * 1000:.0f} ms" for label in variants]
            print(f"| {query_name} | " + " | ".join(cells) + " |")
        sizes = [f"{path.stat().st_size / 1e6:.1f} MB" for path in variants.values()]
        print("| file size | " + " | ".join(sizes) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
