"""store.scan: a rank's slices handed out in track order across windows, however saves cut them."""

from __future__ import annotations

import time
from pathlib import Path

import dlprof
from dlprof.config import ProfileConfig
from dlprof.keys import StoreTable
from dlprof.recording.session import Session
from dlprof.store import scan
from dlprof.store.layout import rank_dir, rank_files


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def _saved_inside_steps(out: Path) -> Path:
    """Steps and regions open at saves: their rows come with later windows than their children."""
    config = ProfileConfig(out=out, collectors=(), flush_steps=100)
    with Session(config) as session:
        for step in range(4):
            with dlprof.region("body"):
                for piece in range(3):
                    with dlprof.region("work"):
                        _spin(500_000)
                    if piece == 1 and step % 2 == 0:
                        session._save(within_step=True)  # what a save by time does inside a step
            session.step()
    return out


def test_slices_open_at_saves_come_in_the_window_they_began_in(tmp_path: Path) -> None:
    run_dir = _saved_inside_steps(tmp_path / "run")
    assert len(rank_files(rank_dir(run_dir, StoreTable.SLICES, 0)).parts) >= 3
    run = dlprof.load(run_dir)
    columns = ["id", "pid", "tid", "device", "start_ns", "depth"]
    scanned = [row for batch in scan.scan(run, StoreTable.SLICES, 0, columns, batch_rows=4)
               for row in batch.to_pylist()]
    # Every slice once, in the columns asked for.
    assert sorted(row["id"] for row in scanned) == sorted(run.slices.id.tolist())
    assert all(list(row) == columns for row in scanned)
    # On each track, starts never go back (outer before inner at one start): what a Perfetto
    # track's begin and end events need. Before, a step saved inside came after its children.
    last: dict[tuple[int, int, str], tuple[int, int]] = {}
    for row in scanned:
        track = (row["pid"], row["tid"], row["device"])
        key = (row["start_ns"], row["depth"])
        assert key >= last.get(track, (0, 0)), f"time runs back on {track}"
        last[track] = key
