"""``dlprof counters``: which CPU and GPU counters can be counted here, per backend, and why not."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict

import click

from dlprof.cli.table_options import format_option, wide_option
from dlprof.collectors.counters import backend_status, papi_events
from dlprof.engine.rows import Rows
from dlprof.keys import TableFormat
from dlprof.support.perf_event import CounterInfo, available_events
from dlprof.viewers.fit import Column, print_columns
from dlprof.viewers.screen import wrapped
from dlprof.viewers.terminal import write_table

HELP = """List the counters dlprof can count on this machine, per backend.

Each counter shows its description, unit and whether it can be counted here; each backend that
cannot count here says why in one line (no PMU, perf_event_paranoid, a missing package or driver).
Count them per step and region with `dlprof run --counters NAME,...`.

\b
Examples:
  dlprof counters
  dlprof counters --wide           # descriptions and reasons whole
  dlprof counters -f json          # counters and backends, for scripts
  dlprof counters -f csv           # the counters, one row each
  dlprof run --counters task-clock,page-faults train.py
"""


@click.command("counters", help=HELP)
@format_option(help_text="Table for a person; CSV (the counters) or JSON (counters and backends) for a script.")
@wide_option
def command(fmt: str) -> int:
    events = available_events() + papi_events()
    backends = backend_status()
    if TableFormat(fmt) is TableFormat.CSV:
        records = [asdict(event) for event in events]
        columns = tuple(records[0]) if records else ()
        write_table(Rows(columns, [tuple(r.values()) for r in records]), "", TableFormat.CSV)
        return 0
    if TableFormat(fmt) is TableFormat.JSON:
        document = {
            "counters": [asdict(event) for event in events],
            "backends": [asdict(backend) for backend in backends],
        }
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
        return 0
    title = "CPU counters (dlprof run --counters NAME,...; any PAPI_* preset)"
    print_columns(_columns(events), title, sys.stdout)
    for backend in backends:
        if not backend.available or backend.reason:
            print(wrapped(f"{backend.name}: {backend.reason}", sys.stdout, indent="  "))
    return 0


# (header, what a cell shows, whether it is text to shorten); a narrow terminal keeps the
# first ones: what can be counted, then why not, then the rest.
_COLUMNS: list[tuple[str, Callable[[CounterInfo], str], bool]] = [
    ("Name", lambda e: e.name, True),
    ("Available", lambda e: "yes" if e.available else "no", False),
    ("Unit", lambda e: e.unit, False),
    ("Why not", lambda e: e.reason, True),
    ("Description", lambda e: e.description, True),
    ("Backend", lambda e: e.backend, False),
]
_PROSE = frozenset({"Why not", "Description"})
_SHOWN_ORDER = ["Name", "Backend", "Unit", "Available", "Description", "Why not"]


def _columns(events: list[CounterInfo]) -> list[Column]:
    """The table's columns in the order shown, each with its priority."""
    priority = {header: rank for rank, (header, _, _) in enumerate(_COLUMNS)}
    cell = {header: (value, text) for header, value, text in _COLUMNS}
    return [Column(header, [cell[header][0](event) for event in events], text=cell[header][1],
                   priority=priority[header], wrap=header in _PROSE) for header in _SHOWN_ORDER]
