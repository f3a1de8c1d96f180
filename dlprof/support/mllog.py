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

The write is the program's: it runs outside any ``try`` of the tee, so a closed or broken
stream fails as it would without dlprof. Reading the lines is dlprof's: a failure there stops
the reading (``on_failure`` is told, once) and the writes go on through.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO, TypeGuard

MARKER = ":::MLLOG"
# A line held without its end (a progress bar's carriage returns) is dropped past this size.
_LONGEST_LINE = 1 << 20
# Epoch milliseconds and sample counts a line may give: what the series table's int64 holds.
_INT64 = 2**63
_LATEST_MS = _INT64 // 1_000_000


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
    if not isinstance(key, str) or not _is_number(time_ms) or abs(time_ms) >= _LATEST_MS:
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
        samples=int(samples) if _is_number(samples) and abs(samples) < _INT64 else None,
    )


def _ms_to_ns(time_ms: float) -> int:
    """Epoch milliseconds as nanoseconds, exact for whole milliseconds (a float product is not:
    1.6e12 ms times 1e6 lies past a double's 53 bits)."""
    whole = int(time_ms)
    return whole * 1_000_000 + round((time_ms - whole) * 1_000_000)


def _is_number(value: object) -> TypeGuard[float]:
    """A JSON number that is finite (Python's JSON reads ``1e400`` as infinity, and ``NaN``)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class LineTee:
    """A text stream that writes through to another and hands each complete line to a reader."""

    def __init__(self, stream: TextIO, on_line: Callable[[str], None],
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        """Args:
        stream: where every write goes, unchanged.
        on_line: handed each complete line.
        on_failure: told, once, what reading the lines raised; the tee then only writes through
            (None: the failure is dropped with the lines).
        """
        self._stream = stream
        self._on_line = on_line
        self._on_failure = on_failure
        self._reading = True
        self._pending: list[str] = []  # the line under way, as written
        self._pending_size = 0

    def write(self, text: str) -> int:
        written = self._stream.write(text)  # the program's write: what it raises is its own
        if self._reading:
            try:
                self._read(text)
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                self._stop_reading(failure)
        return written

    def _read(self, text: str) -> None:
        if "\n" not in text:
            self._pending.append(text)
            self._pending_size += len(text)
            if self._pending_size > _LONGEST_LINE:
                self._pending, self._pending_size = [], 0
            return
        lines = "".join([*self._pending, text]).split("\n")
        last = lines.pop()
        self._pending, self._pending_size = ([last], len(last)) if last else ([], 0)
        for line in lines:
            if MARKER in line:
                self._on_line(line)

    def _stop_reading(self, failure: BaseException) -> None:
        self._reading = False
        self._pending, self._pending_size = [], 0
        if self._on_failure is not None:
            self._on_failure(failure)

    def end(self) -> None:
        """The program is done writing: its last line counts even without its end."""
        line, self._pending, self._pending_size = "".join(self._pending), [], 0
        if self._reading and MARKER in line:
            try:
                self._on_line(line)
            except Exception as failure:  # noqa: BLE001  dlprof's failure is never the program's
                self._stop_reading(failure)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        # flush, fileno, isatty, encoding, buffer...: the wrapped stream's own.
        return getattr(self._stream, name)


@contextmanager
def tee_mllog(record: Callable[[MllogEvent], None],
              on_failure: Callable[[BaseException], None] | None = None) -> Iterator[None]:
    """Within the block, hand ``record`` each MLPerf line written to ``sys.stdout`` or
    ``sys.stderr``; what is written reaches the streams unchanged.

    Args:
        record: called with each event, on the writing thread.
        on_failure: told what ``record`` (or reading the lines) raised; the lines of that stream
            are read no more, and the writes go on.
    """
    def on_line(line: str) -> None:
        event = parse_line(line)
        if event is not None:
            record(event)

    saved = sys.stdout, sys.stderr
    tees = LineTee(sys.stdout, on_line, on_failure), LineTee(sys.stderr, on_line, on_failure)
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
