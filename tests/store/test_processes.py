"""Telling whether a process still runs: a killed process not yet reaped has stopped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from dlprof.store.processes import alive


def test_a_running_process_is_alive_and_an_unreaped_dead_one_is_not() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert alive(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        # Not waited for: still in the process table, as a zombie, until it is reaped.
        assert os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
        assert not alive(child.pid)
    finally:
        child.wait()
    assert not alive(child.pid)
