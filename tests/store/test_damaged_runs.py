"""Damaged run directories, made at random: every reading command succeeds or fails in one line.

A small real run is written once per module (through the store's own writer); each example
copies it, damages the copy (its manifest, a Parquet file, a partition's name) and runs one
command in-process. The command must exit 0, or exit 2 with one ``dlprof: error:`` line on
stderr; a traceback, an exception out of ``main`` or any other exit status fails.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dlprof.cli.main import main
from dlprof.store.manifest import MANIFEST_NAME
from tests.builders import write_small_run

# Every command that reads a run, as argv after the run is named in place of RUN.
READING_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("info", "RUN"), ("info", "RUN", "--format", "json"), ("top", "RUN"), ("top", "RUN", "--kind", "step"),
    ("tree", "RUN"), ("export", "RUN"), ("export", "RUN", "--format", "perfetto"), ("report", "RUN"),
    ("ranks", "RUN"), ("diff", "BASE", "RUN"), ("gpu", "RUN"), ("pprof", "RUN"), ("tune", "RUN"),
    ("metrics", "RUN"), ("ls", "--dir", "PARENT"),
)
# What the small run lacks (a GPU, kernels, counters for metrics).
NEEDS_MORE = {"gpu", "tune", "metrics"}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_small_run(tmp_path_factory.mktemp("damaged") / "base")


def run_command(argv: list[str]) -> tuple[int, str]:
    """``dlprof ARGV`` in-process: its exit status and its stderr."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue()


def assert_clean(code: int, stderr: str, argv: list[str]) -> None:
    """Exit 0, or exit 2 with one ``dlprof: error:`` line; never a traceback."""
    assert "Traceback" not in stderr, (argv, stderr)
    assert code in (0, 2), (argv, code, stderr)
    if code == 2:
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("dlprof: error: "), (argv, stderr)


# Damage, each a function of the run directory copy.
Damage = Callable[[Path], None]

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
MANIFEST_FIELDS = ("name", "command", "status", "schema_version", "start_ns", "end_ns", "exit_code",
                   "writer_pid", "host", "devices", "collectors", "clocks", "ranks", "world_size",
                   "counts", "normalised", "notes", "saving")
TABLE_FILES = ("slices", "counters")
PARTITION_NAMES = ("rank=abc", "rank=True", "rank=-1", "rank=", "rank=1.5", "rank=\u0663", "rank= 0")


@st.composite
def manifest_damage(draw: st.DrawFn) -> Damage:
    how = draw(st.sampled_from(("replace", "drop", "retype", "bytes")))
    if how == "replace":
        value = draw(JSON_VALUES)
        return lambda run: (run / MANIFEST_NAME).write_text(json.dumps(value))
    if how == "bytes":
        data = draw(st.binary(max_size=40))
        return lambda run: (run / MANIFEST_NAME).write_bytes(data)
    name = draw(st.sampled_from(MANIFEST_FIELDS))
    value = draw(JSON_VALUES)

    def edit(run: Path) -> None:
        manifest = json.loads((run / MANIFEST_NAME).read_text())
        if how == "drop":
            manifest.pop(name, None)
        else:
            manifest[name] = value
        (run / MANIFEST_NAME).write_text(json.dumps(manifest))
    return edit


@st.composite
def parquet_damage(draw: st.DrawFn) -> Damage:
    table = draw(st.sampled_from(TABLE_FILES))
    how = draw(st.sampled_from(("drop", "retype", "truncate", "garbage")))
    fraction = draw(st.floats(0, 1))
    to_type = draw(st.sampled_from((pa.string(), pa.float64(), pa.int8(), pa.bool_())))
    pick = draw(st.integers(0, 100))

    def edit(run: Path) -> None:
        (part,) = (run / table / "rank=0").glob("part-*.parquet")
        if how in ("truncate", "garbage"):
            data = part.read_bytes()
            cut = int(len(data) * fraction)
            part.write_bytes(data[:cut] if how == "truncate" else bytes(reversed(data[:cut])))
            return
        data = pq.read_table(part)
        column = data.column_names[pick % data.num_columns]
        if how == "drop":
            data = data.drop_columns([column])
        else:
            values = pa.array([None] * data.num_rows, to_type) if to_type == pa.bool_() else None
            try:
                cast = values if values is not None else data.column(column).cast(to_type, safe=False)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                cast = pa.array([None] * data.num_rows, to_type)
            data = data.set_column(data.column_names.index(column), column, cast)
        pq.write_table(data, part)
    return edit


@st.composite
def partition_damage(draw: st.DrawFn) -> Damage:
    table = draw(st.sampled_from(TABLE_FILES))
    name = draw(st.sampled_from(PARTITION_NAMES))
    return lambda run: (run / table / "rank=0").rename(run / table / name)


DAMAGE = st.one_of(manifest_damage(), parquet_damage(), partition_damage())


@settings(derandomize=True, max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(damage=DAMAGE, command=st.sampled_from(READING_COMMANDS))
def test_every_reading_command_succeeds_or_fails_in_one_line(
        small_run: Path, damage: Damage, command: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        parent = Path(scratch)
        run = Path(shutil.copytree(small_run, parent / "damaged"))
        damage(run)
        names = {"RUN": str(run), "BASE": str(small_run), "PARENT": str(parent)}
        argv = [names.get(word, word) for word in command]
        code, stderr = run_command(argv)
        event(f"exit {code}")
        assert_clean(code, stderr, argv)


@pytest.mark.parametrize("command", READING_COMMANDS, ids=" ".join)
def test_the_undamaged_run_reads(small_run: Path, command: tuple[str, ...], tmp_path: Path) -> None:
    # The fuzzing above means something only if the run it damages reads.
    run = Path(shutil.copytree(small_run, tmp_path / "copy"))
    names = {"RUN": str(run), "BASE": str(small_run), "PARENT": str(tmp_path)}
    argv = [names.get(word, word) for word in command]
    code, stderr = run_command(argv)
    assert "Traceback" not in stderr
    # A CPU run without counters has no GPU, kernels or metrics to show: those say so.
    assert code == (2 if command[0] in NEEDS_MORE else 0), (argv, stderr)
