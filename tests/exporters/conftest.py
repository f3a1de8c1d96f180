"""Runs for the exporter tests that the CPU-only ``cnn_run`` cannot give: GPU work, several ranks.

There is no GPU here, so the GPU runs are built from a real Kineto trace recorded on an A100
(HTA's ``critical_path/simple_add``: kernels on two streams, memcpy, memset, runtime calls with
correlation ids), imported with dlprof's own Kineto importer and written with the store's writer.
The traces are in tests/data/kineto-traces, with their licence.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dlprof.importers.kineto import KinetoOptions, convert_trace, read_trace
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.ids import SLOT_IMPORT, id_base
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from tests.conftest import KINETO_TRACES


def simple_add_trace() -> Path:
    """The recorded A100 trace."""
    (found,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    return found


def write_imported_run(run_dir: Path, trace_path: Path, ranks: tuple[int, ...]) -> Path:
    """A complete run holding ``trace_path`` imported once for each of ``ranks``."""
    trace = read_trace(trace_path)
    counts: dict[str, int] = {}
    for rank in ranks:
        tables = convert_trace(trace, KinetoOptions(id_base=id_base(rank, SLOT_IMPORT)))
        writer = RankWriter(run_dir, rank)
        writer.write_chunk(StoreTable.SLICES, tables.slices, "import")
        writer.write_chunk(StoreTable.MEMORY, tables.memory, "import")
        writer.write_chunk(StoreTable.COUNTERS, tables.counters, "import")
        rank_counts, _ = writer.compact()
        for table, rows in rank_counts.items():
            counts[table] = counts.get(table, 0) + rows
    Manifest(
        name=run_dir.name,
        command=["python3.10", trace_path.name],
        status=RunStatus.COMPLETE,
        devices=trace.get("deviceProperties", []),
        ranks=list(ranks),
        world_size=len(ranks),
        counts=counts,
    ).write(run_dir)
    return run_dir


@pytest.fixture
def empty_run(tmp_path: Path) -> Path:
    """A complete run in which nothing was recorded."""
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    Manifest(name="empty", command=["python"], status=RunStatus.COMPLETE).write(run_dir)
    RankWriter(run_dir, 0).compact()
    return run_dir


@pytest.fixture(scope="session")
def cupti_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank of a real A100 trace from Kineto's CUPTI range profiler: nine hardware counters
    per kernel (``cupti:smsp__...``) in the metrics table, beside CPU ops and runtime calls."""
    (trace_path,) = (KINETO_TRACES / "cupti_profiler").glob("*.json.gz")
    run_dir = write_imported_run(tmp_path_factory.mktemp("runs") / "cupti", trace_path, (0,))
    # The same import again, for its metrics: the ids are the same, so they name the stored slices.
    tables = convert_trace(read_trace(trace_path), KinetoOptions(id_base=id_base(0, SLOT_IMPORT)))
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.METRICS, tables.metrics, "import")
    counts, _ = writer.compact()
    manifest = Manifest.read(run_dir)
    manifest.counts = counts
    manifest.write(run_dir)
    return run_dir
