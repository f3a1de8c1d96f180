"""PyTorch CUDA memory snapshots imported into a run: the rows, the totals, the peak and what was
live at it, and pickles that are not snapshots (or try to run code) refused with one line.

No GPU is needed: ``tests/data/memory-snapshot/snapshot.pickle`` is :func:`documented_snapshot`
pickled, a hand-built snapshot of the shape ``torch.cuda.memory._snapshot()`` documents.
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path
from typing import Any

import pytest

import dlprof
from dlprof.analysis.memory import MemoryGroup, live_at_peak, memory_peaks
from dlprof.cli.main import main
from dlprof.importers.memory_snapshot import SnapshotError, convert_snapshot, read_snapshot
from dlprof.importers.trace_file import TraceImportError, import_traces

SNAPSHOT = Path(__file__).resolve().parent.parent / "data" / "memory-snapshot" / "snapshot.pickle"
KiB, MiB = 1 << 10, 1 << 20
SEGMENT, OLD_SEGMENT = 0x7F00_0000_0000, 0x7F00_1000_0000  # addresses of the two segments on cuda:0
T0 = 1_763_000_000_000_000  # epoch microseconds of the first entry
FRAMES = [{"filename": "train.py", "line": 12, "name": "forward"}]


def entry(action: str, addr: int, size: int, time_us: int, **more: Any) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us, "frames": FRAMES, **more}


def documented_snapshot() -> dict[str, Any]:
    """Two devices. On cuda:0 a block of 256 KiB allocated before the history began (in a segment
    the history never saw reserved) stays live throughout; A (1 MiB) and B (512 KiB) are
    allocated, A is freed and its address reused by C (768 KiB) in the same microsecond, then B
    is freed. The peak (1.75 MiB) is at B's allocation, with A and B live and the old block
    untraced. cuda:1's entries carry categories, as torch.profiler's memory profile writes them."""
    a, b = SEGMENT, SEGMENT + MiB
    device0 = [
        entry("segment_alloc", SEGMENT, 2 * MiB, T0),
        entry("alloc", a, MiB, T0 + 10),
        entry("alloc", b, 512 * KiB, T0 + 20),
        entry("free_requested", a, MiB, T0 + 30),
        entry("free_completed", a, MiB, T0 + 40),
        entry("alloc", a, 768 * KiB, T0 + 40),
        {"action": "oom", "size": 8 * MiB, "device_free": MiB, "stream": 0, "time_us": T0 + 45, "frames": []},
        entry("snapshot", 0, 0, T0 + 50),
        entry("free_requested", b, 512 * KiB, T0 + 60),
        entry("free_completed", b, 512 * KiB, T0 + 60),
    ]
    device1 = [
        entry("alloc", 0x7E00_0000_0000, 4 * MiB, T0 + 5, category="parameter"),
        entry("alloc", 0x7E00_0040_0000, MiB, T0 + 15, category="activation"),
        entry("free_completed", 0x7E00_0040_0000, MiB, T0 + 25, category="activation"),
    ]
    segments = [
        {"device": 0, "address": SEGMENT, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 768 * KiB, "active_size": 768 * KiB,
         "blocks": [{"size": 768 * KiB, "requested_size": 700 * KiB, "address": a, "state": "active_allocated",
                     "frames": FRAMES},
                    {"size": 1280 * KiB, "requested_size": 0, "address": a + 768 * KiB, "state": "inactive",
                     "frames": []}]},
        {"device": 0, "address": OLD_SEGMENT, "total_size": 2 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 256 * KiB, "active_size": 256 * KiB,
         "blocks": [{"size": 256 * KiB, "requested_size": 256 * KiB, "address": OLD_SEGMENT,
                     "state": "active_allocated", "frames": []},
                    {"size": 1792 * KiB, "requested_size": 0, "address": OLD_SEGMENT + 256 * KiB,
                     "state": "inactive", "frames": []}]},
        {"device": 1, "address": 0x7E00_0000_0000, "total_size": 8 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "allocated_size": 4 * MiB, "active_size": 4 * MiB,
         "blocks": [{"size": 4 * MiB, "requested_size": 4 * MiB, "address": 0x7E00_0000_0000,
                     "state": "active_allocated", "frames": FRAMES}]},
    ]
    return {"segments": segments, "device_traces": [device0, device1]}


@pytest.fixture(scope="module")
def snapshot_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("snapshot") / "run"
    import_traces([SNAPSHOT], out)
    return out


def test_the_stored_snapshot_is_the_documented_one() -> None:
    assert read_snapshot(SNAPSHOT.read_bytes()) == documented_snapshot()


def test_rows_and_totals(snapshot_run: Path) -> None:
    run = dlprof.load(snapshot_run)
    memory = run.memory.sort_values(["device", "ts_ns"]).reset_index(drop=True)
    zero = memory[memory["device"] == "cuda:0"]
    assert list(zero["bytes"]) == [MiB, 512 * KiB, -MiB, 768 * KiB, -512 * KiB]
    # From the 256 KiB allocated before the history: its running total, as the allocator's own.
    assert list(zero["total_allocated"]) == [1280 * KiB, 1792 * KiB, 768 * KiB, 1536 * KiB, 1024 * KiB]
    # Both segments: the one reserved before the history and the one the history reserved.
    assert set(zero["total_reserved"]) == {4 * MiB}
    # Epoch nanoseconds; the free and the reuse in one microsecond keep their order.
    assert list(zero["ts_ns"]) == [(T0 + 10) * 1000, (T0 + 20) * 1000, (T0 + 40) * 1000, (T0 + 40) * 1000 + 1,
                                   (T0 + 60) * 1000]
    one = memory[memory["device"] == "cuda:1"]
    assert list(one["category"]) == ["parameter", "activation", "activation"]
    notes = " ".join(note for collector in run.manifest.collectors for note in collector.notes)
    for skipped in ("2 free_requested", "1 oom", "1 snapshot"):
        assert skipped in notes


def test_peak_and_live_blocks(snapshot_run: Path) -> None:
    run = dlprof.load(snapshot_run)
    peaks = memory_peaks(run).set_index("device")
    zero = peaks.loc["cuda:0"]
    assert zero["peak_bytes"] == 1792 * KiB and zero["peak_ns"] == (T0 + 20) * 1000
    assert zero["live_bytes"] == MiB + 512 * KiB and zero["live_blocks"] == 2
    assert zero["untraced_bytes"] == 256 * KiB and zero["reserved_peak_bytes"] == 4 * MiB
    assert peaks.loc["cuda:1", "peak_bytes"] == 5 * MiB
    categories = live_at_peak(run, MemoryGroup.CATEGORY, device="cuda:1")
    assert dict(zip(categories["category"], categories["bytes"], strict=True)) == {"parameter": 4 * MiB,
                                                                                   "activation": MiB}
    assert set(categories["basis"]) == {"recorded"}


def test_the_command_answers_on_a_snapshot(snapshot_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(snapshot_run), "--device", "cuda:0"]) == 0
    out = capsys.readouterr().out
    assert "1.75" in out and "(no op recorded)" in out and "Untraced" in out


def test_gzip_snapshot(tmp_path: Path) -> None:
    packed = tmp_path / "snapshot.pickle.gz"
    packed.write_bytes(gzip.compress(SNAPSHOT.read_bytes()))
    import_traces([packed], tmp_path / "run")
    assert len(dlprof.load(tmp_path / "run").memory) == 8


class RunsCode:
    """What a hostile pickle holds: unpickling it calls a function of the file's choosing."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize(("value", "message"), [
    ("hostile", "refusing to load posix.system"),
    ([1, 2, 3], "not a PyTorch memory snapshot"),
    ({"segments": [], "device_traces": [[]]}, "without allocator history"),
])
def test_refused_with_one_line(value: Any, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "ran"
    path = tmp_path / "bad.pickle"
    path.write_bytes(pickle.dumps(RunsCode(marker) if value == "hostile" else value))
    assert main(["import", str(path), "-o", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlprof: error: ") and message in err and err.count("\n") == 1
    assert not marker.exists() and not (tmp_path / "run").exists()


def test_truncated_pickle() -> None:
    with pytest.raises(SnapshotError, match="not a readable memory snapshot"):
        read_snapshot(SNAPSHOT.read_bytes()[:100])
    with pytest.raises(SnapshotError, match="without allocator history"):
        convert_snapshot({"segments": documented_snapshot()["segments"]})
    with pytest.raises(TraceImportError, match="no such file"):
        import_traces([SNAPSHOT.with_name("missing.pickle")], Path("unused"))
