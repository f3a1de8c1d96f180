"""Run directories damaged at random: no traceback, one line, nothing written or removed outside.

A killed run with a save waiting (a session chunk, a torch.profiler cycle's trace, the save's
job) and a part already final is built once; each example copies it beside a directory of
someone else's files, damages the copy (a file removed, truncated, made a directory or a FIFO,
replaced by a link out of the run, a path in the waiting save rewritten) and runs one command
in-process. The command must exit 0, or 1 or 2 with one ``dlprof: error:`` line (beside it, at
most the note that saves wait to be made final); and everything outside the run is as it was,
byte for byte.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dlprof.cli.main import main
from dlprof.keys import StoreTable
from dlprof.store.writer import RankWriter
from tests.builders import slice_table, write_killed_run

# Commands on the damaged run (RUN) or on the directory holding it (PARENT); finish, the one that
# writes to a run, twice as often.
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("info", "RUN"), ("top", "RUN"), ("finish", "RUN"), ("finish", "RUN"), ("export", "RUN"), ("steps", "RUN"),
    ("ls", "--dir", "PARENT"),
)
JOB = "pending/rank=0/save-00000.json"
# Paths a rewritten job may name: out of the run, into it, nonsense.
STORED_PATHS = ("/etc/passwd", "../victims/data.txt", "../victims", "..", ".", "", "run.json",
                "slices/rank=0/part-00005.parquet", "kineto/../../victims/data.txt", 7, None, ["a"])
Damage = Callable[[Path, Path], None]  # (run, victims)


@pytest.fixture(scope="module")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = write_killed_run(tmp_path_factory.mktemp("fuzz") / "run")
    writer = RankWriter(run, 0)
    writer.write_chunk(StoreTable.SLICES, slice_table([(9, 7, "op", "aten::mm", 2000, 300)]), "earlier")
    writer.finish_window(5, writer.take_written())
    return run


def entries(run: Path) -> list[str]:
    """Every file and directory of a run, relative to it, in a stable order."""
    return sorted(str(p.relative_to(run)) for p in run.rglob("*"))


@st.composite
def damage(draw: st.DrawFn) -> Damage:
    how = draw(st.sampled_from(("remove", "truncate", "retype", "fifo", "relink", "rewrite")))
    pick = draw(st.integers(0, 1000))
    fraction = draw(st.floats(0, 1))
    field = draw(st.sampled_from(("chunk", "trace", "rank", "number", "cycles")))
    stored = draw(st.sampled_from(STORED_PATHS))
    target = draw(st.sampled_from(("file", "directory", "nothing", "loop")))

    def apply(run: Path, victims: Path) -> None:
        if how == "rewrite":
            if not (run / JOB).is_file():
                return  # removed or retyped by an earlier damage
            try:
                job = json.loads((run / JOB).read_text())
                if field == "chunk":
                    job["chunks"]["slices"] = [stored]
                elif field == "trace":
                    job["cycles"][0]["trace"] = stored
                elif field == "cycles":
                    job["cycles"] = stored
                else:
                    job[field] = stored
            except (ValueError, TypeError, KeyError, IndexError):
                return  # an earlier damage left no such field to rewrite
            (run / JOB).write_text(json.dumps(job))
            event(f"rewrite {field}")
            return
        names = entries(run)
        path = run / names[pick % len(names)]
        event(f"{how} {path.relative_to(run).parts[0]}")
        if how == "truncate" and path.is_file():
            path.write_bytes(path.read_bytes()[: int(path.stat().st_size * fraction)])
            return
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        if how == "retype":
            path.mkdir() if "." in path.name else path.write_bytes(b"PAR1 not a directory")
        elif how == "fifo":
            os.mkfifo(path)
        elif how == "relink":
            aim = {"file": victims / "data.txt", "directory": victims, "nothing": victims / "missing",
                   "loop": path}[target]
            path.symlink_to(aim)

    return apply


def snapshot(root: Path, leave_out: Path) -> dict[str, tuple[str, bytes | str]]:
    found: dict[str, tuple[str, bytes | str]] = {}
    for directory, subdirectories, files in os.walk(root):
        for name in [*subdirectories, *files]:
            entry = Path(directory) / name
            if entry.is_relative_to(leave_out):
                continue
            if entry.is_symlink():
                found[str(entry)] = ("link", os.readlink(entry))
            elif entry.is_dir():
                found[str(entry)] = ("directory", "")
            else:
                found[str(entry)] = ("file", entry.read_bytes())
    return found


@contextlib.contextmanager
def no_hang(seconds: int) -> Iterator[None]:
    """A command blocked for ever (a FIFO opened for reading) fails the example instead."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"the command did not end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@settings(derandomize=True, max_examples=70, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(damages=st.lists(damage(), min_size=1, max_size=2), command=st.sampled_from(COMMANDS))
def test_a_damaged_run_is_read_in_one_line_and_nothing_outside_it_changes(
        base_run: Path, damages: list[Damage], command: tuple[str, ...]) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        parent = Path(scratch)
        victims = parent / "victims"
        victims.mkdir()
        (victims / "data.txt").write_text("someone else's")
        (victims / "part-00000.parquet").write_bytes(b"not yours")
        run = Path(shutil.copytree(base_run, parent / "run", symlinks=True))
        for apply in damages:
            apply(run, victims)
        before = snapshot(parent, leave_out=run)
        argv = [{"RUN": str(run), "PARENT": str(parent)}.get(word, word) for word in command]
        out, err = io.StringIO(), io.StringIO()
        with no_hang(60), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
        event(f"{command[0]} exit {code}")
        stderr = err.getvalue()
        assert "Traceback" not in stderr, (argv, stderr)
        lines = stderr.strip().splitlines()
        errors = [line for line in lines if line.startswith("dlprof: error: ")]
        assert code in (0, 1, 2), (argv, code, stderr)
        # A failure is one error line; beside it at most the note that saves wait to be made final.
        assert len(errors) == (code != 0) and len(lines) <= 2, (argv, stderr)
        assert all(line.startswith("dlprof: ") for line in lines), (argv, stderr)
        assert snapshot(parent, leave_out=run) == before, f"{argv} changed something outside the run"
