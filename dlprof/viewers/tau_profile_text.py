"""TAU's flat profiles as plain text, laid out as TAU's ``pprof`` tool prints them, for people who
read TAU's output by eye (Google's pprof format is another thing: ``dlprof export -o prof.pb.gz``).

    profiles = tau_profiles(run)
    print(format_tau_profile(profiles, function_summaries(profiles)))

Each thread gets TAU's block: ``NODE n;CONTEXT 0;THREAD t:``, a note naming the OS thread (or
device stream) behind the numbers, the two-line column header between dashed rules, and one row
per name. Numbers are formatted as TAU's ``pprof`` formats them (its ``PrintFuncTab`` and
``ToTimeStr``): times in milliseconds written as ``ss,mmm`` (a comma between seconds and
milliseconds), ``m:ss.mmm`` or ``h:mm:ss.mmm`` past a second, a minute or an hour, and with three
significant digits below a millisecond; counts with C's ``%G``. With more than one thread, the
``FUNCTION SUMMARY (total)`` and ``(mean)`` tables follow, as TAU prints them.

Fitted to the terminal as every table is: when names would get under 30 characters, #Subrs
and then the inclusive time per call go (a line says so), and names are shortened in the
middle; ``--wide`` gives TAU's whole layout. Names are made printable (control characters shown
as symbols), and each thread's wall time is written in one plain unit (``wall 75.412 s``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import NamedTuple, TextIO

import pandas as pd

from dlprof.analysis.tau_profile import FunctionSummary, ThreadProfile
from dlprof.analysis.threads import GPU_ANNOTATIONS
from dlprof.viewers.names import distinct_names
from dlprof.viewers.screen import printable, table_width
from dlprof.viewers.terminal import time_text

RULE = "-" * 87
HEADER = (
    "%Time    Exclusive    Inclusive       #Call      #Subrs  Inclusive Name\n"
    "              msec   total msec                          usec/call "
)
# HEADER cut at its columns: each column's two header lines, as wide as its cells.
_HEADER_CELLS = (
    ("%Time", "     "),
    ("    Exclusive", "         msec"),
    ("    Inclusive", "   total msec"),
    ("       #Call", "            "),
    ("      #Subrs", "            "),
    ("  Inclusive", "  usec/call"),
)
# What a narrow terminal loses first: direct child calls, then the inclusive time per call.
_DROP_ORDER = (4, 5)
# The least width of the names while columns are dropped to fit.
NAME_FLOOR = 30

_USEC_PER_MSEC = 1e3
_USEC_PER_SEC = 1e6
_USEC_PER_MIN = 60e6
_USEC_PER_HOUR = 3600e6


def tau_time(usec: float) -> str:
    """A time as TAU's pprof prints it: twelve characters, in milliseconds.

    Args:
        usec: the time in microseconds (TAU's unit).

    Returns:
        ``"      0.563"``-style text below a millisecond (three significant digits), whole
        milliseconds below a second, then ``s,mmm``, ``m:ss.mmm`` and ``h:mm:ss.mmm``; every
        part is truncated, not rounded, as TAU's C casts do.
    """
    if usec < _USEC_PER_MSEC:
        return f"   {usec / _USEC_PER_MSEC:9.3G}"
    msec = int(math.fmod(usec / _USEC_PER_MSEC, 1e3))
    sec = int(math.fmod(usec / _USEC_PER_SEC, 60.0))
    minute = int(math.fmod(usec / _USEC_PER_MIN, 60.0))
    hour = int(usec / _USEC_PER_HOUR)
    if hour:
        return f"{hour:2d}:{minute:02d}:{sec:02d}.{msec:03d}"
    if minute:
        return f"   {minute:2d}:{sec:02d}.{msec:03d}"
    if sec:
        return f"      {sec:2d},{msec:03d}"
    return f"         {msec:3d}"


def _row_cells(
    time_pct: float,
    exclusive_ns: float,
    inclusive_ns: float,
    calls: float,
    subrs: float,
    inclusive_per_call_ns: float,
) -> list[str]:
    """A row's six number cells, each as wide as its column, with the space before it."""
    if inclusive_ns <= 0:
        # TAU's own row for a timer that never accumulated time.
        return ["  0.0", "            0", "            0", f" {calls:11G}", f" {subrs:11G}", "          0"]
    return [f"{time_pct:5.1f}", f" {tau_time(exclusive_ns / 1e3)}", f" {tau_time(inclusive_ns / 1e3)}",
            f" {calls:11G}", f" {subrs:11G}", f" {inclusive_per_call_ns / 1e3:10.0f}"]


def format_row(
    time_pct: float,
    exclusive_ns: float,
    inclusive_ns: float,
    calls: float,
    subrs: float,
    inclusive_per_call_ns: float,
    name: str,
) -> str:
    """One row of a TAU profile table, in TAU's ``%5.1f %s %s %11G %11G %10.0f %s`` layout.

    Args:
        time_pct: inclusive time as a percentage of the thread's.
        exclusive_ns: exclusive time.
        inclusive_ns: inclusive time.
        calls: activations (fractional in a mean).
        subrs: direct children's activations.
        inclusive_per_call_ns: inclusive time per call.
        name: the slice name.

    Returns:
        The row, without a newline.
    """
    cells = _row_cells(time_pct, exclusive_ns, inclusive_ns, calls, subrs, inclusive_per_call_ns)
    return "".join(cells) + f" {name}"


class Fit(NamedTuple):
    """Which of TAU's columns a width leaves, and how wide the names may be."""

    columns: tuple[int, ...]
    name_width: int | None


def fit(width: int | None, longest_name: int = NAME_FLOOR) -> Fit:
    """TAU's columns that fit ``width``: #Subrs, then inclusive usec/call, go when names would
    get less than :data:`NAME_FLOOR` characters (or than the longest name, if shorter); None
    keeps them all and names whole."""
    shown = list(range(len(_HEADER_CELLS)))
    if width is None:
        return Fit(tuple(shown), None)
    floor = min(longest_name, NAME_FLOOR)
    for dropped in _DROP_ORDER:
        if width - _cells_width(shown) - 1 >= floor:
            break
        shown.remove(dropped)
    return Fit(tuple(shown), max(width - _cells_width(shown) - 1, floor))


def _cells_width(shown: list[int]) -> int:
    return sum(len(_HEADER_CELLS[i][0]) for i in shown)


def format_table(functions: pd.DataFrame, fitted: Fit | None = None) -> list[str]:
    """A TAU profile table's rules, header and rows, as lines, with the columns ``fitted`` keeps
    (all of them, names whole, by default)."""
    fitted = fitted or fit(None)
    first, second = ("".join(_HEADER_CELLS[i][line] for i in fitted.columns) for line in (0, 1))
    rule = RULE if fitted.name_width is None else RULE[: len(first) + 1 + fitted.name_width]
    lines = [rule, f"{first} Name", f"{second} ", rule]
    names = [str(name) for name in functions["name"]]
    # A table's names are shortened together, keeping what tells them apart (the layer index).
    shown = names if fitted.name_width is None else distinct_names(names, fitted.name_width)
    for row, name in zip(functions.itertuples(index=False), shown, strict=True):
        cells = _row_cells(float(row.time_pct), float(row.exclusive_ns), float(row.inclusive_ns), float(row.calls),
                           float(row.subrs), float(row.inclusive_per_call_ns))
        lines.append("".join(cells[i] for i in fitted.columns) + f" {printable(name)}")
    return lines


def thread_note(profile: ThreadProfile) -> str:
    """The line under a thread's header naming what TAU's thread number stands for here."""
    # The wall time in one plain unit (TAU's own "1:15.412" reads as minutes, not msec).
    wall = f"wall {time_text(profile.wall_ns)}"
    if profile.role == GPU_ANNOTATIONS:  # Kineto's ranges on a GPU stream, stored beside the CPU's
        return f"(rank {profile.rank}, GPU annotations, stream {profile.tid}; {wall})"
    track = f"tid {profile.tid}" if profile.device == "cpu" else f"stream {profile.tid}"
    role = f"{profile.role}: " if profile.role else ""
    return f"(rank {profile.rank}, {role}pid {profile.pid}, {track}, {profile.device}; {wall})"


def format_tau_profile(
    profiles: Iterable[ThreadProfile],
    summaries: Iterable[FunctionSummary] = (),
    title: str = "",
    width: int | None = None,
) -> str:
    """Every thread's block, then the summaries when there is more than one thread.

    Args:
        profiles: the thread profiles, already cut to the rows to show.
        summaries: the total and mean over threads; ignored for a single thread, as TAU does.
        title: a first line (TAU prints the files it read there); none when empty.
        width: the width to fit (lesser columns go, names are shortened); None for TAU's
            whole layout and whole names.

    Returns:
        The text, ending with a newline; every name made printable.
    """
    blocks = list(profiles)
    totals = list(summaries) if len(blocks) > 1 else []
    tables = [p.functions for p in blocks] + [s.functions for s in totals]
    fitted = fit(width, max((len(str(name)) for table in tables for name in table["name"]), default=0))
    lines = [printable(title)] if title else []
    hidden = [" ".join(" ".join(_HEADER_CELLS[i]).split()) for i in range(len(_HEADER_CELLS))
              if i not in fitted.columns]
    if hidden:
        lines.append(f"({', '.join(hidden)} hidden to fit {width} columns; --wide shows them)")
    for profile in blocks:
        lines += ["", f"NODE {profile.rank};CONTEXT 0;THREAD {profile.thread}:"]
        lines.append(printable(thread_note(profile)))
        lines += format_table(profile.functions, fitted)
    if totals:
        for summary in totals:
            lines += ["", f"FUNCTION SUMMARY ({summary.kind}):"]
            lines += format_table(summary.functions, fitted)
    return "\n".join(lines) + "\n"


def write_tau_profile(
    profiles: Iterable[ThreadProfile],
    summaries: Iterable[FunctionSummary] = (),
    title: str = "",
    out: TextIO | None = None,
) -> None:
    """Print :func:`format_tau_profile`'s text to ``out`` (standard output by default), fitted
    to its width."""
    stream = out or sys.stdout
    stream.write(format_tau_profile(profiles, summaries, title, table_width(stream)))
