"""Every command spells its options alike, and the spellings they replaced still work."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from dlprof.cli.main import COMMANDS, main
from dlprof.cli.table_options import DEFAULT_LIMIT
from tests.conftest import KINETO_TRACES, dlprof_program

# Commands that read no run (they list counters, or run or import a program).
# Commands that read no runs folder: they list counters, measure the machine, or make a run where told.
_MAKE_OR_LIST = {"calibrate", "counters", "import", "run"}


def commands() -> dict[str, click.Command]:
    return {name: importlib.import_module(f"dlprof.cli.{module}").command for name, (module, _) in COMMANDS.items()}


def option(command: click.Command, name: str) -> click.Option | None:
    found = [p for p in command.params if isinstance(p, click.Option) and p.name == name]
    return found[0] if found else None


def shown_help(name: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([name, "--help"]) == 0
    return capsys.readouterr().out


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def test_each_shared_option_is_spelt_alike_everywhere() -> None:
    for name, command in commands().items():
        limit, fmt, output = option(command, "limit"), option(command, "fmt"), option(command, "output")
        if limit is not None:
            assert limit.opts[:2] == ["-n", "--limit"] and limit.default == DEFAULT_LIMIT, name
        if fmt is not None:
            assert fmt.opts[:2] == ["-f", "--format"], name
            if name != "export":  # a trace format, not how a table prints
                assert "table" in fmt.type.choices and fmt.default == "table", name  # type: ignore[attr-defined]
        if output is not None:
            assert output.opts[:2] == ["-o", "--output"], name
        kinds = option(command, "kinds")
        if kinds is not None:
            assert kinds.multiple, name
        if name not in _MAKE_OR_LIST or name == "import":
            assert option(command, "runs_directory") is not None, f"{name}: no --dir"


def test_every_reporting_command_takes_a_format() -> None:
    for name in ("top", "diff", "gpu", "memory", "metrics", "pprof", "ranks", "steps", "tree", "tune", "ls",
                 "counters"):
        fmt = option(commands()[name], "fmt")
        assert fmt is not None and list(fmt.type.choices) == ["table", "csv", "json"], name  # type: ignore[attr-defined]
    info = option(commands()["info"], "fmt")
    assert info is not None and list(info.type.choices) == ["table", "json"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "hidden"), [("run", "--out"), ("run", "--top"), ("import", "--out")])
def test_old_option_names_are_left_out_of_help(name: str, hidden: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = shown_help(name, capsys)
    assert f"{hidden} " not in text and f"{hidden}," not in text
    assert "-o, --output" in text


@pytest.mark.torch
def test_by_micros_is_by_total(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    total = cli(["top", str(cnn_run), "--by", "total", "-f", "csv"], capsys)
    assert cli(["top", str(cnn_run), "--by", "micros", "-f", "csv"], capsys) == total
    assert cli(["top", str(cnn_run), "--by", "MICROS", "-f", "csv"], capsys) == total
    assert "top op by total" in cli(["top", str(cnn_run), "--by", "micros"], capsys)
    assert "micros" not in shown_help("top", capsys).split("--by")[1].split("\n")[0]


@pytest.mark.torch
def test_info_text_is_table(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = cli(["info", str(cnn_run), "-f", "table"], capsys)
    assert cli(["info", str(cnn_run), "--format", "text"], capsys) == table
    assert json.loads(cli(["info", str(cnn_run), "-f", "json"], capsys))["name"]


@pytest.mark.torch
def test_limit_is_fifteen_by_default_and_n_sets_it(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(json.loads(cli(["top", str(cnn_run), "-f", "json"], capsys))) == DEFAULT_LIMIT
    assert len(json.loads(cli(["top", str(cnn_run), "-n", "4", "-f", "json"], capsys))) == 4
    assert len(json.loads(cli(["top", str(cnn_run), "--limit", "4", "-f", "json"], capsys))) == 4
    compared = json.loads(cli(["diff", str(cnn_run), str(cnn_run), "--kind", "op", "-f", "json"], capsys))["rows"]
    assert 0 < len(compared) <= DEFAULT_LIMIT + 1  # the names, and the kind's total


@pytest.mark.torch
def test_several_kinds_give_a_table_each(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shown = cli(["top", str(cnn_run), "--kind", "op", "--kind", "module", "-n", "3"], capsys)
    assert "top op by total" in shown and "top module by total" in shown
    rows = json.loads(cli(["top", str(cnn_run), "--kind", "op", "--kind", "module", "-n", "3", "-f", "json"], capsys))
    assert [row["kind"] for row in rows] == ["op"] * 3 + ["module"] * 3
    alone = json.loads(cli(["top", str(cnn_run), "--kind", "module", "-n", "3", "-f", "json"], capsys))
    assert [row["name"] for row in rows[3:]] == [row["name"] for row in alone]
    assert main(["top", str(cnn_run), "--kind", "op", "--kind", "kernel"]) == 2
    assert "no slices of kind 'kernel'" in capsys.readouterr().err


@pytest.mark.torch
def test_dir_names_the_runs_directory(cnn_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(cnn_run, tmp_path / "elsewhere" / "cnn")
    monkeypatch.chdir(tmp_path)
    by_path = cli(["top", str(cnn_run), "-f", "csv"], capsys)
    assert cli(["top", "--dir", "elsewhere", "-f", "csv"], capsys) == by_path  # the newest there
    assert cli(["top", "cnn", "--dir", "elsewhere", "-f", "csv"], capsys) == by_path  # by name
    assert "cnn" in cli(["ls", "--dir", "elsewhere", "-f", "csv"], capsys)
    assert main(["top"]) == 2  # the default directory is back: no runs under ./dlprof-runs
    assert "no runs under ./dlprof-runs" in capsys.readouterr().err
    assert main(["steps", "--dir", "nowhere"]) == 2
    assert "no runs under ./nowhere" in capsys.readouterr().err


@pytest.mark.torch
def test_pprof_prints_its_rows_as_csv_and_json(cnn_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = cli(["pprof", str(cnn_run), "-n", "0", "--wide"], capsys)
    rows = json.loads(cli(["pprof", str(cnn_run), "-n", "0", "-f", "json"], capsys))
    names = [row["name"] for row in rows if row["profile"] == "thread"]
    assert names and all(name in text for name in names)
    assert {row["rank"] for row in rows if row["profile"] == "thread"} == {0}
    cut = json.loads(cli(["pprof", str(cnn_run), "-n", "3", "-f", "json"], capsys))
    tables: dict[tuple[object, ...], list[str]] = {}
    for row in cut:
        tables.setdefault((row["profile"], row["rank"], row["thread"]), []).append(row["name"])
    assert tables and all(len(names) <= 4 for names in tables.values())  # 3 rows, then -others-
    assert all(names[-1] == "-others-" for names in tables.values() if len(names) == 4)
    csv = cli(["pprof", str(cnn_run), "-n", "3", "--format", "csv"], capsys).splitlines()
    assert csv[0].startswith("profile,rank,thread,pid,tid,device,name,") and len(csv) == len(cut) + 1


def test_counters_as_csv(capsys: pytest.CaptureFixture[str]) -> None:
    lines = cli(["counters", "-f", "csv"], capsys).splitlines()
    assert lines[0].startswith("name,backend,") and any(line.startswith("task-clock,") for line in lines)


def test_import_output_and_its_old_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (trace,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    for spelling in ("-o", "--output", "--out"):
        out = tmp_path / spelling.strip("-")
        cli(["import", spelling, str(out), str(trace)], capsys)
        assert (out / "run.json").is_file(), spelling


def test_import_into_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    (trace,) = (KINETO_TRACES / "critical_path" / "simple_add").glob("*.json.gz")
    monkeypatch.chdir(tmp_path)
    cli(["import", "--dir", "traces", str(trace)], capsys)
    (made,) = (tmp_path / "traces").iterdir()
    assert (made / "run.json").is_file()
    assert "kernel" in cli(["top", made.name, "--dir", "traces", "--kind", "kernel", "-n", "1"], capsys)


@pytest.mark.parametrize("spelling", [("-o", "-n"), ("--output", "--limit"), ("--out", "--top")])
def test_run_output_and_limit_and_their_old_names(spelling: tuple[str, str], tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text("import dlprof\nwith dlprof.region('work'):\n    sum(range(1000))\n")
    output, limit = spelling
    done = subprocess.run([*dlprof_program(), "run", output, "made", limit, "0", "--collectors", "host", "work.py"],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "made" / "run.json").is_file()
    assert "top" not in done.stdout  # -n 0: no table


def test_run_into_dir(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text("import dlprof\nwith dlprof.region('work'):\n    sum(range(1000))\n")
    done = subprocess.run([*dlprof_program(), "run", "--dir", "mine", "-n", "0", "--collectors", "host", "work.py"],
                          cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    (made,) = (tmp_path / "mine").iterdir()
    assert made.name.endswith("-work") and (made / "run.json").is_file()
    assert not (tmp_path / "dlprof-runs").exists()
