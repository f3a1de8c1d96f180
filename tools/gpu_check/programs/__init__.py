"""Programs the checks run: the workloads, and the reference tracers that run a workload alone."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence
from pathlib import Path


def run_as_main(script: Path, args: Sequence[str]) -> int:
    """Run ``script`` as ``__main__`` with ``args``, as ``python script args`` (and ``dlprof run``) would.

    Returns:
        Its exit status: 0 when it returns or exits with 0.
    """
    sys.argv = [str(script), *args]
    sys.path[0] = str(script.resolve().parent)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None:
            return 0
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0
