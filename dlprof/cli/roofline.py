"""``dlprof roofline``: each op, kernel or layer against its device's roof."""

from __future__ import annotations

import sys

import click
import pandas as pd

from dlprof.analysis.roofline import Roofline, RooflineKey, roofline
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
from dlprof.hardware.devices import Origin, Vendor
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.viewers.terminal import write_table

HELP = """Place each op, kernel or layer of a run on its device's roofline.

RUN is a run directory; by default the newest under ./dlprof-runs.

Per row: FLOPs, bytes moved, time, arithmetic intensity (FLOPs per byte), achieved FLOP/s and
bytes/s, the bound at that intensity (memory below the ridge point, compute above), the percent
of the roof (achieved / min(peak, bandwidth x intensity)), the math mode (fp32, tf32 tensor
core...: from the kernel's name and the op's input type) and where the FLOPs came from (shapes:
torch's formulas; counters: the run's instruction counters). The device is resolved from the
run's recorded GPU (a CPU run: a nominal CPU row for its cores) unless --device names one.

\b
Examples:
  dlprof roofline                          # ops of the newest run, by time
  dlprof roofline RUN --by kernel -n 30    # kernels
  dlprof roofline RUN --by layer           # layers (a run with the layers collector)
  dlprof roofline RUN --device h100        # against another device's roof
  dlprof roofline RUN --format json        # for scripts
"""

_SHOWN = [("name", "name"), ("shapes", "Input shapes"), ("calls", "Calls"), ("time_ns", "time_ns"),
          ("flops", "FLOPs"), ("bytes", "Bytes"), ("intensity", "FLOP/B"), ("flop_rate", "FLOP/s"),
          ("byte_rate", "B/s"), ("bound", "Bound"), ("roof_pct", "% of roof"), ("mode", "Math mode"),
          ("flops_source", "FLOPs from")]


@click.command("roofline", help=HELP)
@run_argument
@click.option("--by", "by", type=click.Choice([str(k) for k in RooflineKey], case_sensitive=False),
              default=str(RooflineKey.OP), show_default=True,
              help="One row per op and input shapes, per kernel, or per layer.")
@click.option("--device", "device", default=None, metavar="NAME",
              help="Measure against this device's roof (a100, h100, v100, l4, t4, mi250, mi300x...).")
@rank_option
@limit_option("Rows to show")
@format_option(help_text="Table for a person, CSV or JSON for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, by: str, device: str | None, rank: int | None, limit: int, fmt: str) -> int:
    loaded = open_run(run)
    print_roofline(loaded, RooflineKey(by), device, rank, limit, TableFormat(fmt))
    return 0


def compute_roofline(loaded: Run, key: RooflineKey, device: str | None, rank: int | None) -> Roofline:
    """The run's roofline, or one line saying why there is none."""
    check_rank(loaded, rank)
    try:
        found = roofline(loaded, key, device, rank)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if found.table.empty:
        raise UsageError(f"{loaded.path}: no ops with FLOPs and no device work to place on a roofline")
    return found


def si(value: float, unit: str = "") -> str:
    """``1.21 G`` for 1.21e9: the tables' counts with their unit; ``-`` when unknown."""
    if value != value:  # NaN
        return "-"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}".rstrip()


def coverage_line(found: Roofline) -> str:
    """The share of the run's time whose FLOPs are known, and the device measured against."""
    what = "op self time" if found.device.vendor is Vendor.CPU else "device time"
    where = ("nominal figures, not a datasheet or a measurement" if found.device.origin is Origin.NOMINAL
             else f"{found.device.origin}: {found.device.source_url or found.device.source}")
    return f"coverage: {100 * found.coverage:.1f}% of {what} has known FLOPs; device: {found.device.name} ({where})"


def print_roofline(loaded: Run, key: RooflineKey, device: str | None, rank: int | None, limit: int,
                   fmt: TableFormat) -> None:
    """Print a run's roofline table and its coverage line."""
    found = compute_roofline(loaded, key, device, rank)
    table = found.table.head(limit) if limit else found.table
    if fmt is not TableFormat.TABLE:
        write_table(table, "", fmt)
        print(coverage_line(found), file=sys.stderr)
        return
    shown = pd.DataFrame({header: _cells(column, table[column]) for column, header in _SHOWN
                          if not (column == "shapes" and key is not RooflineKey.OP)})
    title = f"{loaded.path.name}: roofline by {key} on {found.device.name} ({loaded.status})"
    write_table(shown, title, fmt, sort="time_ns", keep=["% of roof", "Bound", "Math mode", "FLOP/s"])
    print(coverage_line(found))


def _cells(column: str, values: pd.Series) -> list[object]:
    if column == "time_ns":
        return list(values)
    if column in ("flops", "bytes"):
        return [si(v) for v in values]
    if column in ("flop_rate", "byte_rate"):
        return [si(v, "/s") for v in values]
    if column in ("intensity", "roof_pct"):
        return ["-" if v != v else f"{v:.2f}" for v in values]
    return [str(v) for v in values]
