"""The records of a save waiting to be made final, and where they wait in a run directory.

A save of a session leaves raw material behind (chunk files, the frameworks' profiler traces) and
one :class:`SaveJob` naming it; the job waits as a file in ``pending/rank=N/`` until the finisher
(:mod:`dlprof.recording.finisher`) makes it final::

    pending = PendingSaves(run_dir, rank)
    pending.put(job)              # at every save
    job, claimed = pending.claim()  # whoever finishes it first renames it

A run directory travels (users copy it, attach it to bug reports), so a job names its files
relative to the run, and reading one back refuses any path that would resolve outside the
directory it was found in (:class:`SaveJobError`): a moved run finishes into itself, and a
crafted job can neither write nor delete anywhere else.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from dlprof.keys import StoreTable
from dlprof.store import safe_files
from dlprof.store.layout import PENDING
from dlprof.store.processes import alive

# TensorFlow's profiler writes a cycle's XPlane as plugins/profile/<time>/<host>.xplane.pb.
XPLANE_SUFFIX = ".xplane.pb"


class SaveJobError(ValueError):
    """A pending job that cannot be read, or that names a place outside its run."""


@dataclass(frozen=True)
class CycleJob:
    """Where one torch.profiler cycle's trace is and how its rows are placed."""

    KIND: ClassVar[str] = "kineto"

    trace: Path
    rank: int
    cycle: int
    pid: int
    # dlprof-clock epoch ns just before and after the clock marker range, if one was recorded.
    marker_window_ns: tuple[int, int] | None

    def files(self) -> list[Path]:
        """The trace files the conversion reads."""
        return [self.trace]

    def inputs(self) -> list[Path]:
        """The files the conversion consumes (removed once its rows are written)."""
        return [self.trace]


@dataclass(frozen=True)
class XPlaneJob:
    """Where one TensorFlow profiler cycle's XPlane is and how its rows are placed."""

    KIND: ClassVar[str] = "xplane"

    logdir: Path  # what tf.profiler.experimental.start was given
    rank: int
    cycle: int
    pid: int
    # dlprof-clock epoch ns just before and after the clock marker TraceMe, and its thread.
    marker_window_ns: tuple[int, int] | None
    marker_tid: int | None
    keep_from_ns: int | None  # the first recorded step's start: warm-up steps are left out

    def files(self) -> list[Path]:
        """The XPlane files TensorFlow wrote for this cycle (one per host)."""
        return sorted(self.logdir.glob(f"plugins/profile/*/*{XPLANE_SUFFIX}"))

    def inputs(self) -> list[Path]:
        """Nothing is removed: the XPlane files stay for TensorBoard."""
        return []


CYCLE_JOBS: dict[str, type[CycleJob] | type[XPlaneJob]] = {CycleJob.KIND: CycleJob, XPlaneJob.KIND: XPlaneJob}


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
        """The job as JSON, every path relative to the run directory."""
        def relative(path: Path) -> str:
            return str(Path(os.path.relpath(path, self.run_dir)))

        return json.dumps({
            "rank": self.rank, "number": self.number, "metadata": self.metadata,
            "chunks": {str(table): [relative(p) for p in paths] for table, paths in self.chunks.items()},
            "cycles": [{"collector": c.collector, "kind": c.job.KIND, **_plain(c.job, relative)}
                       for c in self.cycles],
            "open_slices": [dataclasses.astuple(s) for s in self.open_slices],
            "open_before": self.open_before,
        })

    @classmethod
    def from_json(cls, text: str, run_dir: Path) -> SaveJob:
        """A job read back from the run it was found in.

        Raises:
            SaveJobError: the text is not a job, or one of its paths leaves ``run_dir``.
        """
        try:
            data = json.loads(text)
            cycles = []
            for item in data["cycles"]:
                job_class = CYCLE_JOBS[item.pop("kind")]
                collector = str(item.pop("collector"))
                cycles.append(Cycle(collector, _rebuild(job_class, item, run_dir)))
            return cls(
                run_dir=run_dir, rank=int(data["rank"]), number=int(data["number"]),
                metadata={str(k): str(v) for k, v in data["metadata"].items()},
                chunks={StoreTable(table): [inside(run_dir, p) for p in paths]
                        for table, paths in data["chunks"].items()},
                cycles=cycles,
                open_slices=[OpenSlice(*row) for row in data["open_slices"]],
                open_before=[int(i) for i in data.get("open_before", [])],
            )
        except SaveJobError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise SaveJobError(f"not a save job ({type(error).__name__}: {error})") from None


def inside(run_dir: Path, stored: object) -> Path:
    """A path stored in a run, made absolute under ``run_dir``.

    Raises:
        SaveJobError: the path is absolute, climbs with ``..``, or (through a link) resolves
            outside the run.
    """
    if not isinstance(stored, str) or not stored:
        raise SaveJobError(f"a path in a save job is not a string: {stored!r}")
    relative = PurePosixPath(stored)
    if relative.is_absolute() or ".." in relative.parts:
        raise SaveJobError(f"a save job names a place outside its run: {stored}")
    path = run_dir / relative
    root = run_dir.resolve()
    if not path.resolve().is_relative_to(root):
        raise SaveJobError(f"a save job names a place outside its run (through a link): {stored}")
    return path


class PendingSaves:
    """Save jobs on disk (``<run>/pending/rank=N/save-NNNNN.json``) until they are finished.

    Whoever finishes a job first claims it by renaming it, so the finisher's child process and
    the profiled process can share the work; a job left behind by processes that were killed is
    still there for ``dlprof finish``.
    """

    def __init__(self, run_dir: Path, rank: int) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.directory = run_dir / PENDING / f"rank={rank}"

    def put(self, job: SaveJob) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"save-{job.number:05d}.json"
        safe_files.write_text(path, job.to_json())

    def claim(self, newest: bool = False) -> tuple[SaveJob, Path] | None:
        """Take one job (the oldest, or the newest) for this process; None when none is left.

        Raises:
            SaveJobError: the job claimed is damaged or names a place outside the run; it stays
                claimed, so it is not taken again.
        """
        jobs = sorted(self.directory.glob("save-*.json")) if self.directory.is_dir() else []
        for path in reversed(jobs) if newest else jobs:
            claimed = path.with_name(f"{path.stem}.claimed-{os.getpid()}")
            try:
                path.rename(claimed)
            except FileNotFoundError:
                continue  # the other process took it first
            if claimed.is_symlink() or not claimed.is_file():
                raise SaveJobError(f"{path.name} is not a file of its own (a link or a directory)")
            return SaveJob.from_json(claimed.read_text(errors="replace"), self.run_dir), claimed
        return None

    def release_dead_claims(self) -> None:
        """Put back the jobs claimed by processes that are gone (a child killed mid-job)."""
        for claimed in self.directory.glob("save-*.claimed-*") if self.directory.is_dir() else ():
            pid_text = claimed.name.rpartition("-")[2]
            if not pid_text.isdigit():
                continue
            pid = int(pid_text)
            if pid != os.getpid() and not alive(pid):
                put_back(claimed)

    def left(self) -> int:
        """Jobs not finished yet."""
        return len(list(self.directory.glob("save-*"))) if self.directory.is_dir() else 0

    def remove_if_empty(self) -> None:
        for directory in (self.directory, self.directory.parent):
            try:
                directory.rmdir()
            except OSError:
                return


def put_back(claimed: Path) -> None:
    """A job claimed (see :meth:`PendingSaves.claim`) and not finished waits again."""
    claimed.rename(claimed.with_name(claimed.name.partition(".claimed-")[0] + ".json"))


def pending_ranks(run_dir: Path) -> list[PendingSaves]:
    """The ranks of a run with saves waiting, each as its :class:`PendingSaves`."""
    root = run_dir / PENDING
    if not root.is_dir() or root.is_symlink():
        return []
    ranks = []
    for directory in sorted(root.glob("rank=*")):
        number = directory.name.partition("=")[2]
        if number.isdigit() and directory.is_dir() and not directory.is_symlink():
            ranks.append(PendingSaves(run_dir, int(number)))
    return ranks


def _plain(job: CycleJob | XPlaneJob, relative: Any) -> dict[str, Any]:
    return {key: relative(value) if isinstance(value, Path) else value
            for key, value in dataclasses.asdict(job).items()}


def _rebuild(job_class: type[CycleJob] | type[XPlaneJob], data: dict[str, Any], run_dir: Path) -> CycleJob | XPlaneJob:
    """A cycle job from its JSON: paths (inside the run) and pairs restored by their annotations."""
    values: dict[str, Any] = {}
    for item in dataclasses.fields(job_class):
        value = data[item.name]
        if value is not None and "Path" in str(item.type):
            value = inside(run_dir, value)
        elif isinstance(value, list):
            value = tuple(value)
        values[item.name] = value
    return job_class(**values)
