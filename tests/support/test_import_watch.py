"""Import watches on real imports of real modules: the import is the program's, the callback
dlprof's. What the program's module or finders raise reaches it as without the watch; what the
callback raises never reaches the program's import statement."""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import dlprof
from dlprof.support.import_watch import when_imported

DLPROF_DIR = str(Path(dlprof.__file__).parent)


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for the test's modules, each forgotten afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def raised_by_import(name: str) -> tuple[BaseException, list[tuple[str, str]]]:
    """What importing ``name`` raises, and its traceback's frames outside importlib's."""
    try:
        importlib.import_module(name)
    except Exception as error:  # whatever the program's module raises
        sys.modules.pop(name, None)
        frames = traceback.extract_tb(error.__traceback__)
        return error, [(f.filename, f.name) for f in frames if "importlib" not in f.filename]
    raise AssertionError(f"importing {name} did not raise")


def test_a_callback_that_fails_never_fails_the_programs_import(modules: Path) -> None:
    """Before, the callback's exception was raised from the program's import statement."""
    (modules / "watched_ok.py").write_text("value = 42\n")
    told: list[tuple[str, str]] = []

    def start_collectors(module: ModuleType) -> None:
        raise RuntimeError(f"cannot start after {module.__name__}")

    watch = when_imported("watched_ok", start_collectors,
                          on_failure=lambda name, failure: told.append((name, str(failure))))
    module: Any = importlib.import_module("watched_ok")
    assert module.value == 42
    assert told == [("watched_ok", "cannot start after watched_ok")]
    assert watch not in sys.meta_path


def test_the_default_says_a_callbacks_failure_in_one_line(modules: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (modules / "watched_said.py").write_text("value = 1\n")

    def fail(module: ModuleType) -> None:
        raise ValueError("\x1b]0;title\x07")

    when_imported("watched_said", fail)
    importlib.import_module("watched_said")
    assert capsys.readouterr().err == "dlprof: after the import of watched_said: ValueError: \u241b]0;title\u2407\n"


def test_the_programs_module_raises_as_without_the_watch(modules: Path) -> None:
    (modules / "broken_alone.py").write_text("x = 1\nraise KeyError('missing setting')\n")
    (modules / "broken_watched.py").write_text("x = 1\nraise KeyError('missing setting')\n")
    alone, alone_frames = raised_by_import("broken_alone")
    watch = when_imported("broken_watched", lambda module: None)
    watched, watched_frames = raised_by_import("broken_watched")
    watch.cancel()
    assert type(watched) is KeyError and str(watched) == str(alone)
    assert alone_frames == [(__file__, "raised_by_import"), (str(modules / "broken_alone.py"), "<module>")]
    # Only the watch's loader stands between importlib and the module.
    assert [frame for frame in watched_frames if DLPROF_DIR not in frame[0]] == [
        (__file__, "raised_by_import"), (str(modules / "broken_watched.py"), "<module>")]


class RefusingFinder:
    """A finder of the program's that refuses one name, as an import hook does."""

    @staticmethod
    def find_spec(fullname: str, path: Any, target: Any = None) -> None:
        if fullname == "refused_here":
            raise ImportError(f"{fullname} is refused by the program's import hook")


def test_the_programs_finder_raises_from_its_own_frame(modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the watch asked the program's finders itself, and their error came through it."""
    monkeypatch.setattr(sys, "meta_path", [RefusingFinder, *sys.meta_path])
    watch = when_imported("refused_here", lambda module: None)
    error, frames = raised_by_import("refused_here")
    watch.cancel()
    assert type(error) is ImportError and str(error) == "refused_here is refused by the program's import hook"
    assert not [frame for frame in frames if DLPROF_DIR in frame[0]], frames
