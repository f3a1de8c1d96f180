"""``dlprof run --nproc N``: start N ranks on this machine with torchrun, all writing one run.

The shortcut for ``torchrun --standalone --nproc_per_node N -m dlprof run ...``: it picks the
run directory first and hands it to every rank through ``DLPROF_RUN_DIR``, so the ranks agree
on it without talking, then waits for the job and reports it as one run.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dlprof.distributed import RUN_DIR_VARIABLE


class LaunchError(Exception):
    """The ranks cannot be started (no torch, say)."""


def launch_ranks(nproc: int, run_dir: Path, dlprof_run_args: Sequence[str]) -> int:
    """Run ``dlprof run ARGS`` as ``nproc`` ranks of one job and wait for them.

    Args:
        nproc: how many ranks to start.
        run_dir: the directory every rank writes into.
        dlprof_run_args: the arguments of ``dlprof run`` each rank gets (options and target).

    Returns:
        torchrun's exit code (non-zero when a rank failed).

    Raises:
        LaunchError: torch is not installed.
    """
    if importlib.util.find_spec("torch") is None:
        raise LaunchError("--nproc starts ranks with torchrun: torch is not installed (pip install 'dlprof[torch]')")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "dlprof", "run", *dlprof_run_args,
    ]
    environment = {**os.environ, RUN_DIR_VARIABLE: str(run_dir.resolve())}
    child = subprocess.Popen(command, env=environment)
    # torchrun forwards SIGINT and SIGTERM to its ranks, which save their part and stop: pass
    # them on and wait for that rather than dying first.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                child.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
