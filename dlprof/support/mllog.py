"""MLPerf's ``:::MLLOG {json}`` lines, read from what a program prints, without changing it.

    with tee_mllog(record):      # record(event) for each MLPerf line the program prints
        run_the_program()

MLPerf's reference implementations log through ``mlperf_logging.mllog``, whose default logger
is a ``logging.StreamHandler`` on ``sys.stdout``, and some print the lines themselves. Each line
is ``:::MLLOG `` and a JSON object: ``key``, ``value``, ``time_ms`` (epoch milliseconds),
``event_type`` (``POINT_IN_TIME``, ``INTERVAL_START``, ``INTERVAL_END``) and ``metadata``
(``epoch_num``, ``samples_count``...).

How they are picked up: while the program runs, ``sys.stdout`` and ``sys.stderr`` are wrapped
by :class:`LineTee`, which passes every write through unchanged (same stream, same file
descriptor, ``isatty()`` and encoding as before) and also looks at each complete line. This is
the Python layer, not the file descriptor: the program's output keeps its terminal (a pipe on
fd 1 would turn colours and line buffering off) and no reader thread is needed. What it does not
see is output written below Python (``os.write(1, ...)``, C code, child processes): MLPerf's
logger writes through Python. A handler the program attaches to a stream it saved before the
program started cannot exist: the wrap is in place before the program's first line runs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO, TypeGuard

MARKER = ":::MLLOG"
# A line held without its end (a progress bar's carriage returns) is dropped past this size.
_LONGEST_LINE = 1 << 20


@dataclass(frozen=True)
class MllogEvent:
    """One MLPerf log line, as far as dlprof uses it."""

    key: str  # "eval_accuracy", "run_start", "eval_stop"...
    value: float | None  # a number, or None (an interval's start or end, or a non-number)
    time_ns: int  # the line's own epoch time (time_ms)
    interval: bool  # INTERVAL_START or INTERVAL_END: a mark in the time line
    epoch: float | None  # metadata epoch_num (first_epoch_num for a block)
    samples: int | None  # metadata samples_count


def parse_line(line: str) -> MllogEvent | None:
    """The MLPerf event a line holds, or None for any other line (or a damaged one).

    Args:
        line: one line of output, with or without its end.

    Returns:
        The event, when the line is ``:::MLLOG`` and a JSON object with a string ``key`` and a
        numeric ``time_ms``; events whose value is not a number keep only their time.
    """
    at = line.find(MARKER)
    if at < 0:
        return None
    try:
        record = json.loads(line[at + len(MARKER):])
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    key, time_ms = record.get("key"), record.get("time_ms")
    if not isinstance(key, str) or not _is_number(time_ms):
        return None
    metadata = record.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    epoch = metadata.get("epoch_num", metadata.get("first_epoch_num"))
    samples = metadata.get("samples_count")
    value = record.get("value")
    return MllogEvent(
        key=key,
        value=float(value) if _is_number(value) else None,
        time_ns=_ms_to_ns(time_ms),
        interval=record.get("event_type") in ("INTERVAL_START", "INTERVAL_END"),
        epoch=float(epoch) if _is_number(epoch) else None,
        samples=int(samples) if _is_number(samples) else None,
    )


def _ms_to_ns(time_ms: float) -> int:
    """Epoch milliseconds as nanoseconds, exact for whole milliseconds (a float product is not:
    1.6e12 ms times 1e6 lies past a double's 53 bits)."""
    whole = int(time_ms)
    return whole * 1_000_000 + round((time_ms - whole) * 1_000_000)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class LineTee:
    """A text stream that writes through to another and hands each complete line to a reader."""

    def __init__(self, stream: TextIO, on_line: Callable[[str], None]) -> None:
        self._stream = stream
        self._on_line = on_line
        self._pending: list[str] = []  # the line under way, as written
        self._pending_size = 0

    def write(self, text: str) -> int:
        written = self._stream.write(text)
        if "\n" not in text:
            self._pending.append(text)
            self._pending_size += len(text)
            if self._pending_size > _LONGEST_LINE:
                self._pending, self._pending_size = [], 0
            return written
        lines = "".join([*self._pending, text]).split("\n")
        last = lines.pop()
        self._pending, self._pending_size = ([last], len(last)) if last else ([], 0)
        for line in lines:
            if MARKER in line:
                self._on_line(line)
        return written

    def end(self) -> None:
        """The program is done writing: its last line counts even without its end."""
        line, self._pending, self._pending_size = "".join(self._pending), [], 0
        if MARKER in line:
            self._on_line(line)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # flush, fileno, isatty, encoding, buffer...: the wrapped stream's own.
        return getattr(self._stream, name)


@contextmanager
def tee_mllog(record: Callable[[MllogEvent], None]) -> Iterator[None]:
    """Within the block, hand ``record`` each MLPerf line written to ``sys.stdout`` or
    ``sys.stderr``; what is written reaches the streams unchanged.

    Args:
        record: called with each event, on the writing thread.
    """
    def on_line(line: str) -> None:
        event = parse_line(line)
        if event is not None:
            record(event)

    saved = sys.stdout, sys.stderr
    tees = LineTee(sys.stdout, on_line), LineTee(sys.stderr, on_line)
    sys.stdout, sys.stderr = tees
    try:
        yield
    finally:
        for tee in tees:
            tee.end()
        # Put back only what is still ours: a program that replaced a stream keeps its own.
        if isinstance(sys.stdout, LineTee):
            sys.stdout = saved[0]
        if isinstance(sys.stderr, LineTee):
            sys.stderr = saved[1]
