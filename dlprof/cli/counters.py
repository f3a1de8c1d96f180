"""``dlprof counters``: which CPU and GPU counters can be counted here, per backend, and why not."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlprof.collectors.counters import backend_status, papi_events
from dlprof.support.perf_event import available_events

HELP = """List the counters dlprof can count on this machine, per backend.

Each counter shows its description, unit and whether it can be counted here; each backend that
cannot count here says why in one line (no PMU, perf_event_paranoid, a missing package or driver).
Count them per step and region with `dlprof run --counters NAME,...`.

\b
Examples:
  dlprof counters
  dlprof counters --format json
  dlprof run --counters task-clock,page-faults train.py
"""


@click.command("counters", help=HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "json"], case_sensitive=False),
              default="table", show_default=True, help="Table for a person, JSON for a script.")
def command(fmt: str) -> int:
    events = available_events() + papi_events()
    backends = backend_status()
    if fmt == "json":
        document = {
            "counters": [asdict(event) for event in events],
            "backends": [asdict(backend) for backend in backends],
        }
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
        return 0
    table = Table(title=Text("CPU counters (dlprof run --counters NAME,...; any PAPI_* preset)"), title_justify="left",
                  header_style="bold", box=box.SIMPLE_HEAD)
    for header in ("Name", "Backend", "Unit", "Available", "Description", "Why not"):
        table.add_column(header)
    for event in events:
        cells = (event.name, event.backend, event.unit, "yes" if event.available else "no",
                 event.description, event.reason)
        table.add_row(*(Text(cell) for cell in cells))
    Console(highlight=False, width=None if sys.stdout.isatty() else 160).print(table)
    for backend in backends:
        if not backend.available or backend.reason:
            print(f"{backend.name}: {backend.reason}")
    return 0
