"""``dlprof tree``: the drawn scope and code trees, CSV and JSON rows, the filters, and one-line
errors, in-process and as the installed program; ``dlprof run --with-stack`` end to end."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest

from dlprof.cli.main import main
from tests.conftest import dlprof_program

pytestmark = pytest.mark.torch


def run_program(*args: str, cwd: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*dlprof_program(), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, check=False)


def test_scope_tree_is_drawn_for_a_person(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", str(cnn_run), "--min-percent", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.strip().split("  ")[0] for line in lines]
    assert "(all ops)" in names
    forward = next(i for i, line in enumerate(lines) if "─ Sequential forward" in line)
    # The layers of the model hang below it, drawn with guides one level in: below a last child
    # (└─) the guide column is blank, below any other it continues (│). Which of forward and
    # backward comes last depends on their measured times.
    column = lines[forward].index("─ Sequential forward") - 1  # where its own ├─ or └─ is
    guide = "   " if lines[forward][column] == "└" else "│  "
    below = [line[column:] for line in lines[forward + 1:forward + 6]]
    assert all(line.startswith((f"{guide}├─ ", f"{guide}└─ ")) for line in below), below
    assert any("0 (Conv2d)" in line for line in below)


def test_json_rows_rebuild_the_tree_and_hold_the_op_views_time(cnn_run: Path) -> None:
    tree = run_program("tree", str(cnn_run), "--min-percent", "0", "--format", "json")
    ops = run_program("top", str(cnn_run), "--group-by", "type", "--limit", "0", "--format", "json")
    assert tree.returncode == ops.returncode == 0, tree.stderr + ops.stderr
    rows = json.loads(tree.stdout)
    by_node = {row["node"]: row for row in rows}
    for row in rows[1:]:
        parent = by_node[row["parent"]]
        assert row["depth"] == parent["depth"] + 1 and row["path"].startswith(parent["path"])
    assert rows[0]["total_ns"] == sum(row["total_ns"] for row in json.loads(ops.stdout))


def test_depth_and_share_filters_in_csv(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree", str(cnn_run), "--depth", "1", "--min-percent", "5", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {int(row["depth"]) for row in rows} == {0, 1}
    assert all(float(row["total_pct"]) >= 5 for row in rows[1:])


@pytest.mark.parametrize(("args", "message"), [
    (["--view", "code"], "--with-stack"),
    (["--rank", "7"], "no rank 7"),
    (["--view", "forest"], "Invalid value"),
    (["--min-percent", "150"], "Invalid value"),
])
def test_bad_input_is_one_line(cnn_run: Path, args: list[str], message: str) -> None:
    done = run_program("tree", str(cnn_run), *args)
    assert done.returncode == 2
    assert message in done.stderr and "Traceback" not in done.stderr


def test_a_run_without_scopes_says_how_to_get_them(gpu_run: Path) -> None:
    done = run_program("tree", str(gpu_run))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "layers collector" in done.stderr


@pytest.mark.slow
def test_run_with_stack_then_the_code_view(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="needs PyTorch")
    script = (
        "import torch\n"
        "model = torch.nn.Linear(8, 2)\n"
        "def train_step(x):\n"
        "    model(x).sum().backward()\n"
        "for _ in range(3):\n"
        "    train_step(torch.randn(4, 8))\n"
    )
    (tmp_path / "train.py").write_text(script)
    line = script.splitlines().index("def train_step(x):") + 1
    without_torch = run_program("run", "--with-stack", "--collectors", "host", "train.py", cwd=tmp_path)
    assert without_torch.returncode == 2 and "--with-stack" in without_torch.stderr
    done = run_program("run", "-o", "run", "--top", "0", "--with-stack", "train.py", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    code = run_program("tree", "run", "--view", "code", "--min-percent", "0", "--format", "json", cwd=tmp_path)
    assert code.returncode == 0, code.stderr
    rows = json.loads(code.stdout)
    names = [row["name"] for row in rows]
    assert any(name.endswith(f"train.py:{line}:train_step") for name in names), names[:20]
    # The tree is the user's code: rooted at the script, which holds all op time; none of
    # dlprof's, click's or runpy's frames.
    assert [row["name"] for row in rows if row["depth"] == 1] == ["train.py:<module>"]
    assert [row["total_ns"] for row in rows if row["depth"] == 1] == [rows[0]["total_ns"]]
    assert not [n for n in names if "dlprof/" in n or "click/" in n or "runpy" in n], names
