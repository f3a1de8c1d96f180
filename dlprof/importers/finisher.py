"""The finisher: each save of a session made final, in a child process while the program runs.

A save leaves raw material behind: chunk files (the session's own slices, samplers' counters)
and the traces the frameworks' profilers wrote for their cycles. A :class:`SaveJob` names them;
:func:`finish` converts the traces (:mod:`dlprof.importers.kineto_cycle`,
:mod:`dlprof.importers.xplane_cycle`), nests everything together under the slices still open at
the save, and writes the save's final parts (:meth:`dlprof.store.writer.RankWriter.finish_window`)::

    finisher = BackgroundFinisher(PendingSaves(run_dir, rank), on_result=saver.finished)
    finisher.submit(job)      # at every save: the job waits on disk, the child takes it
    finisher.close()          # at the end: this process takes the newest jobs still waiting
                              # while the child finishes the oldest

Jobs wait as files in the run (``pending/rank=N/``) and whoever finishes one first claims it
by renaming it. The child is one long-lived process (``python -m dlprof.importers.finisher``),
started at the first save at the lowest CPU priority, so the program keeps its cores; it prints
each result on its stdout. At the end, when the program no longer needs the cores, the
profiled process works beside it. If the profiled process is killed (or ends with
``os._exit``), the child finishes every job waiting and then ends; if both are killed, the jobs
stay on disk for :func:`finish_pending`. A job the child could not finish (it died) is done
in the profiled process instead. Jobs are independent of each other, so they may be finished
in any order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from dlprof.importers.kineto_cycle import CycleJob
from dlprof.importers.kineto_cycle import convert_cycle as convert_kineto
from dlprof.importers.xplane_cycle import XPlaneJob
from dlprof.importers.xplane_cycle import convert_cycle as convert_xplane
from dlprof.keys import StoreTable
from dlprof.store import safe_files
from dlprof.store.layout import PENDING
from dlprof.store.processes import alive
from dlprof.store.writer import RankWriter

Result = dict[str, Any]
# Before each result line the child prints: anything else on its stdout (a library's chatter) is
# not a result.
_RESULT = "dlprof-finished "

# The profiler cycles a save can hold, by kind: how to rebuild one from JSON and convert it.
_CYCLES: dict[str, tuple[type[CycleJob] | type[XPlaneJob], Callable[[Any], tuple[dict[StoreTable, list[pa.Table]], Result]]]] = {
    CycleJob.KIND: (CycleJob, convert_kineto),
    XPlaneJob.KIND: (XPlaneJob, convert_xplane),
}


@dataclass(frozen=True)
class Cycle:
    """One profiler cycle of a save, and the collector that wants its conversion's result."""

    collector: str
    job: CycleJob | XPlaneJob


@dataclass(frozen=True)
class OpenSlice:
    """A slice still open when a save was made (see :func:`dlprof.store.nesting.nest_window`)."""

    id: int
    pid: int
    tid: int
    kind: str
    name: str
    start_ns: int


@dataclass(frozen=True)
class SaveJob:
    """What one save of one rank left to make final."""

    run_dir: Path
    rank: int
    number: int  # the save's window number: its parts are part-<number>.parquet
    metadata: dict[str, str]  # for the parts' footers
    chunks: dict[StoreTable, list[Path]] = field(default_factory=dict)
    cycles: list[Cycle] = field(default_factory=list)
    open_slices: list[OpenSlice] = field(default_factory=list)
    # Ids of slices in this save that were still open at earlier saves.
    open_before: list[int] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({
            "run_dir": str(self.run_dir), "rank": self.rank, "number": self.number,
            "metadata": self.metadata,
            "chunks": {str(table): [str(p) for p in paths] for table, paths in self.chunks.items()},
            "cycles": [{"collector": c.collector, "kind": c.job.KIND, **_plain(c.job)} for c in self.cycles],
            "open_slices": [dataclasses.astuple(s) for s in self.open_slices],
            "open_before": self.open_before,
        })

    @classmethod
    def from_json(cls, text: str) -> SaveJob:
        data = json.loads(text)
        cycles = []
        for item in data["cycles"]:
            job_class, _ = _CYCLES[item.pop("kind")]
            collector = item.pop("collector")
            cycles.append(Cycle(collector, _rebuild(job_class, item)))
        return cls(
            run_dir=Path(data["run_dir"]), rank=data["rank"], number=data["number"],
            metadata=data["metadata"],
            chunks={StoreTable(table): [Path(p) for p in paths] for table, paths in data["chunks"].items()},
            cycles=cycles,
            open_slices=[OpenSlice(*row) for row in data["open_slices"]],
            open_before=data.get("open_before", []),
        )


def finish(job: SaveJob) -> Result:
    """Convert a save's cycles, nest everything, write its parts, remove what they replace.

    Returns:
        ``number``, ``rows`` per table, ``nesting`` (what nesting changed), ``open_children_ns``,
        ``open_starts_ns``, ``open_depths`` and ``open_parents`` (per slice still open at the
        save: the time of its children here, where nesting moved its start, its depth and its
        parent here), ``cycles`` (each
        conversion's result, with the ``collector`` it goes to) and ``seconds``.
    """
    began = time.perf_counter()
    rows: dict[StoreTable, list[pa.Table]] = {}
    cycles = []
    for cycle in job.cycles:
        _, convert = _CYCLES[cycle.job.KIND]
        converted, result = convert(cycle.job)
        for table, pieces in converted.items():
            rows.setdefault(table, []).extend(pieces)
        cycles.append({"collector": cycle.collector, **result})
    writer = RankWriter(job.run_dir, job.rank, job.metadata)
    report = writer.finish_window(job.number, job.chunks, rows, _anchors(job.open_slices),
                                  frozenset(job.open_before))
    for cycle in job.cycles:
        for path in cycle.job.inputs():
            path.unlink(missing_ok=True)
    return {
        "number": job.number,
        "rows": report.rows,
        "nesting": report.nesting.as_counts(),
        "open_children_ns": {str(k): v for k, v in report.open_slices.children_ns.items()},
        "open_starts_ns": {str(k): v for k, v in report.open_slices.starts_ns.items()},
        "open_depths": {str(k): v for k, v in report.open_slices.depths.items()},
        "open_parents": {str(k): v for k, v in report.open_slices.parents.items()},
        "cycles": cycles,
        "seconds": time.perf_counter() - began,
    }


class PendingSaves:
    """Save jobs on disk (``<run>/pending/rank=N/save-NNNNN.json``) until they are finished.

    Whoever finishes a job first claims it by renaming it, so the child process and the
    profiled process can share the work; a job left behind by processes that were killed is
    still there for :func:`finish_pending`.
    """

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.directory = run_dir / PENDING / f"rank={rank}"

    def put(self, job: SaveJob) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"save-{job.number:05d}.json"
        safe_files.write_text(path, job.to_json())

    def claim(self, newest: bool = False) -> tuple[SaveJob, Path] | None:
        """Take one job (the oldest, or the newest) for this process; None when none is left."""
        jobs = sorted(self.directory.glob("save-*.json")) if self.directory.is_dir() else []
        for path in reversed(jobs) if newest else jobs:
            claimed = path.with_name(f"{path.stem}.claimed-{os.getpid()}")
            try:
                path.rename(claimed)
            except FileNotFoundError:
                continue  # the other process took it first
            return SaveJob.from_json(claimed.read_text()), claimed
        return None

    def release_dead_claims(self) -> None:
        """Put back the jobs claimed by processes that are gone (a child killed mid-job)."""
        for claimed in self.directory.glob("save-*.claimed-*") if self.directory.is_dir() else ():
            pid = int(claimed.name.rpartition("-")[2])
            if pid != os.getpid() and not alive(pid):
                claimed.rename(claimed.with_name(claimed.name.partition(".claimed-")[0] + ".json"))

    def left(self) -> int:
        """Jobs not finished yet."""
        return len(list(self.directory.glob("save-*"))) if self.directory.is_dir() else 0

    def remove_if_empty(self) -> None:
        for directory in (self.directory, self.directory.parent):
            try:
                directory.rmdir()
            except OSError:
                return


class BackgroundFinisher:
    """Finishes save jobs in one child process at the lowest priority, oldest first."""

    def __init__(self, pending: PendingSaves, on_result: Callable[[Result], None]) -> None:
        """Args:
        pending: where the jobs wait.
        on_result: told each job's result, from the finisher's thread or from :meth:`close`.
        """
        self._pending = pending
        self._on_result = on_result
        self._child: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._lock = threading.Lock()
        self.child_failures = 0

    def submit(self, job: SaveJob) -> None:
        self._pending.put(job)
        with self._lock:
            child = self._started_child()
        try:
            assert child.stdin is not None
            child.stdin.write("\n")  # wake up: a job is waiting
            child.stdin.flush()
        except (OSError, ValueError):
            pass  # the child is gone: the job waits for the next child, or for close()

    def close(self) -> None:
        """Finish every job: the child goes on, oldest first, while this process takes the newest."""
        while (taken := self._pending.claim(newest=True)) is not None:
            self._finish_here(*taken)
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            if child.stdin is not None:
                child.stdin.close()  # no more jobs: the child ends once it has finished its own
            child.wait()
            if child.returncode != 0:
                self.child_failures += 1
        if self._reader is not None:
            self._reader.join()
        # A child that died mid-job left it claimed: it is finished here.
        self._pending.release_dead_claims()
        while (taken := self._pending.claim()) is not None:
            self._finish_here(*taken)
        self._pending.remove_if_empty()

    def forget(self) -> None:
        """In a forked child: the finisher and its process belong to the parent."""
        self._child = None
        self._reader = None

    def _finish_here(self, job: SaveJob, claimed: Path) -> None:
        self._on_result(finish(job))
        claimed.unlink(missing_ok=True)

    def _started_child(self) -> subprocess.Popen[str]:
        if self._child is None or self._child.poll() is not None:
            if self._child is not None:
                self.child_failures += 1
            package_root = str(Path(__file__).resolve().parents[2])
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
            self._child = subprocess.Popen(
                # -P: the profiled program's working directory must not shadow the child's imports.
                [sys.executable, "-P", "-m", "dlprof.importers.finisher", str(self._pending.directory)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )
            self._reader = threading.Thread(target=self._read_results, args=(self._child,),
                                             name="dlprof-finisher", daemon=True)
            self._reader.start()
        return self._child

    def _read_results(self, child: subprocess.Popen[str]) -> None:
        assert child.stdout is not None
        for line in child.stdout:
            if line.startswith(_RESULT):
                self._on_result(json.loads(line[len(_RESULT):]))


def finish_pending(run_dir: Path) -> int:
    """Finish the saves a killed run left on disk (once its processes are gone).

    Returns:
        How many were finished.
    """
    finished = 0
    root = run_dir / PENDING
    for directory in sorted(root.glob("rank=*")) if root.is_dir() else []:
        pending = PendingSaves(run_dir, int(directory.name.partition("=")[2]))
        pending.release_dead_claims()
        while (taken := pending.claim()) is not None:
            finish(taken[0])
            taken[1].unlink(missing_ok=True)
            finished += 1
        pending.remove_if_empty()
    return finished


def _anchors(open_slices: list[OpenSlice]) -> pa.Table | None:
    if not open_slices:
        return None
    columns = list(zip(*(dataclasses.astuple(s) for s in open_slices), strict=True))
    names = [f.name for f in dataclasses.fields(OpenSlice)]
    return pa.table(dict(zip(names, columns, strict=True)))


def _plain(job: CycleJob | XPlaneJob) -> dict[str, Any]:
    return {key: str(value) if isinstance(value, Path) else value for key, value in dataclasses.asdict(job).items()}


def _rebuild(job_class: type[CycleJob] | type[XPlaneJob], data: dict[str, Any]) -> CycleJob | XPlaneJob:
    """A cycle job from its JSON: paths and pairs restored by their annotations."""
    values: dict[str, Any] = {}
    for item in dataclasses.fields(job_class):
        value = data[item.name]
        if value is not None and "Path" in str(item.type):
            value = Path(value)
        elif isinstance(value, list):
            value = tuple(value)
        values[item.name] = value
    return job_class(**values)


def _finish_waiting(pending: PendingSaves) -> None:
    while (taken := pending.claim()) is not None:
        result = finish(taken[0])
        taken[1].unlink(missing_ok=True)
        sys.stdout.write(_RESULT + json.dumps(result) + "\n")
        sys.stdout.flush()


def main(argv: list[str]) -> int:
    """The child: finish the jobs waiting in the directory, oldest first, printing each result;
    wait for more while the profiled process writes a line now and then; finish what is left
    once it closes stdin (it is done, or it was killed)."""
    os.nice(19)
    directory = Path(argv[0])
    pending = PendingSaves(directory.parent.parent, int(directory.name.partition("=")[2]))
    while True:
        _finish_waiting(pending)
        if not sys.stdin.readline():
            break
    _finish_waiting(pending)
    pending.remove_if_empty()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
