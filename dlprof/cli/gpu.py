"""``dlprof gpu``: how busy each GPU was, per training step, and how long kernels waited to start:
the launch's own cost apart from queueing behind earlier work."""

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
how long kernels waited to start: launch cost apart from queueing.

RUN is a run directory, or the name of one under --dir; by default the newest there.

Busy time is the union of the GPU's kernels, memcpy and memset (work overlapping on several
streams counts once); idle time is the rest of the step's window on that GPU. Work belongs to
the step in which the CPU launched it. The row "all" covers each GPU from its first work to its
last.

A kernel's wait from the start of the runtime call that launched it to its own start is two
waits, which add up to it: queueing, while earlier work on its stream was still running (a GPU
busy with earlier work: the host is ahead, nothing to fix there), and launch cost, the rest, from
the later of the call and its stream's being free to the kernel's start (the host's and the
driver's cost: what CUDA graphs and fewer, larger kernels cut). Statistics are over every
launched kernel; Queued counts those that waited behind earlier work.

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

def _wait_columns(prefix: str) -> list[tuple[str, str]]:
    return [(f"{prefix}_{statistic}_ns", header) for statistic, header in
            (("mean", "Mean"), ("p50", "p50"), ("p95", "p95"), ("max", "Max"))]


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
    launch = readable_columns(table, keys, [[("launches", "Kernels launched")], _wait_columns("launch")])
    write_table(launch, f"{name}: kernel launch cost (from the runtime call's start, or from the stream's "
                "being free if later, to the kernel's start)", fmt)
    queue = readable_columns(table, keys, [[("queued", "Queued")], _wait_columns("queue")])
    write_table(queue, f"{name}: kernel queueing (waiting behind earlier work on its stream)", fmt)
