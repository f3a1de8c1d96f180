"""A query that fails on Spark is one line, as on DuckDB: never a Java stack trace.

Spark runs for real, in local mode, on the damaged run DuckDB's test reads
(``tests/cli/test_messages.py``): durations each within the store's range that add up past
int64. Spark's executor logs a failed task with its Java stack trace straight on file
descriptor 2, so stderr is read there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.builders import op, write_rows_run
from tests.conftest import run_in_process

pytestmark = pytest.mark.slow


def test_durations_adding_up_past_int64_are_the_same_one_line_on_spark_as_on_duckdb(
        spark: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """Before, Spark printed the failed task's Java stack trace twice (log4j's ERROR lines and
    PySpark's query-context logger) and the line said Spark's own advice on its settings."""
    run = tmp_path / "run"
    write_rows_run(run, [op(i, "aten::mm", i, 3 * 10**18) for i in range(1, 5)])
    lines = {}
    for engine in ("duckdb", "spark"):
        capfd.readouterr()
        code, out, err = run_in_process(["top", str(run), "--engine", engine])
        seen = capfd.readouterr()
        assert code == 2 and out == "", (engine, err)
        (line,) = err.strip().splitlines()
        assert "Exception" not in seen.err and "\tat org." not in seen.err, seen.err
        lines[engine] = line
    prefix = f"dlprof: error: {run}: a value past the range of its column ("
    suffix = "): the run's times or counts are damaged"
    for engine, line in lines.items():
        assert line.startswith(prefix) and line.endswith(suffix), (engine, line)
    assert lines["spark"] == f"{prefix}[ARITHMETIC_OVERFLOW] overflow{suffix}"
