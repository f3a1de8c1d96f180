"""Threads named by what ran on them, on runs written from rows."""

from __future__ import annotations

from pathlib import Path

from dlprof.analysis.threads import PROFILER_OVERHEAD, thread_roles
from dlprof.keys import Kind
from tests.builders import op, write_rows_run


def test_a_track_of_the_profilers_own_overhead_is_named_so(tmp_path: Path) -> None:
    """Kineto's overhead category is imported as kind profiler (and was kind overhead before):
    a track holding only such slices is the profiler's overhead, whichever kind it has."""
    run = write_rows_run(tmp_path / "run", [
        op(1, "aten::mm", 0, 100, tid=1),
        op(2, "CUPTI Overhead", 10, 5, tid=2, kind=str(Kind.PROFILER)),
        op(3, "Buffer flush", 20, 5, tid=3, kind="overhead"),
        op(4, "aten::add", 30, 5, tid=4),
        op(5, "dlprof::save", 40, 5, tid=4, kind=str(Kind.PROFILER)),
    ])
    roles = {track[2]: role for track, role in thread_roles(run).items()}
    assert roles.get(2) == PROFILER_OVERHEAD and roles.get(3) == PROFILER_OVERHEAD
    assert roles.get(4) != PROFILER_OVERHEAD, "a thread that ran the program's ops and was paused is not overhead"
