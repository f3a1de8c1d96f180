"""``dlprof tree``: tfprof's scope and code views, op time down a hierarchy of scopes or frames."""

from __future__ import annotations

import click

from dlprof.analysis.aggregate import kinds_present
from dlprof.analysis.trees import tree
from dlprof.cli.common import (
    FiniteFloatRange,
    UsageError,
    check_rank,
    engine_option,
    open_run,
    rank_option,
    run_argument,
    runs_dir_option,
    within_option,
)
from dlprof.cli.nesting_note import print_nesting_note
from dlprof.cli.table_options import format_option, wide_option
from dlprof.keys import Kind, TableFormat, TreeView
from dlprof.store.reader import Run
from dlprof.viewers.tfprof_text import write_tree

HELP = """Show where op time goes down a tree: name scopes or layers (--view scope), or the
Python code that ran the ops (--view code), with each node's total and self time.

RUN is a run directory, or the name of one under --dir; by default the newest there.

A node's time is the execution time of the ops under it (an op's CPU time less the ops nested
in it, plus the device time of what it launched), as tfprof counts it; self time is that of the
ops directly in the node. The scope view uses TensorFlow's name scopes, or PyTorch's module
paths (layer slices of the layers collector). The code view needs Python stacks: record them
with `dlprof run --with-stack` (PyTorch) or TensorFlow's Python tracer.

\b
Examples:
  dlprof tree                               # scopes or layers of the newest run
  dlprof tree RUN --view code --depth 12    # the Python call paths of the ops
  dlprof tree --min-percent 5               # only nodes with 5% of the time or more
  dlprof tree RUN --rank 1 -f json          # one rank, for scripts (node/parent numbers)
  dlprof tree --within eval                 # only the ops inside the region (or step) named eval
"""


@click.command("tree", help=HELP)
@run_argument
@click.option("--view", type=click.Choice([str(v) for v in TreeView], case_sensitive=False),
              default=str(TreeView.SCOPE), show_default=True,
              help="scope: name scopes or module paths; code: Python file:line:function.")
@click.option("--depth", type=click.IntRange(min=1), default=None,
              help="Levels to show below the root (default: all).")
@click.option("--min-percent", "min_percent", type=FiniteFloatRange(0, 100), default=1.0,
              show_default=True, help="Hide nodes with less of the total time (and what is below them).")
@rank_option
@within_option("Only ops")
@format_option(help_text="A drawn tree for a person, CSV or JSON rows for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, view: str, depth: int | None, min_percent: float, rank: int | None,
            within: str | None, fmt: str) -> int:
    loaded = open_run(run)
    print_tree(loaded, TreeView(view), depth, min_percent, rank, TableFormat(fmt), within)
    return 0


def print_tree(loaded: Run, view: TreeView, depth: int | None = None, min_percent: float = 1.0,
               rank: int | None = None, fmt: TableFormat = TableFormat.TABLE, within: str | None = None) -> None:
    """Print a run's scope or code tree, or fail with one line saying what the run lacks."""
    check_rank(loaded, rank)
    where = f" on rank {rank}" if rank is not None else ""
    kinds = set(kinds_present(loaded, rank))
    if Kind.OP not in kinds:
        raise UsageError(f"{loaded.path}: no ops{where} to attribute ({loaded.status})")
    if view is TreeView.CODE and Kind.PYTHON not in kinds:
        raise UsageError(
            f"{loaded.path}: no Python stacks{where}; record them with dlprof run --with-stack "
            "(PyTorch) or TensorFlow's Python tracer"
        )
    table = tree(loaded, view, rank=rank, max_depth=depth, min_percent=min_percent, within=within)
    root = table.iloc[0]
    if within is not None and not root["ops"]:
        raise UsageError(f"{loaded.path}: no ops{where} inside a slice named {within!r}")
    if view is TreeView.SCOPE and len(table) == 1 and root["self_ns"] == root["total_ns"]:
        raise UsageError(
            f"{loaded.path}: no name scopes or module slices around the ops{where}; for PyTorch, "
            "profile with the layers collector (dlprof run --collectors torch,layers)"
        )
    inside = f" within {within}" if within is not None else ""
    title = f"{loaded.path.name}: {view} view, op time per node{inside} ({loaded.status})"
    write_tree(table, title, fmt)
    if fmt is TableFormat.TABLE:
        print_nesting_note(loaded)
