"""What every check process shares: its options, its steps run as subprocesses with time limits,
and its result file, written again after every part so that a check killed at its limit keeps
what it found::

    def check(c: Check) -> None:
        run = c.dlprof_run("dlprof run --collectors cupti", "run", "cupti", [PROGRAM])
        c.add(compare_calls(...))

    if __name__ == "__main__":
        sys.exit(main(check))

A check that cannot run here (no CUDA device for torch, counters restricted) raises
:class:`CannotRun`; a step that fails (dlprof exits non-zero, or hangs) raises :class:`StepFailed`;
either ends the check with one more part saying so, after the parts already found. The result
says whether the check ran to its end (``complete``): one cut short has not passed, whatever it
had found by then.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dlprof
from dlprof.store.reader import Run, RunError
from tools.gpu_check.report import Part, Status

ROOT = Path(__file__).resolve().parents[3]
PROGRAMS = ROOT / "tools" / "gpu_check" / "programs"
_TAIL_LINES = 8
_SPARE_S = 3.0  # kept back from a step's limit to write the result


class CannotRun(Exception):
    """The check cannot be judged on this machine."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(why)
        self.what, self.why = what, why


class StepFailed(Exception):
    """A step of the check (a dlprof command, the reference) failed or did not finish."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(detail)
        self.what, self.detail = what, detail


def tail(text: str, lines: int = _TAIL_LINES) -> str:
    """The last non-empty lines of a program's output, joined for one line of a report."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " / ".join(kept)


@dataclass
class Check:
    """One check process: where it works, until when, and the parts found so far."""

    work: Path  # this check's own directory
    result: Path  # where the parts are written (JSON)
    deadline: float  # time.monotonic() by which the check must have written its result
    parts: list[Part] = field(default_factory=list)
    complete: bool = False  # whether the check ran to its end
    out: Path | None = None  # the report's directory, where files to bring back go

    @property
    def all_work(self) -> Path:
        """The directory of every check's work (another check's runs are read from there)."""
        return self.work.parent

    def add(self, part: Part) -> None:
        """Keep a part and write the result file again."""
        self.parts.append(part)
        print(f"[{part.status}] {part.what}: {part.detail}", file=sys.stderr, flush=True)
        self.write()

    def write(self) -> None:
        partial = self.result.with_name(self.result.name + ".partial")
        partial.write_text(json.dumps({"parts": [p.to_json() for p in self.parts], "complete": self.complete},
                                      indent=1))
        partial.replace(self.result)

    def seconds_left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, what: str, argv: Sequence[str], timeout_s: float | None = None,
            allow_failure: bool = False, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run one step as a subprocess of its own session, killed with its children at its limit.

        Args:
            what: the step, as the report names it ("dlprof run --collectors cupti").
            argv: the command.
            timeout_s: its limit; never past the check's own deadline.
            allow_failure: return a non-zero exit instead of raising :class:`StepFailed`.
            env: variables added to this process's environment.

        Raises:
            StepFailed: it exited non-zero (unless allowed) or did not finish in time.
            CannotRun: no time is left to start it.
        """
        limit = self.seconds_left() - _SPARE_S
        if timeout_s is not None:
            limit = min(limit, timeout_s)
        if limit <= 1:
            raise CannotRun(what, "the check's time ran out before this step")
        print(f"$ {shlex.join(argv)}", file=sys.stderr, flush=True)
        started = time.monotonic()
        process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True, env={**os.environ, **(env or {})})
        try:
            out, err = process.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            _echo(out, err)
            raise StepFailed(what, f"did not finish in {limit:.0f} s (killed); last output: {tail(err or out)}") from None
        _echo(out, err)
        print(f"  exit {process.returncode} after {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)
        if process.returncode != 0 and not allow_failure:
            raise StepFailed(what, f"exited {process.returncode}: {tail(err or out)}")
        return subprocess.CompletedProcess(list(argv), process.returncode, out, err)

    def python(self, what: str, args: Sequence[str], **options: Any) -> subprocess.CompletedProcess[str]:
        """Run this Python (the one the checks run in) with ``args``."""
        return self.run(what, [sys.executable, *args], **options)

    def dlprof_run(self, what: str, name: str, collectors: str | None, program: Sequence[str],
                   options: Iterable[str] = ()) -> Path:
        """``dlprof run -o WORK/name [--collectors ...] PROGRAM``, as a user runs it; the run's path."""
        out = self.work / name
        chosen = ["--collectors", collectors] if collectors else []
        self.python(what, ["-m", "dlprof", "run", "-o", str(out), "--top", "0", *chosen, *options, *program])
        return out

    def load(self, path: Path) -> Run:
        """``dlprof.load(path)``; a run that cannot be read fails the check."""
        try:
            return dlprof.load(path)
        except RunError as error:
            raise StepFailed("dlprof.load reads the run", str(error)) from None


def _echo(out: str, err: str) -> None:
    """A step's output into this check's log (the orchestrator keeps it)."""
    if out:
        print(out, file=sys.stderr, end="" if out.endswith("\n") else "\n")
    if err:
        print(err, file=sys.stderr, end="" if err.endswith("\n") else "\n")
    sys.stderr.flush()


def main(check: Callable[[Check], None], argv: Sequence[str] | None = None) -> int:
    """Run one check and write its parts; the exit status is 0 whenever the result was written."""
    parser = argparse.ArgumentParser(description="one of dlprof's GPU checks (see tools/gpu_check)")
    parser.add_argument("--work", type=Path, required=True, help="this check's own directory")
    parser.add_argument("--result", type=Path, required=True, help="where to write the parts (JSON)")
    parser.add_argument("--seconds", type=float, required=True, help="time allowed")
    parser.add_argument("--out", type=Path, default=None, help="the report's directory (files brought back)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    state = Check(args.work, args.result, time.monotonic() + args.seconds, out=args.out)
    try:
        check(state)
        state.complete = True
    except CannotRun as error:
        state.add(Part(error.what, Status.COULD_NOT_RUN, error.why))
    except StepFailed as error:
        state.add(Part(error.what, Status.FAILED, error.detail))
    except Exception as error:  # noqa: BLE001  the check's own fault: said, with its traceback in the log
        traceback.print_exc()
        state.add(Part("the check ran to its end", Status.COULD_NOT_RUN,
                       f"the check raised {type(error).__name__}: {error}"))
    if not state.parts:
        state.add(Part("the check ran to its end", Status.COULD_NOT_RUN, "it found nothing to judge"))
    state.write()
    return 0
