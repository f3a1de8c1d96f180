"""``run.json``: what a run is, beside the data it holds.

The manifest is rewritten whole (to a temporary name, then renamed) each time it changes, so a
reader always finds either the old or the new one, never a mix.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from dlprof.keys import RunStatus
from dlprof.store.json_types import check_fields
from dlprof.store.safe_files import read_regular, write_text
from dlprof.store.version import SCHEMA_VERSION

MANIFEST_NAME = "run.json"
# In a run of several ranks, each rank's own manifest: ranks/<rank>.json.
RANK_MANIFESTS = "ranks"
# The clock domain, in a rank's manifest, that maps its host clock onto rank 0's.
RANK0_CLOCK = "rank0"


# What each count of nesting's report (store.nesting.NestingReport, the manifest's
# ``normalised``) did to the recorded times, in words (``dlprof info``).
NESTING_CHANGES: dict[str, str] = {
    "clipped_to_parent": "slices ended at their parent's end (durations shortened by the overrun)",
    "moved_past_parent": "slices started at the end of the slice they began late in (start moved later)",
    "extended_over_parent": "slices started earlier to contain the slice they began early in (durations lengthened)",
    "ended_at_open_slice": "slices ended where a step open at a save began inside them (durations shortened)",
    "negative_durations": "slices with a negative duration made zero-length",
    "aligned_to_autograd": "backward layers whose hook-timed start or end was moved to the edge of the autograd node it "
                           "fell in (a few microseconds)",
    "overlapping_on_device": "device slices overlapping the previous one on their stream (times kept as recorded)",
}


@dataclass
class CollectorInfo:
    """One collector as the run used it."""

    name: str
    version: str = ""
    active: bool = True
    # What it could not do here, in words: "no CUDA device: kernels not recorded".
    notes: list[str] = field(default_factory=list)


@dataclass
class ClockDomain:
    """How one source's timestamps were mapped onto epoch nanoseconds."""

    name: str
    method: str
    offset_ns: int = 0
    # The offsets consistent with what was measured; offset_ns is chosen inside them.
    bounds_ns: tuple[int, int] | None = None


@dataclass
class HostInfo:
    """The machine a rank ran on, as TAU records a trial's host."""

    hostname: str = ""
    os: str = ""
    python: str = ""
    cpu_model: str = ""
    cpu_cores: int = 0
    memory_bytes: int = 0

    @classmethod
    def this_machine(cls) -> HostInfo:
        return cls(
            hostname=socket.gethostname(),
            os=f"{platform.system()} {platform.release()}",
            python=platform.python_version(),
            cpu_model=_cpu_model(),
            cpu_cores=os.cpu_count() or 0,
            memory_bytes=psutil.virtual_memory().total,
        )


@dataclass
class Manifest:
    """Everything about a run that is not an event."""

    name: str
    command: list[str]
    status: RunStatus = RunStatus.RUNNING
    schema_version: int = SCHEMA_VERSION
    start_ns: int = 0
    end_ns: int = 0
    exit_code: int | None = None
    error: str = ""
    writer_pid: int = 0
    host: HostInfo = field(default_factory=HostInfo)
    devices: list[dict[str, Any]] = field(default_factory=list)
    collectors: list[CollectorInfo] = field(default_factory=list)
    clocks: list[ClockDomain] = field(default_factory=list)
    ranks: list[int] = field(default_factory=lambda: [0])
    world_size: int = 1
    schedule: str = ""
    # The step open when profiling stopped (ended by the stop, not by a step call), ProfilerStep#N:
    # it holds whatever ran after the loop, so step statistics leave it out. Empty: none was open.
    partial_step: str = ""
    # Rows per table, filled when the run is compacted.
    counts: dict[str, int] = field(default_factory=dict)
    # What normalising the slices changed, e.g. {"clipped_to_parent": 3}.
    normalised: dict[str, int] = field(default_factory=dict)
    # Events an importer dropped as damaged, per reason, e.g. {"ts_missing_or_not_a_number": 2}
    # (see dlprof.importers.damage.Damage).
    dropped: dict[str, int] = field(default_factory=dict)
    # What went wrong while saving the run, in words (the data kept is still readable).
    notes: list[str] = field(default_factory=list)
    # How the run was saved while it went on: saves made (at step boundaries and inside steps),
    # the largest growth of the process's memory between two saves, and what was dropped or
    # throttled because it could not be saved in time (see dlprof.recording.save_policy).
    saving: dict[str, Any] = field(default_factory=dict)
    # Why the recording is not whole, a line each ("torch collector failed: ...", "disk full after
    # step 66: recording stopped"); whatever the program's outcome, a run with any is not complete.
    degraded: list[str] = field(default_factory=list)

    def final_status(self, outcome: RunStatus) -> RunStatus:
        """The status to write for a program that ended with ``outcome``: DEGRADED in place of
        COMPLETE when the recording is not whole (a failed or interrupted program keeps its own)."""
        return RunStatus.DEGRADED if outcome is RunStatus.COMPLETE and self.degraded else outcome

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns) if self.end_ns else 0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        """Build a manifest from parsed JSON, ignoring keys a newer writer may have added.

        Raises:
            JsonTypeError: ``data`` is not an object, or a field of it has the wrong type (the
                message names the field).
        """
        check_fields(data, cls)
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = RunStatus(values.get("status", RunStatus.RUNNING))
        values["host"] = HostInfo(**_known(HostInfo, values.get("host", {})))
        values["collectors"] = [
            CollectorInfo(**_known(CollectorInfo, c)) for c in values.get("collectors", [])
        ]
        clocks = []
        for c in values.get("clocks", []):
            c = _known(ClockDomain, c)
            if c.get("bounds_ns") is not None:
                c["bounds_ns"] = tuple(c["bounds_ns"])
            clocks.append(ClockDomain(**c))
        values["clocks"] = clocks
        return cls(**values)

    def write(self, run_dir: Path, rank: int | None = None) -> None:
        """Write ``run.json``, or with ``rank`` that rank's own manifest (``ranks/<rank>.json``)."""
        path = run_dir / MANIFEST_NAME if rank is None else rank_manifest_path(run_dir, rank)
        write_text(path, self.to_json())

    @classmethod
    def read(cls, run_dir: Path) -> Manifest:
        """``run.json`` of a run (never through a link, nor from a FIFO or a device).

        Raises:
            OSError, ValueError, TypeError, KeyError: it cannot be read as a manifest.
        """
        return cls.from_dict(json.loads(read_regular(run_dir / MANIFEST_NAME)))

    @classmethod
    def read_rank(cls, run_dir: Path, rank: int) -> Manifest:
        """One rank's own manifest in a run of several ranks."""
        return cls.from_dict(json.loads(read_regular(rank_manifest_path(run_dir, rank))))


def rank_manifest_path(run_dir: Path, rank: int) -> Path:
    return run_dir / RANK_MANIFESTS / f"{rank}.json"


def read_rank_manifests(run_dir: Path) -> dict[int, Manifest]:
    """Every rank's own manifest in a run of several ranks (empty for a one-process run).

    Raises:
        OSError, ValueError, TypeError, KeyError: a manifest cannot be read.
    """
    directory = run_dir / RANK_MANIFESTS
    if not directory.is_dir():
        return {}
    found = {}
    for path in directory.glob("*.json"):
        if path.stem.isdigit():
            found[int(path.stem)] = Manifest.read_rank(run_dir, int(path.stem))
    return dict(sorted(found.items()))


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def dropped_text(dropped: dict[str, int]) -> str:
    """Damaged events per reason (a manifest's ``dropped``), on one line:
    ``ts missing or not a number: 2, dur negative: 1``."""
    return ", ".join(f"{reason.replace('_', ' ')}: {count:,}" for reason, count in dropped.items())


def degraded_line(degraded: list[str]) -> str:
    """Why a run is degraded (a manifest's ``degraded``) on one line: the first reason, and how
    many more (``dlprof info`` lists them all); "" for a whole recording."""
    if not degraded:
        return ""
    more = len(degraded) - 1
    return degraded[0] + (f" (and {more} more: dlprof info)" if more else "")
