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
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable
from typing import TextIO

import pandas as pd

from dlprof.analysis.tau_profile import FunctionSummary, ThreadProfile

RULE = "-" * 87
HEADER = (
    "%Time    Exclusive    Inclusive       #Call      #Subrs  Inclusive Name\n"
    "              msec   total msec                          usec/call "
)

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
    if inclusive_ns <= 0:
        # TAU's own row for a timer that never accumulated time.
        return f"  0.0            0            0 {calls:11G} {subrs:11G}          0 {name}"
    exclusive = tau_time(exclusive_ns / 1e3)
    inclusive = tau_time(inclusive_ns / 1e3)
    per_call = inclusive_per_call_ns / 1e3
    return (
        f"{time_pct:5.1f} {exclusive} {inclusive} {calls:11G} {subrs:11G} {per_call:10.0f} {name}"
    )


def format_table(functions: pd.DataFrame) -> list[str]:
    """A TAU profile table's rules, header and rows, as lines."""
    lines = [RULE, *HEADER.splitlines(), RULE]
    for row in functions.itertuples(index=False):
        lines.append(
            format_row(
                float(row.time_pct),
                float(row.exclusive_ns),
                float(row.inclusive_ns),
                float(row.calls),
                float(row.subrs),
                float(row.inclusive_per_call_ns),
                str(row.name),
            )
        )
    return lines


def thread_note(profile: ThreadProfile) -> str:
    """The line under a thread's header naming what TAU's thread number stands for here."""
    track = f"tid {profile.tid}" if profile.device == "cpu" else f"stream {profile.tid}"
    wall = tau_time(profile.wall_ns / 1e3).strip()
    return f"(rank {profile.rank}, pid {profile.pid}, {track}, {profile.device}; wall {wall} msec)"


def format_tau_profile(
    profiles: Iterable[ThreadProfile],
    summaries: Iterable[FunctionSummary] = (),
    title: str = "",
) -> str:
    """Every thread's block, then the summaries when there is more than one thread.

    Args:
        profiles: the thread profiles, already cut to the rows to show.
        summaries: the total and mean over threads; ignored for a single thread, as TAU does.
        title: a first line (TAU prints the files it read there); none when empty.

    Returns:
        The text, ending with a newline.
    """
    blocks = list(profiles)
    lines = [title] if title else []
    for profile in blocks:
        lines += ["", f"NODE {profile.rank};CONTEXT 0;THREAD {profile.thread}:"]
        lines.append(thread_note(profile))
        lines += format_table(profile.functions)
    if len(blocks) > 1:
        for summary in summaries:
            lines += ["", f"FUNCTION SUMMARY ({summary.kind}):"]
            lines += format_table(summary.functions)
    return "\n".join(lines) + "\n"


def write_tau_profile(
    profiles: Iterable[ThreadProfile],
    summaries: Iterable[FunctionSummary] = (),
    title: str = "",
    out: TextIO | None = None,
) -> None:
    """Print :func:`format_tau_profile`'s text to ``out`` (standard output by default)."""
    (out or sys.stdout).write(format_tau_profile(profiles, summaries, title))
