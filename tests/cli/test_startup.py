"""Commands that only read manifests start at once: ``dlprof --help``, ``ls`` and ``info`` load
neither pandas, Arrow, a query engine nor a framework (checked with ``python -X importtime``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest

from dlprof.cli.main import COMMANDS, SUBCOMMANDS, cli

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
