"""Commands that only read manifests start at once: ``dlprof --help``, ``ls`` and ``info`` load
neither pandas, Arrow, a query engine nor a framework; ``top`` loads DuckDB and no Arrow, numpy
or pandas; ``import`` loads no pandas (checked with ``python -X importtime``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from dlprof.cli.main import COMMANDS, SUBCOMMANDS, cli
from tests.conftest import KINETO_TRACES

HEAVY = ("pandas", "pyarrow", "duckdb", "pyspark", "torch", "tensorflow", "numpy")


def modules_loaded(*args: str, cwd: Path) -> set[str]:
    """The modules ``python -X importtime -m dlprof ARGS`` imports (it must succeed)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "dlprof", *args], cwd=cwd,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split("|")[-1] for line in done.stderr.splitlines() if line.startswith("import time:")]
    return {line.strip() for line in lines}


@pytest.mark.parametrize("args", [["--help"], ["ls"], ["info"], ["info", "--format", "json"]],
                         ids=lambda args: " ".join(args))
def test_manifest_commands_load_nothing_heavy(args: list[str], cnn_run: Path, tmp_path: Path) -> None:
    (tmp_path / "dlprof-runs").mkdir()
    (tmp_path / "dlprof-runs" / "cnn").symlink_to(cnn_run)
    loaded = modules_loaded(*args, cwd=tmp_path)
    assert "dlprof.cli.main" in loaded  # the check sees dlprof's own imports
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == []


def test_a_reading_command_does_load_its_engine(cnn_run: Path, tmp_path: Path) -> None:
    # The same check on a command that queries: it sees the engine, so its silence above counts.
    loaded = modules_loaded("top", str(cnn_run), "-n", "1", cwd=tmp_path)
    assert "duckdb" in loaded


def test_top_loads_duckdb_alone(cnn_run: Path, tmp_path: Path) -> None:
    # Before, checking the run's Parquet footers loaded Arrow (and numpy with it): 85 MB and
    # 0.1 s of a command DuckDB answers alone.
    loaded = modules_loaded("top", str(cnn_run), cwd=tmp_path)
    assert "duckdb" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] in ("pyarrow", "numpy", "pandas")) == []


def test_import_loads_no_pandas(tmp_path: Path) -> None:
    # Before, the first Arrow array made pyarrow import pandas to look for it: 0.3-0.5 s and
    # 45 MB of a command that makes no DataFrame.
    trace = KINETO_TRACES / "critical_path" / "simple_add" / "benchmark_result_493459_1694039959_trace.json.gz"
    loaded = modules_loaded("import", "-o", str(tmp_path / "run"), str(trace), cwd=tmp_path)
    assert "pyarrow" in loaded and "duckdb" in loaded
    # pyarrow's check for pandas is answered "absent": its attempt shows, pandas' modules never do.
    assert sorted(m for m in loaded if m.startswith("pandas.")) == []


def test_the_command_list_names_every_command_module() -> None:
    for name, (module, summary) in COMMANDS.items():
        command = cli.get_command(click.Context(cli), name)
        assert command is not None and command.name == name, module
        assert summary.endswith(".") and len(summary) <= 76, name
    assert list(SUBCOMMANDS) == sorted(COMMANDS)


def test_help_lists_every_command_with_its_line() -> None:
    done = subprocess.run([sys.executable, "-m", "dlprof", "--help"], capture_output=True, text=True,
                          check=True, timeout=60)
    for name, (_, summary) in COMMANDS.items():
        assert f"{name}  " in done.stdout and summary in " ".join(done.stdout.split())
