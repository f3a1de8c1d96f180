"""A check that behaves as ``GPU_CHECK_STAND_IN`` says, run by the runner's tests as a real check
process: it finds one part, then passes, hangs, crashes, raises, cannot run, or runs a step that
fails or hangs (the step's own child writing its pid to ``GPU_CHECK_STAND_IN_PID``)."""

from __future__ import annotations

import os
import sys
import time

from tools.gpu_check.checks.harness import CannotRun, Check, main
from tools.gpu_check.report import Part, Status

HANGING_STEP = ("import os, subprocess, sys, time\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                "open(os.environ['GPU_CHECK_STAND_IN_PID'], 'w').write(str(child.pid))\n"
                "time.sleep(600)")


def check(c: Check) -> None:
    behaviour = os.environ["GPU_CHECK_STAND_IN"]
    c.add(Part("a first part", Status.PASSED, "found before anything else"))
    if behaviour == "hang":
        time.sleep(600)
    elif behaviour == "crash":
        os._exit(7)
    elif behaviour == "raise":
        raise ValueError("a bug in the check")
    elif behaviour == "cannot":
        raise CannotRun("a GPU is there", "none here")
    elif behaviour == "step-fails":
        c.run("a step that fails", [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"])
    elif behaviour == "step-hangs":
        c.run("a step that hangs", [sys.executable, "-c", HANGING_STEP], timeout_s=3)


if __name__ == "__main__":
    sys.exit(main(check))
