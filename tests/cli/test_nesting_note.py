"""The line under ``top`` and ``tree`` that says how many slices nesting moved, on the H200 run
(3,287 slices moved when it was recorded) and on a run nesting left as recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlprof.cli.main import main
from tests.builders import op, write_rows_run


def test_top_and_tree_say_how_many_slices_nesting_moved(h200_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["top", "-n", "3"], ["top", "-n", "3", "--kind", "module", "--kind", "step"], ["tree"]):
        assert main([*command, str(h200_run)]) == 0
        out = capsys.readouterr().out
        note = " ".join(out[out.index("Nesting changed"):].split())
        assert note.startswith("Nesting changed the times of 3,287 slices to make one tree (549 ended at their "
                               "parent's end, 1,719 started after the slice they began in, 1,019 started earlier"), note
        assert out.count("Nesting changed") == 1 and max(len(line) for line in out.splitlines()) <= 80
    assert main(["top", "-n", "3", "-f", "csv", str(h200_run)]) == 0
    assert "Nesting" not in capsys.readouterr().out  # only for a person


def test_nothing_is_said_when_nothing_moved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_rows_run(tmp_path / "run", [op(1, "aten::mm", 0, 100), op(2, "aten::add", 10, 20)])
    assert main(["top", str(run.path)]) == 0
    assert "Nesting" not in capsys.readouterr().out
