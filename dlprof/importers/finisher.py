"""The finisher: each save of a session made final, in a child process while the program runs.

A save leaves raw material behind: chunk files (the session's own slices, samplers' counters)
and the traces the frameworks' profilers wrote for their cycles. A :class:`SaveJob` names them;
:func:`finish` converts the traces (:mod:`dlprof.importers.kineto_cycle`,
:mod:`dlprof.importers.xplane_cycle`), nests everything together under the slices still open at
the save, and writes the save's final parts (:meth:`dlprof.store.writer.RankWriter.finish_window`)::

    finisher = BackgroundFinisher(on_result=session.saved)
    finisher.submit(job)      # at every save: the child takes jobs one at a time, in order
    finisher.close()          # at the end: this process takes the jobs still waiting, from the
                              # newest, while the child finishes the one in hand

The child is one long-lived process (``python -m dlprof.importers.finisher``: jobs and results
as lines of JSON on its stdin and stdout), started at the first save and at the lowest CPU
priority, so the program keeps its cores; at the end, when the program no longer needs them,
the profiled process works beside it. A job the child cannot finish (it died: out of memory,
killed) is done in this process instead, and nothing is lost. Jobs are independent of each
other, so they may be finished in any order.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pyarrow as pa

from dlprof.importers.kineto_cycle import CycleJob
from dlprof.importers.kineto_cycle import convert_cycle as convert_kineto
from dlprof.importers.xplane_cycle import XPlaneJob
from dlprof.importers.xplane_cycle import convert_cycle as convert_xplane
from dlprof.keys import StoreTable
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

    def to_json(self) -> str:
        return json.dumps({
            "run_dir": str(self.run_dir), "rank": self.rank, "number": self.number,
            "metadata": self.metadata,
            "chunks": {str(table): [str(p) for p in paths] for table, paths in self.chunks.items()},
            "cycles": [{"collector": c.collector, "kind": c.job.KIND, **_plain(c.job)} for c in self.cycles],
            "open_slices": [dataclasses.astuple(s) for s in self.open_slices],
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
        )


def finish(job: SaveJob) -> Result:
    """Convert a save's cycles, nest everything, write its parts, remove what they replace.

    Returns:
        ``number``, ``rows`` per table, ``nesting`` (what nesting changed), ``open_children_ns``
        and ``open_starts_ns`` (per slice still open at the save, the time of its children here
        and where nesting moved its start), ``cycles`` (each
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
    report = writer.finish_window(job.number, job.chunks, rows, _anchors(job.open_slices))
    for cycle in job.cycles:
        for path in cycle.job.inputs():
            path.unlink(missing_ok=True)
    return {
        "number": job.number,
        "rows": report.rows,
        "nesting": report.nesting.as_counts(),
        "open_children_ns": {str(k): v for k, v in report.open_slices.children_ns.items()},
        "open_starts_ns": {str(k): v for k, v in report.open_slices.starts_ns.items()},
        "cycles": cycles,
        "seconds": time.perf_counter() - began,
    }


class BackgroundFinisher:
    """Finishes save jobs in one child process at the lowest priority, in the order given."""

    def __init__(self, on_result: Callable[[Result], None]) -> None:
        """Args:
        on_result: told each job's result, from the finisher's thread or from :meth:`close`.
        """
        self._on_result = on_result
        self._pending: deque[SaveJob] = deque()
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._closing = False
        self._child: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self.child_failures = 0

    def submit(self, job: SaveJob) -> None:
        with self._lock:
            self._pending.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="dlprof-finisher", daemon=True)
                self._thread.start()
        self._wakeup.set()

    def close(self) -> None:
        """Finish every job: the child goes on in order while this process takes the newest."""
        self._closing = True
        self._wakeup.set()
        while True:
            with self._lock:
                job = self._pending.pop() if self._pending else None
            if job is None:
                break
            self._on_result(finish(job))
        if self._thread is not None:
            self._thread.join()
        if self._child is not None:
            self._stop_child()

    def forget(self) -> None:
        """In a forked child: the finisher and its process belong to the parent."""
        self._pending.clear()
        self._thread = None
        self._child = None

    def _run(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            while True:
                with self._lock:
                    job = self._pending.popleft() if self._pending else None
                if job is None:
                    break
                self._on_result(self._in_child(job))
            if self._closing:
                return

    def _in_child(self, job: SaveJob) -> Result:
        try:
            child = self._started_child()
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(job.to_json() + "\n")
            child.stdin.flush()
            result = _read_result(child.stdout)
        except (OSError, ValueError):
            result = None
        if result is None:
            # The child died (out of memory, killed): this job is done here, nothing is lost.
            self.child_failures += 1
            self._stop_child()
            return finish(job)
        return result

    def _started_child(self) -> subprocess.Popen[str]:
        if self._child is None or self._child.poll() is not None:
            package_root = str(Path(__file__).resolve().parents[2])
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
            self._child = subprocess.Popen(
                # -P: the profiled program's working directory must not shadow the child's imports.
                [sys.executable, "-P", "-m", "dlprof.importers.finisher"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )
        return self._child

    def _stop_child(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        try:
            if child.stdin is not None:
                child.stdin.close()
            child.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            child.kill()
            child.wait()


def _read_result(stdout: IO[str]) -> Result | None:
    for line in stdout:
        if line.startswith(_RESULT):
            result: Result = json.loads(line[len(_RESULT):])
            return result
    return None


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


def main() -> int:
    """The child: finish each job read from stdin, print each result, until stdin closes."""
    os.nice(19)
    for line in sys.stdin:
        if line.strip():
            result = finish(SaveJob.from_json(line))
            sys.stdout.write(_RESULT + json.dumps(result) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
