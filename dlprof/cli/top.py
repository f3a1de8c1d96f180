"""``dlprof top``: the flat profile of one kind of slice, as tfprof's and TAU's tables."""

from __future__ import annotations

import sys
from enum import StrEnum

import click

from dlprof.analysis.aggregate import SORT_COLUMN, default_sort, kinds_present, top_rows
from dlprof.cli.common import (
    AliasedChoice,
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
from dlprof.cli.table_options import format_option, kind_option, limit_option, wide_option
from dlprof.engine.rows import Rows
from dlprof.keys import SORT_KEY_ALIASES, GroupKey, Kind, SortKey, TableFormat
from dlprof.store.manifest import degraded_line
from dlprof.store.reader import Run
from dlprof.viewers.screen import wrapped
from dlprof.viewers.terminal import write_table

HELP = """Show the most expensive ops, layers, regions, steps or kernels of a run.

RUN is a run directory, or the name of one under --dir; by default the newest there.
Several --kind give a table each (a CSV or JSON table with a kind column).

On a run with GPU work, rows are sorted by device time unless --by says otherwise: Device is the
time of the kernels, copies and memsets launched inside the row's slices (an op's children's
work, a layer's backward on autograd's thread, a step's or region's on every thread of its
process), Self device the part of it outside the slices of the same kind inside them.

\b
Examples:
  dlprof top                             # ops by device time (GPU runs) or total time
  dlprof top --by total                  # ops by total time, newest run
  dlprof top --kind module --by self     # layers by their time outside the layers inside them
  dlprof top --kind module --leaves      # the layers that hold no other layer
  dlprof top --kind kernel --kind memcpy # a table per kind
  dlprof top --kind compile              # torch.compile's compile phases (not ops)
  dlprof top --within eval               # ops inside the region (or any slice) named eval
  dlprof top --group-by shape -n 30      # one row per op and input shapes
  dlprof top RUN --per-rank              # each row's least, median and most time over ranks
  dlprof top --by total --group-by type  # tfprof's op view: bytes, times, occurrence per op type
  dlprof top --dir runs --rank 1         # the newest run under runs/, rank 1 only
  dlprof top RUN --wide                  # every column and whole names, however wide
  dlprof top RUN -f json                 # for scripts
  dlprof top RUN --engine spark          # the same table, computed by Apache Spark
"""


def _choice(keys: type[StrEnum]) -> click.Choice[str]:
    return click.Choice([str(k) for k in keys], case_sensitive=False)


@click.command("top", help=HELP)
@run_argument
@click.option("--by", "by", type=AliasedChoice([str(k) for k in SortKey], SORT_KEY_ALIASES),
              default=None,
              help="Sort key: total time, self time, calls, bytes allocated, FLOPs, device time "
                   "(micros: tfprof's name for total). Default: device on a run with GPU work, else total.")
@kind_option("Kind of slice: op, module, region, step, kernel, ... (any kind in the run); repeat it "
             "for a table per kind.", default=(str(Kind.OP),))
@click.option("--group-by", "group_by", type=_choice(GroupKey), default=GroupKey.NAME.value,
              show_default=True, help="One row per name, per name and input shapes, (device work) per launching op, or per "
                   "op type (tfprof's op view).")
@limit_option("Rows to show")
@rank_option
@click.option("--per-rank", is_flag=True,
              help="Add each row's least, median and most total time over the ranks, and the rank with the most.")
@within_option("Only slices")
@click.option("--leaves", is_flag=True, help="Layers (--kind module) with no layer inside them.")
@format_option(help_text="Table for a person, CSV or JSON for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, by: str | None, kinds: tuple[str, ...], group_by: str, limit: int, rank: int | None,
            per_rank: bool, within: str | None, leaves: bool, fmt: str) -> int:
    loaded = open_run(run)
    sort = SortKey(by) if by is not None else default_sort(loaded)
    wanted = tuple(dict.fromkeys(kinds))
    table_format = TableFormat(fmt)
    if len(wanted) > 1 and table_format is not TableFormat.TABLE:
        _write_kinds(loaded, wanted, sort, GroupKey(group_by), limit, rank, table_format,
                     per_rank, within, leaves)
        return 0
    for kind in wanted:
        print_top(loaded, kind=kind, by=sort, group_by=GroupKey(group_by), limit=limit, rank=rank,
                  fmt=table_format, per_rank=per_rank, within=within, leaves=leaves)
    if table_format is TableFormat.TABLE:
        print_nesting_note(loaded)
    return 0


def _write_kinds(loaded: Run, kinds: tuple[str, ...], by: SortKey, group_by: GroupKey, limit: int,
                 rank: int | None, fmt: TableFormat, per_rank: bool, within: str | None, leaves: bool) -> None:
    """Several kinds' tables as one CSV or JSON table, a ``kind`` column first: one document a
    script can read, where tables one after another would not be."""
    if group_by is GroupKey.TYPE:
        raise UsageError("--group-by type is tfprof's op view, of ops: give one --kind")
    for kind in kinds:
        _check_kind(loaded, kind)
    check_rank(loaded, rank)
    columns: list[str] = ["kind"]
    tables: list[tuple[str, Rows]] = []
    for kind in kinds:
        try:
            table = top_rows(loaded, kind=kind, by=by, group_by=group_by, limit=limit or None, rank=rank,
                             per_rank=per_rank, within=within, leaves=leaves)
        except ValueError as error:
            raise UsageError(str(error)) from None
        columns += [c for c in table.columns if c not in columns]
        tables.append((kind, table))
    rows = [tuple(kind if c == "kind" else dict(zip(table.columns, row, strict=True)).get(c) for c in columns)
            for kind, table in tables for row in table.rows]
    write_table(Rows(tuple(columns), rows), "", fmt)


def _check_kind(loaded: Run, kind: str) -> None:
    """Fail with one line saying what the run holds when it holds no slices of ``kind``."""
    present = kinds_present(loaded)
    if not present:
        raise UsageError(f"{loaded.path}: the run holds no slices ({loaded.status})")
    if kind not in present:
        raise UsageError(
            f"{loaded.path}: no slices of kind {kind!r}; this run has: {', '.join(present)}"
        )


def print_top(loaded: Run, kind: str, by: SortKey | None, group_by: GroupKey, limit: int,
              rank: int | None = None, fmt: TableFormat = TableFormat.TABLE,
              per_rank: bool = False, within: str | None = None, leaves: bool = False,
              state: str | None = None) -> None:
    """Print a run's top table, or fail with one line saying what the run holds instead.

    ``by`` None sorts as :func:`dlprof.analysis.aggregate.default_sort` says. ``state`` is what
    the title says of the run in its parentheses; the run's status when None.
    """
    by = by if by is not None else default_sort(loaded)
    if per_rank and group_by is GroupKey.TYPE:
        raise UsageError("--per-rank: not with --group-by type (tfprof's op view)")
    _check_kind(loaded, kind)
    check_rank(loaded, rank)
    if group_by is GroupKey.TYPE:
        if within is not None or leaves:
            raise UsageError("--group-by type (tfprof's op view): not with --within or --leaves")
        _print_op_view(loaded, kind, by, limit, rank, fmt)
        return
    try:
        table = top_rows(loaded, kind=kind, by=by, group_by=group_by, limit=limit or None, rank=rank,
                         per_rank=per_rank, within=within, leaves=leaves)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if within is not None and not table.rows:
        raise UsageError(f"{loaded.path}: no {kind} slices inside a slice named {within!r}")
    where = f" within {within}" if within is not None else ""
    title = f"{loaded.path.name}: top {'leaf ' if leaves else ''}{kind} by {by}{where} ({state or loaded.status})"
    if kind == Kind.STEP and fmt is TableFormat.TABLE:
        table, title = _flag_uncounted_steps(loaded, table, title, rank)
    if fmt is TableFormat.TABLE:
        _say_degraded(loaded)
    write_table(table, title, fmt, sort=SORT_COLUMN[by])


def _say_degraded(loaded: Run) -> None:
    """A line above the table of a run whose recording is not whole: without it, the table of a
    run whose torch collector failed reads as the whole profile."""
    if loaded.manifest.degraded:
        line = degraded_line(loaded.manifest.degraded)
        click.echo(wrapped(f"degraded: recording not whole: {line}", sys.stdout, indent="  "))


def _flag_uncounted_steps(loaded: Run, table: Rows, title: str, rank: int | None) -> tuple[Rows, str]:
    """Steps as ``dlprof steps`` counts them: the warm-up and the partial step marked, so the step
    open when profiling stopped is not read as the slowest training step."""
    from dlprof.analysis.steps import uncounted_steps

    flags = uncounted_steps(loaded, rank)
    if not flags:
        return table, title
    at = table.columns.index("name")
    rows = [(*row[:at], f"{row[at]} [{flags[row[at]]}]" if row[at] in flags else row[at], *row[at + 1:])
            for row in table.rows]
    note = "; [partial]: open when profiling stopped, [warm-up]: the first step; `dlprof steps` leaves both out"
    return Rows(table.columns, rows), title + note


def _print_op_view(loaded: Run, kind: str, by: SortKey, limit: int, rank: int | None,
                   fmt: TableFormat) -> None:
    """tfprof's op view: requested bytes, total, accelerator and CPU time, occurrence per op type."""
    from dlprof.analysis.tfprof import op_view
    from dlprof.viewers.tfprof_text import write_op_view

    if kind != Kind.OP:
        raise UsageError(f"--group-by type is tfprof's op view, of ops: drop --kind {kind}")
    try:
        table = op_view(loaded, by=by, limit=limit or None, rank=rank)
    except ValueError as error:
        raise UsageError(str(error)) from None
    title = (f"{loaded.path.name}: op view by {by}, value (this row and below %, own %) "
             f"({loaded.status})")
    if fmt is TableFormat.TABLE:
        _say_degraded(loaded)
    write_op_view(table, title, fmt, by=by)
