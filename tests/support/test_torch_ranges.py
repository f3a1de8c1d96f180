"""Ranges kept whole across the profiler's cuts, on real torch.profiler recordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlprof.support.torch_ranges import RangeCuts

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
from torch.autograd.profiler import record_function  # noqa: E402
from torch.profiler.profiler import _KinetoProfile  # noqa: E402


def unexpected(where: str, failure: BaseException) -> None:
    raise AssertionError(f"{where} failed") from failure


def recording(cuts: RangeCuts) -> _KinetoProfile:
    profile = _KinetoProfile()
    profile.prepare_trace()
    profile.start_trace()
    cuts.started()
    return profile


def names_in(profile: _KinetoProfile, path: Path) -> list[str]:
    profile.export_chrome_trace(str(path))
    return [e.get("name") for e in json.loads(path.read_text())["traceEvents"]]


def test_a_range_open_at_a_cut_is_in_both_recordings(tmp_path: Path) -> None:
    original = record_function.__exit__
    cuts = RangeCuts(on_failure=unexpected)
    cuts.install()
    try:
        first = recording(cuts)
        outer = record_function("outer")
        outer.__enter__()
        torch.ones(4).sum()
        cuts.stopping()
        first.stop_trace()
        second = recording(cuts)
        torch.ones(4).sum()
        outer.__exit__(None, None, None)
        cuts.stopping()
        second.stop_trace()
        assert names_in(first, tmp_path / "first.json").count("outer") == 1
        assert names_in(second, tmp_path / "second.json").count("outer") == 1, "entered again, ended by the program"
        assert cuts.splits == {"outer": 1}
    finally:
        cuts.uninstall()
    assert record_function.__exit__ is original


def test_a_range_still_open_when_profiling_ends_is_not_ended_twice() -> None:
    original = record_function.__exit__
    cuts = RangeCuts(on_failure=unexpected)
    cuts.install()
    profile = recording(cuts)
    late = record_function("late")
    late.__enter__()
    cuts.stopping()
    profile.stop_trace()
    cuts.uninstall()
    assert record_function.__exit__ is not original, "kept until the ended range exits"
    late.__exit__(None, None, None)  # torch's own exit would end it a second time
    assert record_function.__exit__ is original
    with record_function("after"):  # later ranges are torch's alone
        torch.ones(2).sum()


class FrozenRange(record_function):  # type: ignore[misc]
    """A range of the program's that refuses changes once entered."""

    def __enter__(self) -> FrozenRange:
        super().__enter__()
        object.__setattr__(self, "_frozen", True)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        if getattr(self, "_frozen", False):
            raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name}")
        super().__setattr__(name, value)


def test_a_range_the_wrapper_cannot_mark_exits_without_a_failure_of_dlprofs() -> None:
    """A range ended at the last stop is exited with its callbacks off: a range that refuses that
    change gets no error from dlprof's wrapper (before, its AttributeError reached the program)."""
    original = record_function.__exit__
    told: list[tuple[str, str]] = []
    cuts = RangeCuts(on_failure=lambda where, failure: told.append((where, str(failure))))
    cuts.install()
    profile = recording(cuts)
    frozen = FrozenRange("frozen")
    frozen.__enter__()
    cuts.stopping()
    profile.stop_trace()
    frozen.__exit__(None, None, None)
    cuts.uninstall()
    assert told == [("its record_function wrapper", "FrozenRange is frozen: cannot set run_callbacks_on_exit")]
    assert record_function.__exit__ is original, "torch's own once the range ended"


def test_the_programs_own_range_error_passes_through() -> None:
    # What torch itself raises for a range ended that never began (its words differ by release).
    with pytest.raises(AssertionError) as bare:
        record_function("never entered").__exit__(None, None, None)
    cuts = RangeCuts(on_failure=unexpected)
    cuts.install()
    profile = None
    try:
        profile = recording(cuts)
        with pytest.raises(AssertionError) as wrapped:
            record_function("never entered").__exit__(None, None, None)
        assert str(wrapped.value) == str(bare.value), "the program's error, as torch raised it"
        with pytest.raises(KeyError, match="the program's"), record_function("raising"):
            raise KeyError("the program's")
    finally:
        cuts.stopping()
        if profile is not None:
            profile.stop_trace()  # never left recording: the tests after it would find it busy
        cuts.uninstall()
