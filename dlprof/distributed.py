"""Where this process stands in a distributed job, and the one run directory its ranks share.

A launcher (torchrun, ``dlprof run --nproc``) starts one process per rank and tells each its
rank through the environment. The ranks must agree on one run directory without talking to
each other, so the directory is named, in order of preference, by:

1. ``-o DIR`` on the command line (the same for every rank);
2. the ``DLPROF_RUN_DIR`` variable (``dlprof run --nproc`` sets it for its children);
3. the launcher itself: its run id when torchrun was given one, else its pid and start time,
   which every rank started by that launcher reads alike::

       dlprof-runs/20261122-101500-ddp_train-job4242/

Ranks on several hosts share a directory only through ``-o`` or ``DLPROF_RUN_DIR`` on a shared
filesystem; each writes only its own partition (``slices/rank=N/``) and manifest
(``ranks/N.json``), so they never overwrite each other's files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

RUN_DIR_VARIABLE = "DLPROF_RUN_DIR"


@dataclass(frozen=True)
class RankEnvironment:
    """This process's place in a job, as its launcher described it."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    # torchrun's --rdzv-id; its default, "none", names nothing.
    job_id: str = ""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> RankEnvironment:
        """Read what torchrun (or any launcher following its variables) set.

        Raises:
            ValueError: a variable holds something that is not a rank.
        """
        try:
            world_size = int(environ.get("WORLD_SIZE", "1"))
            rank = int(environ.get("RANK", "0"))
            local_rank = int(environ.get("LOCAL_RANK", str(rank)))
        except ValueError:
            raise ValueError(
                f"RANK={environ.get('RANK')!r}, WORLD_SIZE={environ.get('WORLD_SIZE')!r}: not numbers"
            ) from None
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"RANK={rank} is not a rank of WORLD_SIZE={world_size}")
        job_id = environ.get("TORCHELASTIC_RUN_ID", "")
        return cls(rank, world_size, local_rank, "" if job_id == "none" else job_id)


def shared_run_dir(name: str, parent: Path, environ: Mapping[str, str] = os.environ) -> Path:
    """The run directory every rank of this job names alike (see the module's docstring).

    Args:
        name: the run's name (the script's stem).
        parent: where run directories go when nothing names one.
        environ: the process environment.
    """
    named = environ.get(RUN_DIR_VARIABLE)
    if named:
        return Path(named)
    launcher = psutil.Process(os.getppid())
    started = time.strftime("%Y%m%d-%H%M%S", time.localtime(launcher.create_time()))
    job = RankEnvironment.from_environment(environ).job_id or f"job{launcher.pid}"
    return parent / f"{started}-{name}-{job}"
