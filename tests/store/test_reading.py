"""Reading a run: from chunks when it was never compacted, with pyarrow alone, and the one-line
errors for what is not a run or is damaged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlprof.keys import RunStatus
from dlprof.store.reader import RunError, load
from tests.builders import write_uncompacted_run


def test_run_killed_before_compaction_is_read_from_chunks_and_reported_killed(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    write_uncompacted_run(tmp_path, RunStatus.RUNNING, pid=int(dead.stdout))
    run = load(tmp_path)
    assert run.status is RunStatus.KILLED
    frame = run.slices.set_index("name")
    assert frame.loc["o", "parent_id"] == 1, "chunks are nested when read"


def test_run_reads_with_pyarrow_alone(cnn_run: Path) -> None:
    code = (
        "import sys, json, pyarrow.dataset as ds\n"
        f"t = ds.dataset({str(cnn_run / 'slices')!r}, partitioning='hive').to_table()\n"
        "assert 'dlprof' not in sys.modules\n"
        "print(json.dumps({'rows': t.num_rows, 'ranks': sorted(set(t.column('rank').to_pylist())),"
        " 'kinds': sorted(set(t.column('kind').to_pylist()))}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(out.stdout)
    assert seen["rows"] == len(load(cnn_run).slices)
    assert seen["ranks"] == [0]
    assert {"op", "module", "region", "step"} <= set(seen["kinds"])


@pytest.mark.parametrize("setup, message", [
    (lambda d: None, "no such run directory"),
    (lambda d: d.mkdir(), "not a dlprof run"),
    (lambda d: (d.mkdir(), (d / "run.json").write_text("{not json")), "unreadable manifest"),
])
def test_bad_run_directories_raise_one_line_errors(tmp_path: Path, setup, message: str) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "run"
    setup(target)
    with pytest.raises(RunError, match=message) as raised:
        load(target)
    assert "\n" not in str(raised.value)


def test_truncated_parquet_is_reported_as_damaged(tmp_path: Path) -> None:
    write_uncompacted_run(tmp_path).compact()
    part = tmp_path / "slices" / "rank=0" / "part-00000.parquet"
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    with pytest.raises(RunError, match="damaged Parquet file"):
        _ = load(tmp_path).slices
