"""``dlprof gpu``: how busy each GPU was, per training step, and how long kernels waited to start."""

from __future__ import annotations

import click

from dlprof.analysis.gpu import ALL, gpu_breakdown
from dlprof.cli.common import (
    UsageError,
    check_rank,
    engine_option,
    open_run,
    rank_option,
    run_argument,
    runs_dir_option,
)
from dlprof.cli.table_options import format_option, wide_option
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.viewers.terminal import readable_columns, write_table

HELP = """Show each GPU's busy and idle time per training step, what kept it busy, and
kernel launch delays.

RUN is a run directory, or the name of one under --dir; by default the newest there.

Busy time is the union of the GPU's kernels, memcpy and memset (work overlapping on several
streams counts once); idle time is the rest of the step's window on that GPU. Work belongs to
the step in which the CPU launched it. Launch delay is a kernel's start minus the start of the
runtime call that launched it. The row "all" covers each GPU from its first work to its last.

\b
Examples:
  dlprof gpu                        # the newest run
  dlprof gpu RUN --rank 1           # one rank of a distributed run
  dlprof gpu RUN -f csv             # every column, for a spreadsheet
  dlprof gpu RUN -f json            # for scripts
"""

# The two tables a person sees: (column in the breakdown, header), in order.
_TIME_COLUMNS = [("span_ns", "Window"), ("busy_ns", "Busy"), ("idle_ns", "Idle")]
_SHARE_COLUMNS = [
    ("busy_pct", "Busy %"),
    ("kernel_pct", "Kernel %"),
    ("memcpy_pct", "Memcpy %"),
    ("memset_pct", "Memset %"),
]
_COUNT_COLUMNS = [("kernels", "Kernels"), ("memcpys", "Memcpy"), ("memsets", "Memset")]
_DELAY_COLUMNS = [
    ("delay_mean_ns", "Mean"),
    ("delay_p50_ns", "p50"),
    ("delay_p95_ns", "p95"),
    ("delay_max_ns", "Max"),
]


@click.command("gpu", help=HELP)
@run_argument
@rank_option
@format_option()
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, rank: int | None, fmt: str) -> int:
    loaded = open_run(run)
    print_gpu(loaded, rank=rank, fmt=TableFormat(fmt))
    return 0


def print_gpu(loaded: Run, rank: int | None = None, fmt: TableFormat = TableFormat.TABLE) -> None:
    """Print a run's GPU breakdown, or fail with one line saying why there is none."""
    check_rank(loaded, rank)
    table = gpu_breakdown(loaded, rank)
    if table.empty:
        where = f" on rank {rank}" if rank is not None else ""
        raise UsageError(
            f"{loaded.path}: no GPU activity{where} (no kernel, memcpy or memset slices); "
            "profile on a GPU or import a trace recorded on one"
        )
    if fmt is not TableFormat.TABLE:
        write_table(table, "", fmt)
        return
    keys = ["device", "step"] if table["rank"].nunique() == 1 else ["rank", "device", "step"]
    name = f"{loaded.path.name} ({loaded.status})"
    write_table(
        readable_columns(table, keys, [_TIME_COLUMNS, _SHARE_COLUMNS, _COUNT_COLUMNS]),
        f"{name}: GPU time per step (window = the step's span on the GPU; {ALL}: whole run)",
        fmt,
    )
    delays = readable_columns(table, keys, [[("launches", "Kernels launched")], _DELAY_COLUMNS])
    write_table(delays, f"{name}: kernel launch delay (kernel start - runtime call start)", fmt)
