"""``dlprof memory``: each device's peak of allocated memory, what was live at it, and what each
layer added."""

from __future__ import annotations

import json
import sys

import click
import pandas as pd

from dlprof.analysis.memory import (
    KEYS,
    MemoryGroup,
    layer_peaks,
    live_at_peak,
    memory_peaks,
)
from dlprof.cli.common import (
    UsageError,
    check_rank,
    engine_option,
    open_run,
    rank_option,
    run_argument,
    runs_dir_option,
)
from dlprof.cli.table_options import format_option, limit_option, wide_option
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.viewers.terminal import format_sizes, size_unit, write_table

HELP = """Show each device's peak of allocated memory, when it happened (step and op), and what
was live at that moment: grouped by the op that allocated each block, by the layer around that
op, or by category (parameters, activations, gradients... as the source records them, else
activation inside a layer's forward and gradient inside its backward). With --by layer, also
what each layer added to the allocated total at its height (the most over its calls).

RUN is a run directory, or the name of one under --dir; by default the newest there.

A block is live at the peak when it was allocated at or before it and freed after it (frees
are matched to allocations by address). Memory allocated before recording began has no
allocation to name it: it is shown as "untraced". PyTorch runs record allocations by default
(torch.profiler's profile_memory); TensorFlow's come from its allocators' events in the XPlane
profile; `dlprof import snapshot.pickle` reads a PyTorch CUDA memory snapshot.

\b
Examples:
  dlprof memory                          # the newest run: peaks, and live blocks by op
  dlprof memory RUN --by layer           # live blocks by layer, and each layer's own peak
  dlprof memory RUN --by category -n 5   # parameters, activations, gradients...
  dlprof memory RUN --device cuda:0 --rank 1
  dlprof memory RUN -f json              # {"peaks": [...], "live": [...], "layers": [...]}
  dlprof memory RUN -f csv               # the live groups, each with its device's peak
"""

_PEAK_SIZES = [("peak_bytes", "Peak allocated"), ("reserved_peak_bytes", "Peak reserved"),
               ("live_bytes", "Live (traced)"), ("untraced_bytes", "Untraced")]
_LAYER_SIZES = [("added_bytes", "Added (max)"), ("mean_added_bytes", "Added (mean)"), ("high_bytes", "Highest total")]


@click.command("memory", help=HELP)
@run_argument
@rank_option
@click.option("--device", default=None, help="Only this device (cpu, cuda:0...).")
@click.option("--by", "by", type=click.Choice([str(g) for g in MemoryGroup], case_sensitive=False),
              default=str(MemoryGroup.OP), show_default=True, help="Group the blocks live at the peak by this.")
@format_option()
@limit_option("Groups (and layers) to show per device")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, rank: int | None, device: str | None, by: str, fmt: str, limit: int) -> int:
    loaded = open_run(run)
    print_memory(loaded, MemoryGroup(by), rank=rank, device=device, fmt=TableFormat(fmt), limit=limit or None)
    return 0


def print_memory(loaded: Run, by: MemoryGroup, rank: int | None = None, device: str | None = None,
                 fmt: TableFormat = TableFormat.TABLE, limit: int | None = 15) -> None:
    """Print a run's memory peaks and what was live at them, or fail with one line saying why."""
    check_rank(loaded, rank)
    _check_device(loaded, rank, device)
    peaks = memory_peaks(loaded, rank, device)
    if peaks.empty:
        raise UsageError(f"{loaded.path}: no allocation totals recorded, so no peak can be found")
    live = live_at_peak(loaded, by, rank, device, limit)
    layers = layer_peaks(loaded, rank, device, limit) if by is MemoryGroup.LAYER else None
    if fmt is TableFormat.JSON:
        parts = {"peaks": peaks, "live": live, **({"layers": layers} if layers is not None else {})}
        document = {name: json.loads(frame.to_json(orient="records")) for name, frame in parts.items()}
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
        return
    if fmt is TableFormat.CSV:
        write_table(live.merge(peaks[[*KEYS, "peak_bytes", "peak_ns", "untraced_bytes"]], on=KEYS), "", fmt)
        return
    _print_tables(loaded, peaks, live, layers, by)


def _check_device(loaded: Run, rank: int | None, device: str | None) -> None:
    where = "" if rank is None else f" WHERE rank = {int(rank)}"
    present = sorted(str(row[0]) for row in loaded.query(f"SELECT DISTINCT device FROM memory{where}").rows)
    if not present:
        raise UsageError(
            f"{loaded.path}: no allocations recorded; profile a PyTorch program (dlprof run records "
            "memory by default), or import a trace, XPlane profile or memory snapshot that holds them")
    if device is not None and device not in present:
        raise UsageError(f"{loaded.path}: no allocations on device {device!r}; devices with allocations: "
                         f"{', '.join(present)}")


def _print_tables(loaded: Run, peaks: pd.DataFrame, live: pd.DataFrame, layers: pd.DataFrame | None,
                  by: MemoryGroup) -> None:
    name = f"{loaded.path.name} ({loaded.status})"
    keys = _shown_keys(peaks)
    shown = _with_sizes(peaks, keys, _PEAK_SIZES)
    shown["At (s from first row)"] = [f"{(t - first) / 1e9:,.3f}" for t, first in zip(peaks["peak_ns"], peaks["first_ns"],
                                                                                    strict=True)]
    shown["Step"] = peaks["step"].fillna("-").tolist()
    shown["Op at peak"] = peaks["op"].fillna("-").tolist()
    # Where the peak was matters more than how much of it was traced.
    write_table(shown, f"{name}: peak allocated memory per device", TableFormat.TABLE,
                keep=[c for c in shown.columns if c.startswith("Peak allocated")] + ["Op at peak", "Step"])
    unmatched = int(peaks["unmatched_frees"].sum())
    if int(peaks["untraced_bytes"].sum()) or unmatched:
        print(f"Untraced: live at the peak with no recorded allocation (allocated before recording began, "
              f"or recorded without an address); {unmatched} free(s) of such blocks were recorded.")
    group = by.value
    # "name": the group's names are shown whole and left-aligned, as names are in every table.
    live_shown = _with_sizes(live.rename(columns={group: "name"}),
                             [*keys, "name", *(["basis"] if by is MemoryGroup.CATEGORY else [])], [("bytes", "Live")])
    live_shown["Blocks"] = live["blocks"].tolist()
    live_shown["% of peak"] = [f"{v:.2f}" for v in live["peak_pct"]]
    write_table(live_shown, f"{name}: blocks live at the peak, by {group}", TableFormat.TABLE)
    if layers is not None:
        if layers.empty:
            print("No layer allocated memory (no module slices around allocations on their threads).")
            return
        layer_shown = _with_sizes(layers.rename(columns={"layer": "name"}), [*keys, "name", "calls"], _LAYER_SIZES)
        write_table(layer_shown, f"{name}: what each layer added to allocated memory at its height "
                    "(highest total inside a call - total when it began)", TableFormat.TABLE)


def _shown_keys(peaks: pd.DataFrame) -> list[str]:
    """Rank and process columns only where the run has more than one."""
    return [key for key in KEYS if key == "device" or peaks[key].nunique() > 1]


def _with_sizes(table: pd.DataFrame, keys: list[str], sizes: list[tuple[str, str]]) -> pd.DataFrame:
    """``keys`` as text, then ``sizes`` (column, header) in one unit chosen from all their values."""
    shown = pd.DataFrame({key if key == "name" else key.capitalize(): table[key].astype(str).tolist()
                          for key in keys})
    scale, unit = size_unit(pd.concat([table[column] for column, _ in sizes]).tolist())
    for column, header in sizes:
        shown[f"{header} ({unit})"] = format_sizes(table[column].tolist(), scale)
    return shown
