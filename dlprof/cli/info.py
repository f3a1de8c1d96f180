"""``dlprof info``: one run's manifest as a summary a person can read."""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from datetime import datetime
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from dlprof.cli.common import open_run, run_argument, runs_dir_option
from dlprof.cli.ls import human_duration, human_size
from dlprof.cli.table_options import format_option, wide_option
from dlprof.keys import THROTTLE_CALLS, THROTTLE_PER_CALL_NS, RunStatus, TableFormat
from dlprof.store.catalog import event_count, run_size, script_of
from dlprof.store.manifest import NESTING_CHANGES
from dlprof.store.reader import Run
from dlprof.viewers.screen import printable, table_width

HELP = """Show what a run is: status, command, times, host, devices, collectors, clocks, counts.

A degraded run (its recording is not whole) has a line for each reason: a collector that could
not start or stopped recording, and when.

RUN is a run directory, or the name of one under --dir; by default the newest there.
-f json prints the
manifest (run.json) as written, plus "path" and "effective_status" (what dlprof reports:
"killed" for a run left "running" by a writer that is gone).

\b
Examples:
  dlprof info                      # newest run
  dlprof info RUN --wide           # long lines whole, however wide
  dlprof info RUN -f json          # for scripts
"""

# A console width no line of the summary reaches (--wide).
_UNLIMITED = 10_000
# Devices listed one a line; the rest are counted (16: the GPUs of the largest single machines).
DEVICES_SHOWN = 16

_STATUS_STYLE = {
    RunStatus.COMPLETE: "green",
    RunStatus.RUNNING: "cyan",
    RunStatus.FAILED: "red",
    RunStatus.INTERRUPTED: "yellow",
    RunStatus.DEGRADED: "yellow",
    RunStatus.KILLED: "red",
}


@click.command("info", help=HELP)
@run_argument
@format_option((TableFormat.TABLE, TableFormat.JSON), aliases={"text": TableFormat.TABLE},
               help_text="A summary for a person, or the manifest as JSON.")
@wide_option
@runs_dir_option
def command(run: str | None, fmt: str) -> int:
    loaded = open_run(run)
    if TableFormat(fmt) is TableFormat.JSON:
        data = dataclasses.asdict(loaded.manifest)
        data.update(path=str(loaded.path), effective_status=str(loaded.status))
        click.echo(json.dumps(data, indent=2))
    else:
        # The width every table fits ($COLUMNS, the terminal's, 80 piped); --wide: no limit.
        print_info(loaded, Console(highlight=False, width=table_width(sys.stdout) or _UNLIMITED))
    return 0


def print_info(run: Run, console: Console) -> None:
    """Print a run's summary: key facts, then collectors, clocks and counts as small tables.

    Args:
        run: the loaded run.
        console: where to print.
    """
    manifest = run.manifest
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column()
    # Text everywhere: names and commands are shown as written, never read as rich markup.
    facts.add_row("run", _shown(manifest.name))
    facts.add_row("path", _shown(str(run.path)))
    facts.add_row("status", _status(run))
    facts.add_row("command", _shown(shlex.join(manifest.command)))
    facts.add_row("script", _shown(script_of(manifest.command)))
    facts.add_row("started", _shown(_time(manifest.start_ns)))
    facts.add_row("ended", _shown(_time(manifest.end_ns)))
    facts.add_row("duration", _shown(human_duration(manifest.duration_ns) if manifest.duration_ns else "-"))
    facts.add_row("host", _shown(_host(run)))
    facts.add_row("devices", _shown(_devices(manifest.devices)))
    ranks = ", ".join(str(r) for r in manifest.ranks) or "-"
    facts.add_row("ranks", _shown(f"{ranks} (world size {manifest.world_size})"))
    facts.add_row("schedule", _shown(manifest.schedule or "every step"))
    events = event_count(run)
    facts.add_row("events", _shown("unknown" if events is None else f"{events:,}"))
    facts.add_row("on disk", _shown(human_size(run_size(run.path))))
    normalised = "; ".join(f"{v:,} {NESTING_CHANGES.get(k, k.replace('_', ' '))}"
                           for k, v in manifest.normalised.items())
    facts.add_row("normalised", _shown(normalised or "nothing changed: every slice as recorded"))
    if manifest.saving:
        facts.add_row("saved", _shown(_saving(manifest.saving)))
    if manifest.saving.get("pauses"):
        facts.add_row("pauses", _shown(_pauses(manifest.saving["pauses"], manifest.duration_ns)))
    for name, throttled in manifest.saving.get("throttled", {}).items():
        facts.add_row("throttled", _shown(f"{name}: {throttled['calls']:,} later calls counted, not traced "
                                        f"(more than {THROTTLE_CALLS:,} calls at under "
                                        f"{THROTTLE_PER_CALL_NS // 1000} us each, as TAU throttles)"))
    for line in manifest.degraded:
        facts.add_row("degraded", Text(printable(line), style=_STATUS_STYLE[RunStatus.DEGRADED]))
    for note in manifest.notes:
        facts.add_row("note", _shown(note))
    console.print(facts)
    console.print(_collectors(run))
    if manifest.clocks:
        console.print(_clocks(run))
    if manifest.counts:
        console.print(_counts(manifest.counts))


def _saving(saving: dict[str, Any]) -> str:
    """How the run was saved while it went on, in one line."""
    parts = [f"{saving.get('saves', 0)} saves ({saving.get('saves_within_steps', 0)} inside steps)"]
    if "peak_held_mib" in saving:
        parts.append(f"dlprof held at most {saving['peak_held_mib']} MiB of events between saves, estimated "
                     f"(cap {saving.get('memory_cap_mib', '-')} MiB)")
    else:  # runs saved by the process's growth
        parts.append(f"memory grew at most {saving.get('peak_memory_growth_mib', 0)} MiB between saves "
                     f"(cap {saving.get('memory_cap_mib', '-')} MiB)")
    if saving.get("saves_past_memory_cap"):
        parts.append(f"{saving['saves_past_memory_cap']} found it past the cap")
    if "longest_between_saves_s" in saving:
        parts.append(f"at most {saving['longest_between_saves_s']} s between saves")
    if saving.get("saves_by_time_deferred"):
        parts.append(f"saves by time waited {saving['saves_by_time_deferred']} time(s) for the pause budget")
    if saving.get("within_steps_unavailable"):
        parts.append(saving["within_steps_unavailable"])
    children = saving.get("forked_children", {})
    if children.get("children"):
        batches = sum(kinds.get("dataloader", 0) for kinds in children["children"].values())
        parts.append(f"{len(children['children'])} forked children saved theirs ({batches:,} DataLoader batches)")
    if children.get("not_answering"):
        parts.append(f"children not answering at the end: {len(children['not_answering'])}")
    if children.get("not_followed"):
        parts.append(f"child processes not followed: {len(children['not_followed'])}")
    return "; ".join(parts)


def _pauses(pauses: dict[str, Any], duration_ns: int) -> str:
    """dlprof's own pauses of the program, in one line (none of them is the user's time)."""
    count = pauses.get("count", 0)
    total_ms = float(pauses.get("total_ms", 0.0))
    share = f", {100 * total_ms * 1e6 / duration_ns:.1f}% of the run" if duration_ns else ""
    text = (f"{count} by dlprof ({total_ms / 1000:.2f} s{share}; longest {pauses.get('longest_ms', 0)} ms): "
            f"{pauses.get('inside_steps', 0)} inside steps, {pauses.get('inside_layers', 0)} inside layers, "
            f"{pauses.get('for_memory', 0)} for memory that could not wait")
    if pauses.get("longest_unforced_inside_step_ms"):
        text += f"; longest inside a step not for memory {pauses['longest_unforced_inside_step_ms']} ms"
    return text


def _status(run: Run) -> Text:
    status = run.status
    text = Text(str(status), style=_STATUS_STYLE.get(status, ""))
    manifest = run.manifest
    if status is RunStatus.KILLED:
        text.append(f" (left running by process {manifest.writer_pid}, which is gone)")
    if manifest.exit_code is not None:
        text.append(f", exit code {manifest.exit_code}")
    if manifest.error:
        text.append(printable(f": {manifest.error}"))
    return text


def _shown(text: str) -> Text:
    """Text from the run as rich shows it: never read as markup, control characters made visible
    except the line breaks between a cell's lines."""
    return Text("\n".join(printable(line) for line in text.split("\n")))


def _time(ns: int) -> str:
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%Y-%m-%d %H:%M:%S.%f %Z")


def _host(run: Run) -> str:
    host = run.manifest.host
    parts = [host.hostname or "?"]
    if host.os or host.python:
        parts.append(f"{host.os}, Python {host.python}".strip(", "))
    cpu = host.cpu_model or "CPU"
    if host.cpu_cores:
        cpu += f", {host.cpu_cores} cores"
    if host.memory_bytes:
        cpu += f", {human_size(host.memory_bytes)} memory"
    parts.append(cpu)
    return "; ".join(parts)


def _devices(devices: list[dict[str, Any]]) -> str:
    """One line per device, from Kineto's ``deviceProperties`` names where they are there; past
    :data:`DEVICES_SHOWN`, a count of the rest (a trace may state any number)."""
    if not devices:
        return "none recorded"
    lines = []
    for number, device in enumerate(devices[:DEVICES_SHOWN]):
        line = f"{device.get('id', number)}: {device.get('name', 'device')}"
        details = []
        if "computeMajor" in device:
            details.append(f"compute {device['computeMajor']}.{device.get('computeMinor', 0)}")
        if "numSms" in device:
            details.append(f"{device['numSms']} SMs")
        if isinstance(device.get("totalGlobalMem"), int):
            details.append(f"{human_size(device['totalGlobalMem'])} memory")
        lines.append(f"{line} ({', '.join(details)})" if details else line)
    if len(devices) > DEVICES_SHOWN:
        lines.append(f"... and {len(devices) - DEVICES_SHOWN:,} more (dlprof info --format json lists them)")
    return "\n".join(lines)


def _small_table(title: str, *columns: str) -> Table:
    table = Table(title=_shown(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for column in columns:
        table.add_column(_shown(column))
    return table


def _collectors(run: Run) -> Table:
    table = _small_table("collectors", "name", "version", "active", "notes")
    for collector in run.manifest.collectors:
        table.add_row(_shown(collector.name), _shown(collector.version), _shown("yes" if collector.active else "no"),
                      _shown("\n".join(collector.notes) or "-"))
    if not run.manifest.collectors:
        table.add_row(_shown("none recorded"), _shown(""), _shown(""), _shown(""))
    return table


def _clocks(run: Run) -> Table:
    table = _small_table("clocks", "source", "mapped by", "offset (ns)", "uncertainty (ns)")
    for clock in run.manifest.clocks:
        bounds = f"{clock.bounds_ns[0]:+,} .. {clock.bounds_ns[1]:+,}" if clock.bounds_ns else "-"
        table.add_row(_shown(clock.name), _shown(clock.method), _shown(f"{clock.offset_ns:,}"), _shown(bounds))
    return table


def _counts(counts: dict[str, int]) -> Table:
    table = _small_table("rows per table", "table", "rows")
    table.columns[1].justify = "right"
    for name, rows in counts.items():
        table.add_row(_shown(name), _shown(f"{rows:,}"))
    return table
