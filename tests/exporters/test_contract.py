"""What every registered exporter promises, checked on each of them (pyinstrument-style).

A new format added to the registry gets these tests without writing any: files with its
extension, nothing half-written, a clear refusal of an empty run, output that does not depend
on how the rows were batched, and a progress bar that reaches its total.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

import dlprof
from dlprof.exporters.base import Exporter, ExportError
from dlprof.exporters.registry import (
    BY_EXTENSION,
    BY_FORMAT,
    EXPORTERS,
    UnknownFormatError,
    exporter_for_format,
    exporter_for_path,
)
from dlprof.keys import StoreTable

every_exporter = pytest.mark.parametrize(
    "exporter_class", EXPORTERS, ids=[cls.format_name for cls in EXPORTERS]
)
RUNS = ["cnn_run", "gpu_run", "two_rank_run"]


@every_exporter
@pytest.mark.parametrize("run_name", RUNS)
def test_writes_non_empty_files_with_its_extension(exporter_class: type[Exporter], run_name: str,
                                                   tmp_path: Path,
                                                   request: pytest.FixtureRequest) -> None:
    run = dlprof.load(request.getfixturevalue(run_name))
    asked = tmp_path / "out" / f"trace{exporter_class.file_extension}"
    written = exporter_class().export(run, asked)
    assert written == exporter_class().output_paths(run, asked) and written
    for path in written:
        # A directory format (TAU) gives its directory the extension and writes only inside it.
        assert path.name.endswith(exporter_class.file_extension) or asked in path.parents
        assert path.stat().st_size > 0
        if not exporter_class.binary:
            path.read_bytes().decode("utf-8")
    if asked.is_dir():
        assert sorted(p for p in asked.rglob("*") if p.is_file()) == sorted(written)
    tops = {p.relative_to(asked.parent).parts[0] for p in written}
    assert sorted(p.name for p in asked.parent.iterdir()) == sorted(tops)


@every_exporter
def test_refuses_a_run_without_slices(exporter_class: type[Exporter], empty_run: Path,
                                      tmp_path: Path) -> None:
    out = tmp_path / f"trace{exporter_class.file_extension}"
    with pytest.raises(ExportError, match="holds no slices"):
        exporter_class().export(dlprof.load(empty_run), out)
    assert not tmp_path.joinpath(out.name).exists()
    assert not list(tmp_path.glob("*.partial"))


@every_exporter
def test_output_is_deterministic_and_independent_of_batching(exporter_class: type[Exporter],
                                                              gpu_run: Path,
                                                              tmp_path: Path) -> None:
    run = dlprof.load(gpu_run)
    ext = exporter_class.file_extension
    outputs = []
    for name, exporter in (("a", exporter_class()), ("b", exporter_class()),
                           ("c", exporter_class(batch_rows=7))):
        asked = tmp_path / f"{name}{ext}"
        # a text format may name its own file inside it; a directory format's files keep their names
        outputs.append({
            str(p.relative_to(tmp_path)).replace(asked.name, "NAME"):
                p.read_bytes() if exporter_class.binary else p.read_text().replace(p.name, "NAME")
            for p in exporter.export(run, asked)
        })
    assert outputs[0] == outputs[1] == outputs[2]


@every_exporter
def test_progress_reaches_every_row(exporter_class: type[Exporter], cnn_run: Path,
                                    tmp_path: Path) -> None:
    run = dlprof.load(cnn_run)
    rows = sum(run.arrow(t).num_rows for t in (StoreTable.SLICES, StoreTable.COUNTERS, StoreTable.MEMORY))
    with Progress(console=Console(file=io.StringIO())) as progress:
        exporter_class(batch_rows=100).export(run, tmp_path / f"t{exporter_class.file_extension}", progress)
    [task] = progress.tasks
    assert task.total == rows and task.completed == rows
    assert exporter_class.format_name in task.description


@every_exporter
def test_creates_missing_directories(exporter_class: type[Exporter], gpu_run: Path,
                                     tmp_path: Path) -> None:
    out = tmp_path / "a" / "b" / f"t{exporter_class.file_extension}"
    written = exporter_class().export(dlprof.load(gpu_run), out)
    assert (written == [out] and out.is_file()) or (
        out.is_dir() and written and all(p.is_file() and out in p.parents for p in written))


@every_exporter
def test_registry_finds_it_by_name_and_extension(exporter_class: type[Exporter]) -> None:
    assert exporter_class.file_extension.startswith(".")
    assert exporter_class.description and isinstance(exporter_class.binary, bool)
    assert exporter_for_format(exporter_class.format_name) is exporter_class
    assert exporter_for_format(exporter_class.format_name.upper()) is exporter_class
    assert exporter_for_path(Path(f"dir/x{exporter_class.file_extension}")) is exporter_class


def test_names_and_extensions_are_unique() -> None:
    assert len(BY_FORMAT) == len(BY_EXTENSION) == len(EXPORTERS)


def test_unknown_names_and_extensions_say_what_is_known() -> None:
    with pytest.raises(UnknownFormatError, match="chrome"):
        exporter_for_format("svg")
    with pytest.raises(UnknownFormatError, match=r"\.perfetto-trace"):
        exporter_for_path(Path("trace.txt"))


def test_batches_must_hold_rows() -> None:
    with pytest.raises(ValueError, match="batch_rows"):
        EXPORTERS[0](batch_rows=0)
