"""``dlprof metrics``: derived metrics, formulas over a run's counters, per slice name or slice."""

from __future__ import annotations

import math
import sys

import click
import pandas as pd

from dlprof.analysis.cupti_names import perfworks_name
from dlprof.analysis.derived import (
    BUILTINS,
    DerivedMetric,
    DerivedTable,
    FormulaError,
    Grouping,
    derived_metrics,
    parse_metric_option,
    source_counters,
)
from dlprof.cli.common import UsageError, engine_option, open_run, run_argument, runs_dir_option
from dlprof.cli.table_options import format_option, kind_option, limit_option, wide_option
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.text import printable
from dlprof.viewers.terminal import write_table

HELP = """Compute derived metrics from a run's counters, per slice name or per slice.

Built in: ipc, warps_per_inst, gld_per_inst, achieved_occupancy, flop_count, flop_rate and
arithmetic_intensity; --list shows each formula, the counters it reads and whether this run has
them. --metric NAME=EXPR adds your own: EXPR may name counters with or without their source
prefix (cupti:smsp__inst_executed.sum, smsp__inst_executed.sum), legacy CUPTI names
(inst_executed, active_warps, active_cycles, gld_request), built-ins, time (the slice's seconds),
flops (the slice's flops column) and max_warps_per_sm, with numbers, + - * / ** and parentheses;
a name with other characters goes in backticks. Per name, counters are summed over the slices
first and the formula is applied to the sums, as ParaProf does.

RUN is a run directory, or the name of one under --dir; by default the newest there.

\b
Examples:
  dlprof metrics                                   # every built-in this run can compute
  dlprof metrics --list                            # formulas, counters, what this run has
  dlprof metrics --metric ipc --group-by slice     # one built-in, one row per slice
  dlprof metrics --metric 'gips=inst_executed / time / 1e9'
  dlprof metrics --kind op --metric 'gflops=flops / time / 1e9'
  dlprof metrics --kind kernel --kind memcpy -n 30 # slices of either kind, 30 rows
  dlprof metrics RUN -f json                       # for scripts
"""

# Where a user's formula names may come from, for the message when one is not found.
_NAME_SOURCES = ("names are the run's counters, with or without their source prefix, legacy CUPTI "
                 "names, built-ins, time, flops and max_warps_per_sm")


@click.command("metrics", help=HELP)
@run_argument
@click.option("--metric", "-m", "options", multiple=True, metavar="NAME[=EXPR]",
              help="A built-in by name, or your own formula; repeat for several. "
                   "Default: every built-in.")
@click.option("--group-by", "group_by", type=click.Choice([str(g) for g in Grouping]),
              default=Grouping.NAME.value, show_default=True,
              help="One row per slice name (counters summed first), or per slice.")
@kind_option("Only slices of any of these kinds (repeatable). Default: every slice with counters.")
@limit_option("Rows to show")
@click.option("--list", "list_only", is_flag=True,
              help="List the metrics with their formulas and counters, and whether this run has them.")
@format_option(help_text="Table for a person, CSV or JSON for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, options: tuple[str, ...], group_by: str, kinds: tuple[str, ...],
            limit: int, list_only: bool, fmt: str) -> int:
    try:
        chosen = [parse_metric_option(option) for option in options] or list(BUILTINS)
    except FormulaError as error:
        raise UsageError(str(error)) from None
    loaded = open_run(run)
    try:
        table = derived_metrics(loaded, chosen, Grouping(group_by), kinds)
    except FormulaError as error:
        raise UsageError(f"{loaded.path}: {error}") from None
    if list_only:
        _write_list(chosen, table, TableFormat(fmt))
        return 0
    if options:
        for metric in chosen:
            if metric.name in table.unavailable:
                reason = table.unavailable[metric.name]
                hint = f"; {_NAME_SOURCES}" if metric.name in table.missing else ""
                raise UsageError(f"--metric {metric.name}: {reason}{hint}")
    elif not table.metrics:
        raise UsageError(_nothing_computable(loaded, table))
    elif table.unavailable:
        print(f"dlprof: not computed for this run: {', '.join(table.unavailable)} "
              "(dlprof metrics --list says why)", file=sys.stderr)
    values = table.values.head(limit) if limit else table.values
    title = f"{loaded.path.name}: derived metrics per {group_by} ({loaded.status})"
    if TableFormat(fmt) is TableFormat.TABLE:
        values = _for_reading(values, table.metrics)
    write_table(values, title, TableFormat(fmt))
    return 0


def _nothing_computable(loaded: Run, table: DerivedTable) -> str:
    """One line: no built-in has values here, and which counters they would need."""
    counters: list[str] = []
    for names in table.missing.values():
        counters += [perfworks_name(n) for n in names if perfworks_name(n) not in counters]
    has_values = bool(loaded.query("SELECT 1 FROM metrics LIMIT 1").rows)
    where = "it lacks their counters" if has_values else "it holds no counter values"
    if not counters:
        reasons = "; ".join(f"{name}: {why}" for name, why in table.unavailable.items())
        return f"{loaded.path}: no built-in metric can be computed for this run ({reasons})"
    return (f"{loaded.path}: no built-in metric can be computed for this run, {where}; missing: "
            f"{', '.join(counters)}")


def _number(value: float) -> str:
    """A value to four significant digits, large ones with an SI prefix; nothing for none."""
    if math.isnan(value):
        return ""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{prefix}"
    return f"{value:.4g}"


def _header(metric: DerivedMetric) -> str:
    # Built-ins show their unit, a user's metric its formula: a person reads what the column is.
    # (Parentheses, not brackets: the table reads brackets as markup.)
    return f"{metric.name} ({metric.unit})" if metric.unit else f"{metric.name} (= {metric.formula})"


def _for_reading(values: pd.DataFrame, metrics: tuple[DerivedMetric, ...]) -> pd.DataFrame:
    """The table with its metric columns as text, each headed by its unit or formula."""
    shown = values.copy()
    for metric in metrics:
        shown[metric.name] = [_number(float(v)) for v in values[metric.name]]
    return shown.rename(columns={m.name: _header(m) for m in metrics})


def _write_list(chosen: list[DerivedMetric], table: DerivedTable, fmt: TableFormat) -> None:
    """Each metric: formula, unit, counters, meaning, and whether this run can compute it."""
    rows = [
        {
            "name": metric.name,
            "unit": metric.unit,
            "formula": metric.formula,
            "counters": ", ".join(source_counters(metric)),
            "description": metric.description,
            "available": metric.name not in table.unavailable,
            "reason": table.unavailable.get(metric.name, ""),
        }
        for metric in chosen
    ]
    if fmt is not TableFormat.TABLE:
        write_table(pd.DataFrame(rows), "derived metrics", fmt)
        return
    for row in rows:
        unit = f" [{row['unit']}]" if row["unit"] else ""
        here = "available in this run" if row["available"] else f"not available: {row['reason']}"
        click.echo(printable(f"{row['name']}{unit}: {row['description']}"))
        click.echo(printable(f"    = {row['formula']}"))
        if row["counters"]:
            click.echo(printable(f"    counters: {row['counters']}"))
        click.echo(f"    {here}")
