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
from tests.builders import write_imported_run
from tests.conftest import KINETO_TRACES


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
