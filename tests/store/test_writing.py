"""Writing a run: ids that carry their rank, chunks compacted into one file per table and rank,
the bytes a run takes per event, and the schema version manifests are read with."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dlprof.store.ids import SLOT_KINETO, SLOT_SESSION, id_base, rank_of
from dlprof.store.reader import load
from tests.builders import write_uncompacted_run
from tests.conftest import profile_tiny_cnn


def test_ids_carry_rank_and_do_not_collide() -> None:
    assert rank_of(id_base(5, SLOT_KINETO) + 12345) == 5
    assert id_base(0, SLOT_SESSION) != id_base(0, SLOT_KINETO)
    with pytest.raises(ValueError):
        id_base(1 << 20, 0)


def test_compaction_merges_chunks_into_one_file(tmp_path: Path) -> None:
    counts, _ = write_uncompacted_run(tmp_path).compact()
    files = sorted(p.name for p in (tmp_path / "slices" / "rank=0").iterdir())
    assert files == ["part-00000.parquet"]
    assert counts["slices"] == 2
    assert load(tmp_path).slices["depth"].tolist() == [0, 1]


@pytest.fixture(scope="module")
def thirty_step_cnn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny CNN for thirty steps: enough events that the Parquet footers, paid once per file
    whatever the run's length, no longer decide the bytes per event."""
    return profile_tiny_cnn(tmp_path_factory.mktemp("runs") / "cnn30", steps=30)


def test_run_stores_under_40_bytes_per_event(thirty_step_cnn_run: Path) -> None:
    run = load(thirty_step_cnn_run)
    files = sorted(thirty_step_cnn_run.rglob("*.parquet"))
    rows: dict[str, int] = {}
    for path in files:
        table = path.relative_to(thirty_step_cnn_run).parts[0]
        rows[table] = rows.get(table, 0) + pq.read_metadata(path).num_rows
    # The manifest's counts are the events: every row of every table, as the files hold them.
    assert {t: n for t, n in run.manifest.counts.items() if n} == rows
    events = sum(run.manifest.counts.values())
    size = sum(path.stat().st_size for path in files)
    assert events > 5000, run.manifest.counts
    assert size / events < 40, f"{size} bytes for {events} events"


def test_the_light_schema_version_is_the_schema_s() -> None:
    # Manifests are read without Arrow, from dlprof.store.version; the schema module says the same.
    from dlprof.store import schema, version

    assert version.SCHEMA_VERSION == schema.SCHEMA_VERSION
