"""Converting the cycles that a framework's own profiler saves, in a child process or here.

torch.profiler and TensorFlow's profiler each save a cycle to a file (Kineto's Chrome JSON, an
XPlane) that dlprof translates into the store: in a child process at the lowest CPU priority
while the program goes on, and in the profiled process for what is left when it ends::

    converter = BackgroundConverter("dlprof-xplane", "dlprof.importers.xplane_cycle",
                                    convert=convert_cycle, finish=collector.finish)
    converter.submit(job)     # at the end of a cycle
    converter.close()         # when the session stops: converts what is left, here
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar


class Job(Protocol):
    """One saved cycle to convert; the child process reads it back from JSON."""

    def to_json(self) -> str: ...


class JsonJob:
    """A frozen dataclass handed to a child process as JSON, its paths and pairs restored by name."""

    PATHS: ClassVar[tuple[str, ...]] = ()
    PAIRS: ClassVar[tuple[str, ...]] = ()  # (int, int) or None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), default=str)  # type: ignore[call-overload]  # subclasses are dataclasses

    @classmethod
    def from_json(cls, text: str) -> Self:
        data = json.loads(text)
        for name in cls.PATHS:
            data[name] = Path(data[name])
        for name in cls.PAIRS:
            data[name] = tuple(data[name]) if data[name] else None
        return cls(**data)


JobT = TypeVar("JobT", bound=Job)
Result = dict[str, Any]


class BackgroundConverter(Generic[JobT]):
    """Converts saved cycles one at a time in a child process at the lowest CPU priority."""

    def __init__(self, thread_name: str, child_module: str, convert: Callable[[JobT], Result],
                 finish: Callable[[Result], None]) -> None:
        """Args:
        thread_name: names the thread that waits for the children.
        child_module: run as ``python -m child_module JOB_JSON``; prints the result's JSON last.
        convert: converts a job in this process (when a child fails, and at close).
        finish: told each job's result, from the converter's thread or from :meth:`close`.
        """
        self._child_module = child_module
        self._convert = convert
        self._finish = finish
        self._pending: deque[JobT] = deque()
        self._wakeup = threading.Event()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def submit(self, job: JobT) -> None:
        self._pending.append(job)
        self._wakeup.set()

    def close(self) -> None:
        """Let the conversion in flight finish, then convert what is left in this process."""
        self._closing = True
        self._wakeup.set()
        self._thread.join()
        while self._pending:
            self._finish(self._convert(self._pending.popleft()))

    def _run(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            while not self._closing and len(self._pending) > 0:
                job = self._pending.popleft()
                self._finish(self._in_child(job))
            if self._closing:
                return

    def _in_child(self, job: JobT) -> Result:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        completed = subprocess.run(
            # -P: the profiled program's working directory must not shadow the child's imports.
            [sys.executable, "-P", "-m", self._child_module, job.to_json()],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if completed.returncode != 0:
            # The child failed (out of memory, killed): convert here instead, nothing is lost.
            return self._convert(job)
        return result_from_json(completed.stdout)


def result_from_json(text: str) -> Result:
    """A child's result: the JSON object on the last line it printed."""
    lines = text.strip().splitlines()
    result: Result = json.loads(lines[-1]) if lines else {}
    return result


def child_main(argv: list[str], read_job: Callable[[str], JobT], convert: Callable[[JobT], Result]) -> int:
    """The body of a converter child: lower its priority, convert the job, print the result."""
    os.nice(19)
    print(json.dumps(convert(read_job(argv[0]))))
    return 0
