"""How the engines see a run's tables: columns, ranks, clocks, runs never compacted."""

from __future__ import annotations

from pathlib import Path

import pytest

import dlprof
from dlprof.engine.sources import STORE_COLUMNS, sql_type
from dlprof.keys import StoreTable
from dlprof.store.schema import SCHEMAS


def test_the_engines_columns_are_the_schema_s() -> None:
    for table, schema in SCHEMAS.items():
        assert STORE_COLUMNS[table] == tuple((f.name, sql_type(f.type)) for f in schema), table


def test_views_hold_every_table_with_its_rank(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    for table in StoreTable:
        columns = run.query(f"SELECT * FROM {table} LIMIT 0").columns
        assert columns == (*(name for name, _ in STORE_COLUMNS[table]), "rank"), table
    counted = run.query("SELECT count(*) FROM slices").rows[0][0]
    assert counted == run.manifest.counts["slices"] == len(run.slices)


def test_engine_tables_equal_the_whole_tables(two_rank_run: Path) -> None:
    run = dlprof.load(two_rank_run)
    engine = run.sql("SELECT * FROM slices ORDER BY rank, id").reset_index(drop=True)
    whole = run.slices.sort_values(["rank", "id"]).reset_index(drop=True)
    assert list(engine.columns) == list(whole.columns)
    for column in ("id", "rank", "start_ns", "dur_ns", "parent_id", "name", "kind"):
        assert engine[column].tolist() == whole[column].tolist(), column


def test_batches_stream_a_table(two_rank_run: Path) -> None:
    run = dlprof.load(two_rank_run)
    batches = list(run.batches(StoreTable.SLICES, ["id", "rank"], where="kind = 'kernel'",
                               order_by="rank, id", rows_per_batch=100))
    assert all(b.num_rows <= 100 for b in batches) and len(batches) > 1
    ids = [i for b in batches for i in b.column("id").to_pylist()]
    kernels = run.slices[run.slices["kind"] == "kernel"].sort_values(["rank", "id"])
    assert ids == kernels["id"].tolist()


def test_a_run_never_compacted_is_read_from_its_chunks_and_nested(tmp_path: Path) -> None:
    from tests.builders import write_uncompacted_run

    write_uncompacted_run(tmp_path)  # a step (id 1) and an op in it (id 2), in two chunks
    found = dlprof.load(tmp_path).query("SELECT name, depth, parent_id, self_ns FROM slices ORDER BY id").rows
    assert found == [("s", 0, None, 80), ("o", 1, 1, 20)]


def test_an_unknown_engine_is_one_line(cnn_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLPROF_ENGINE", "oracle")
    with pytest.raises(dlprof.RunError, match="DLPROF_ENGINE=oracle: no such engine"):
        dlprof.load(cnn_run).query("SELECT 1")
