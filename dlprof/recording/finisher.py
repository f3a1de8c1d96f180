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
by renaming it. The child is one long-lived process (``python -m dlprof.recording.finisher``),
started at the first save at the lowest CPU priority, so the program keeps its cores; it prints
each result on its stdout. At the end, when the program no longer needs the cores, the
profiled process works beside it. If the profiled process is killed (or ends with
``os._exit``), the child finishes every job waiting and then ends; if both are killed, the jobs
stay on disk for :func:`finish_pending` (``dlprof finish``). A job the child could not finish (it died,
or the job failed: a full disk) is done in the profiled process instead; one that fails there too
stays on disk, its chunks read as they are, and is said once (:attr:`BackgroundFinisher.failures`).
No failure of a job prints a traceback on the program's stderr. Jobs are independent of each
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from dlprof.importers.kineto_cycle import convert_cycle as convert_kineto
from dlprof.importers.xplane_cycle import convert_cycle as convert_xplane
from dlprof.keys import StoreTable
from dlprof.store.pm_samples import attribute_rank
from dlprof.store.safe_files import os_error_text
from dlprof.store.save_jobs import (
    CycleJob,
    OpenSlice,
    PendingSaves,
    SaveJob,
    SaveJobError,
    XPlaneJob,
    pending_ranks,
    put_back,
)
from dlprof.store.writer import RankWriter

Result = dict[str, Any]
# Before each result line the child prints: anything else on its stdout (a library's chatter) is
# not a result.
_RESULT = "dlprof-finished "
_END = "end\n"  # the profiled process has no more jobs (see BackgroundFinisher.close)
# Before the line of a job the child could not finish (it puts the job back and ends).
_FAILED = "dlprof-failed "


class FinishError(Exception):
    """A save cannot be made final; the message is one line naming the save and why."""

# How each kind of profiler cycle a save can hold is converted.
_CONVERTERS: dict[str, Callable[[Any], tuple[dict[StoreTable, list[pa.Table]], Result]]] = {
    CycleJob.KIND: convert_kineto,
    XPlaneJob.KIND: convert_xplane,
}


def finish(job: SaveJob) -> Result:
    """Convert a save's cycles, nest everything, write its parts, remove what they replace.

    Returns:
        ``number``, ``rows`` per table, ``nesting`` (what nesting changed), ``open_children_ns``,
        ``open_starts_ns``, ``open_depths``, ``open_parents`` and ``open_pause_ns`` (per slice
        still open at the save: the time of its children here, where nesting moved its start,
        its depth, its parent and dlprof's pauses inside it here), ``cycles`` (each
        conversion's result, with the ``collector`` it goes to) and ``seconds``.
    """
    began = time.perf_counter()
    rows: dict[StoreTable, list[pa.Table]] = {}
    cycles = []
    for cycle in job.cycles:
        converted, result = _CONVERTERS[cycle.job.KIND](cycle.job)
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
        "open_pause_ns": {str(k): v for k, v in report.open_slices.pause_ns.items()},
        "cycles": cycles,
        "seconds": time.perf_counter() - began,
    }


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
        # Saves that could not be made final, each in words ("save 3: disk full").
        self.failures: list[str] = []

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
        while (taken := self._claim(newest=True)) is not None:
            self._finish_here(*taken)
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            if child.stdin is not None:
                # No more jobs: the child ends once it has finished its own. Said in a line, not
                # only by closing stdin: a forked process that outlives this close (a persistent
                # DataLoader worker) holds a copy of the pipe, and the child would never see its end.
                try:
                    child.stdin.write(_END)
                    child.stdin.flush()
                except (OSError, ValueError):
                    pass  # the child is gone
                try:
                    child.stdin.close()
                except OSError:
                    pass  # the child is gone, and the line it did not take with it
            child.wait()
            if child.returncode != 0:
                self.child_failures += 1
        if self._reader is not None:
            self._reader.join()
        # A child that died mid-job left it claimed: it is finished here.
        self._pending.release_dead_claims()
        while (taken := self._claim()) is not None:
            self._finish_here(*taken)
        self._pending.remove_if_empty()

    def forget(self) -> None:
        """In a forked child: the finisher and its process belong to the parent."""
        self._child = None
        self._reader = None

    def _claim(self, newest: bool = False) -> tuple[SaveJob, Path] | None:
        try:
            return self._pending.claim(newest)
        except (SaveJobError, OSError) as error:  # it stays claimed: not taken again
            self.failures.append(failure_text(error))
            return self._claim(newest)

    def _finish_here(self, job: SaveJob, claimed: Path) -> None:
        try:
            result = finish(job)
        except Exception as error:  # noqa: BLE001  the job stays on disk for dlprof finish
            self.failures.append(f"save {job.number}: {failure_text(error)}")
            return
        self._on_result(result)
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
                [sys.executable, "-P", "-m", "dlprof.recording.finisher",
                 str(self._pending.run_dir), str(self._pending.rank)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
            )
            self._reader = threading.Thread(target=self._read_results, args=(self._child,),
                                             name="dlprof-finisher", daemon=True)
            self._reader.start()
        return self._child

    def _read_results(self, child: subprocess.Popen[str]) -> None:
        # A job the child could not finish (its _FAILED line) is back on disk: close() tries it.
        assert child.stdout is not None
        with child.stdout:  # this thread reads it to its end: closed here, whichever child it is
            for line in child.stdout:
                if line.startswith(_RESULT):
                    self._on_result(json.loads(line[len(_RESULT):]))


def finish_pending(run_dir: Path) -> int:
    """Finish the saves a killed run left on disk (once its processes are gone): ``dlprof finish``.

    Returns:
        How many were finished.

    Raises:
        SaveJobError: a job is damaged or names a place outside the run (it stays claimed).
        FinishError: a job cannot be made final (a chunk or a trace it names is damaged or
            missing, the disk is full); it stays on disk, and those finished before are final.
    """
    finished = 0
    for pending in pending_ranks(run_dir):
        pending.release_dead_claims()
        metadata = None
        while (taken := pending.claim()) is not None:
            job, claimed = taken
            try:
                finish(job)
            except Exception as error:  # noqa: BLE001  a run is input: one line, never a traceback
                put_back(claimed)
                raise FinishError(f"{claimed.name.partition('.')[0]} of rank {job.rank}: {failure_text(error)}") from None
            metadata = job.metadata
            claimed.unlink(missing_ok=True)
            finished += 1
        pending.remove_if_empty()
        if metadata is not None:  # the rank's saves are final: its PM samples go to its kernels
            attribute_rank(run_dir, pending.rank, metadata)
    return finished


def failure_text(error: BaseException) -> str:
    """Why a save could not be made final, in one line."""
    if isinstance(error, OSError):
        return os_error_text(error)
    detail = " ".join(str(error).split())[:300]
    return f"{type(error).__name__}: {detail}" if detail else type(error).__name__


def _anchors(open_slices: list[OpenSlice]) -> pa.Table | None:
    if not open_slices:
        return None
    columns = list(zip(*(dataclasses.astuple(s) for s in open_slices), strict=True))
    names = [f.name for f in dataclasses.fields(OpenSlice)]
    return pa.table(dict(zip(names, columns, strict=True)))


def _finish_waiting(pending: PendingSaves) -> bool:
    """Finish every job waiting; False once one fails (put back for the profiled process)."""
    while (taken := pending.claim()) is not None:
        job, claimed = taken
        try:
            result = finish(job)
        except Exception as error:  # noqa: BLE001  never a traceback on the program's stderr
            put_back(claimed)
            _report(_FAILED + json.dumps({"number": job.number, "error": failure_text(error)}))
            return False
        claimed.unlink(missing_ok=True)
        _report(_RESULT + json.dumps(result))
    return True


def _report(line: str) -> None:
    """A line to the profiled process; once it is gone (killed: the pipe is broken), nothing."""
    try:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    except OSError:
        # The jobs still waiting are finished all the same; the pipe now leads nowhere, so that
        # neither these writes nor the interpreter's last flush can fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: list[str]) -> int:
    """The child: finish the jobs waiting in the directory, oldest first, printing each result;
    wait for more while the profiled process writes a line now and then; finish what is left
    once it says it has no more or its stdin closes (it is done, or it was killed)."""
    os.nice(19)
    pending = PendingSaves(Path(argv[0]), int(argv[1]))
    try:
        while True:
            if not _finish_waiting(pending):
                return 1  # the profiled process finishes the rest at its end, or says why not
            if sys.stdin.readline() in ("", _END):
                break
        if not _finish_waiting(pending):
            return 1
        pending.remove_if_empty()
    except (SaveJobError, OSError) as error:  # a job file damaged, the run removed
        _report(_FAILED + json.dumps({"number": -1, "error": failure_text(error)}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
