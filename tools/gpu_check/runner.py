"""Run one check in a process of its own, with a time limit, and read what it found.

    result = run_check(spec, python, work, timeout_s=240, env=env)

The check runs in its own session; at its limit the whole session (the check, the dlprof runs
and reference programs it started) is killed, and the parts it had written are kept beside one
saying it ran out of time. A check that crashes before writing anything is reported with the
end of its output. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tools.gpu_check.checks import CheckSpec
from tools.gpu_check.report import CheckResult, Part, Status

ROOT = Path(__file__).resolve().parents[2]
CHECK_LOG_NAME = "check.log"
_TAIL_BYTES = 1500


def _tail(path: Path) -> str:
    """The end of a log, on one line."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - _TAIL_BYTES))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    return " / ".join(line.strip() for line in text.splitlines()[-6:] if line.strip())


def _parts(result: Path) -> tuple[list[Part], bool]:
    """The parts a check wrote, and whether it says it ran to its end."""
    try:
        data = json.loads(result.read_text())
        return [Part.from_json(p) for p in data["parts"]], bool(data.get("complete"))
    except (OSError, ValueError, KeyError, TypeError):
        return [], False


def run_check(spec: CheckSpec, python: str, work: Path, timeout_s: float, env: dict[str, str],
              out: Path | None = None) -> CheckResult:
    """Run ``spec``'s module with ``python``, at most ``timeout_s`` seconds.

    Args:
        spec: the check.
        python: the interpreter the checks run in.
        work: the directory of all checks; this one works in ``work/<name>/``.
        timeout_s: its limit; the check is told a little less, so that it can write its result.
        env: the whole environment of the check's process.
        out: the report's directory, where a check leaves files to bring back.

    Returns:
        Its result: its parts, plus one for a time-out or a crash.
    """
    directory = work / spec.name
    directory.mkdir(parents=True, exist_ok=True)
    result, log_path = directory / "result.json", directory / CHECK_LOG_NAME
    command = [python, "-m", spec.module, "--work", str(directory), "--result", str(result),
               "--seconds", f"{max(timeout_s - 10, 1):.0f}", *(["--out", str(out)] if out is not None else [])]
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    seconds = time.monotonic() - started
    parts, complete = _parts(result)
    if code is None:
        parts.append(Part("the check finished in time", Status.COULD_NOT_RUN,
                          f"killed after {timeout_s:.0f} s with everything it started; last output: "
                          f"{_tail(log_path)}"))
    elif code != 0:
        parts.append(Part("the check ran to its end", Status.COULD_NOT_RUN,
                          f"its process exited {code}; last output: {_tail(log_path)}"))
    elif complete:
        return CheckResult.of(spec.name, spec.title, parts, seconds, spec.covers)
    if not parts:
        parts.append(Part("the check ran to its end", Status.COULD_NOT_RUN,
                          f"it wrote no result; last output: {_tail(log_path)}"))
    # A check cut short has not passed, whatever it had found so far.
    status = Status.FAILED if any(p.status is Status.FAILED for p in parts) else Status.COULD_NOT_RUN
    return CheckResult(spec.name, spec.title, status, parts[-1].detail, tuple(parts), seconds, spec.covers)
