"""``dlprof diff RUN_A RUN_B``: two runs compared op by op and kernel by kernel, and a CI gate."""

from __future__ import annotations

import json
import re
import sys

import click
import pandas as pd

from dlprof.analysis.aggregate import kinds_present
from dlprof.analysis.diff import (
    DEFAULT_KINDS,
    Change,
    RankPair,
    choose_basis,
    cost_diff,
    diff,
    energy_diff,
    limit_names,
    regressed,
    work_steps,
)
from dlprof.cli.common import UsageError, check_rank, engine_option, open_run, runs_dir_option
from dlprof.cli.energy_columns import price_option
from dlprof.cli.table_options import format_option, kind_option, limit_option, wide_option
from dlprof.keys import DiffBasis, TableFormat
from dlprof.store.reader import Run
from dlprof.viewers.diff import energy_lines, render_diff
from dlprof.viewers.names import short_name
from dlprof.viewers.screen import printable
from dlprof.viewers.terminal import time_text, time_unit, write_table

HELP = """Compare two runs op by op and kernel by kernel: calls, time, average time per call
and share of each name in A and in B, and the change, largest first; names new in B or gone
from A are listed as such.

RUN_A is the baseline, RUN_B the run compared with it: each a run directory or the name of one
under --dir (./dlprof-runs). Imported traces compare like profiled runs.

\b
What is compared:
  time      a name's slices' durations summed, nested work included
  total     per kind, each instant once (a slice inside one of its own kind is not added)
  share     a name's time as a percentage of its kind's total in that run
  per step  times and calls divided by each run's number of steps (steps holding work),
            the default when both runs have steps; --per run compares whole-run totals
  energy    where the runs recorded GPU power (the nvml collector): joules per counted
            step and mean watts, A -> B, under the tables

\b
--fail-above PCT makes the command a gate: exit status 1 when a kind's total or any name
regressed by more than PCT, that is when
  time in B > time in A x (1 + PCT/100)  and  time in B - time in A >= --min-time
(times per step or per run, as compared). A name new in B has time 0 in A: it regresses
once its time reaches --min-time. A vanished name never regresses. The regressions are
listed on stderr; the table still goes to stdout.

\b
-f json gives {"rows": [...], "energy": ..., "cost": ...}: the table's rows; each run's joules
and watts per counted step and their change in percent (null when neither run recorded power);
the cost of a counted step in each at --price-per-hour (null without a price).

\b
Exit status: 0 compared (no regression), 1 regression found (with --fail-above),
2 bad input (a run that cannot be read, an unknown kind or rank).

\b
Examples:
  dlprof diff before after                        # ops and kernels, per step
  dlprof diff before after --kind kernel -n 40    # the 40 largest kernel changes
  dlprof diff before after --per run              # whole-run totals
  dlprof diff a b --rank 0                        # rank 0 of both runs
  dlprof diff a b --rank 3:1                      # rank 3 of A against rank 1 of B
  dlprof diff base new --fail-above 5 --min-time 200us   # CI: fail on a >5% slowdown
  dlprof diff before after --wide                 # every column and whole names
  dlprof diff before after -f json                # every column, for scripts
  dlprof diff before after --price-per-hour 2.5   # and the cost of a step in each
  dlprof diff --dir runs before after             # runs named under runs/
"""

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s)?\s*")


class Duration(click.ParamType[int]):
    """A time with its unit (``50us``, ``0.2ms``, ``1s``), as integer nanoseconds."""

    name = "time"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        match = _DURATION.fullmatch(str(value))
        if match is None or (match.group(2) is None and float(match.group(1)) != 0):
            self.fail(f"{value!r} is not a time with a unit, such as 50us, 0.2ms or 1s", param, ctx)
        return round(float(match.group(1)) * _UNITS_NS[match.group(2) or "ns"])


@click.command("diff", help=HELP)
@click.argument("run_a", metavar="RUN_A")
@click.argument("run_b", metavar="RUN_B")
@kind_option("Kind of slice to compare, one section each; repeat it for several (any kind in the runs) "
             "[default: op and kernel, those the runs hold].")
@click.option("--per", type=click.Choice([str(b) for b in DiffBasis], case_sensitive=False), default=None,
              help="Compare per step or whole-run totals [default: step when both runs have steps].")
@click.option("--rank", "rank_text", default=None, metavar="N|A:B",
              help="Only rank N of both runs, or rank A of RUN_A against rank B of RUN_B [default: all ranks, "
              "summed, each rank's steps counted, so per step means per step of one rank].")
@click.option("--fail-above", "fail_above", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Exit 1 when the total or any name regressed by more than PCT percent (see above).")
@click.option("--min-time", "min_ns", type=Duration(), default="50us", show_default=True,
              help="Noise floor for --fail-above: a smaller increase is never a regression.")
@limit_option("Names per kind", note="The gate always checks every name.")
@format_option(help_text="Tables for a person, or every column as CSV or JSON for a script.")
@wide_option
@runs_dir_option
@price_option
@engine_option
def command(run_a: str, run_b: str, kinds: tuple[str, ...], per: str | None, rank_text: str | None,
            fail_above: float | None, min_ns: int, limit: int, fmt: str, price_per_hour: float | None) -> int:
    runs = (open_run(run_a), open_run(run_b))
    ranks = _ranks(rank_text, runs)
    compared = _kinds(kinds, runs, ranks)
    try:
        basis = choose_basis(*runs, ranks=ranks, requested=DiffBasis(per) if per else None)
        table = diff(*runs, kinds=compared, per=basis, ranks=ranks)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if fail_above is not None:
        table["regressed"] = regressed(table, fail_above, min_ns)
    energy = energy_diff(*runs, ranks=ranks)
    costs = None if price_per_hour is None else cost_diff(*runs, price_per_hour, ranks=ranks)
    if TableFormat(fmt) is TableFormat.TABLE:
        render_diff(table, _heading(runs, ranks, basis), limit)
        for line in energy_lines(energy, costs):
            print(line)
    elif TableFormat(fmt) is TableFormat.JSON:
        rows = json.loads(limit_names(table, limit).to_json(orient="records"))
        print(json.dumps({"rows": rows, "energy": energy.record(), "cost": costs and costs.record()}, indent=1))
    else:
        write_table(limit_names(table, limit), "", TableFormat(fmt))
    if fail_above is None:
        return 0
    return _report_gate(table, fail_above, min_ns, basis)


def _ranks(text: str | None, runs: tuple[Run, Run]) -> RankPair:
    """``--rank N`` or ``--rank A:B`` as a rank per run, each checked against the run."""
    if text is None:
        return (None, None)
    parts = text.split(":")
    if len(parts) > 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise UsageError(f"--rank {text!r}: give a rank (0) or a rank per run (3:1)")
    wanted = (int(parts[0]), int(parts[-1]))
    for run, rank in zip(runs, wanted, strict=True):
        check_rank(run, rank)
    return wanted


def _kinds(asked: tuple[str, ...], runs: tuple[Run, Run], ranks: RankPair) -> tuple[str, ...]:
    """The kinds to compare: those asked for, each in at least one run (a typo would otherwise
    compare nothing), or by default ops and kernels where the runs hold them (a CPU-only run
    has no kernels)."""
    for run in runs:
        if not kinds_present(run):
            raise UsageError(f"{run.path}: the run holds no slices ({run.status})")
    present = [set(kinds_present(run, rank)) for run, rank in zip(runs, ranks, strict=True)]
    wanted = tuple(dict.fromkeys(asked)) or tuple(str(k) for k in DEFAULT_KINDS)
    found = tuple(kind for kind in wanted if any(kind in held for held in present))
    missing = [kind for kind in wanted if kind not in found]
    if missing and (asked or not found):
        listed = "; ".join(f"{run.path.name} has {', '.join(sorted(held))}"
                           for run, held in zip(runs, present, strict=True))
        raise UsageError(f"no slices of kind {', '.join(map(repr, missing))} in either run: {listed}")
    return found


def _heading(runs: tuple[Run, Run], ranks: RankPair, basis: DiffBasis) -> str:
    """The first line of the tables: which runs and ranks, and what the times are per."""
    sides = [f"{letter}: {run.path.name}" + (f" rank {rank}" if rank is not None else "")
             for letter, run, rank in zip("AB", runs, ranks, strict=True)]
    if basis is DiffBasis.STEP:
        steps = [work_steps(run, rank) for run, rank in zip(runs, ranks, strict=True)]
        per = f"times and calls per step (A: {steps[0]} steps, B: {steps[1]})"
    else:
        per = "whole-run totals"
    return f"{sides[0]}  vs  {sides[1]}; {per}; change = B - A, + is slower"


def _report_gate(table: pd.DataFrame, above_pct: float, min_ns: int, basis: DiffBasis) -> int:
    """List the regressions on stderr; 1 when there are any, else 0."""
    floor = _floor_text(min_ns)
    found = table[table["regressed"]]
    if found.empty:
        print(f"dlprof diff: no regression above {above_pct:g}% (increases under {floor} ignored)",
              file=sys.stderr)
        return 0
    per = " per step" if basis is DiffBasis.STEP else ""
    print(f"dlprof diff: {len(found)} regression(s) above {above_pct:g}% "
          f"(increases under {floor} ignored):", file=sys.stderr)
    for row in found.itertuples():
        what = f"{row.kind} total" if row.status == Change.TOTAL else f"{row.kind} {short_name(str(row.name))}"
        growth = "new" if row.status == Change.NEW else f"{row.delta_pct:+.1f}%"
        # One unit for both sides: "7,923.444 us -> 12.865 ms" reads as a drop.
        unit = time_unit([row.time_a_ns, row.time_b_ns])
        print(printable(f"  {what}: {time_text(row.time_a_ns, unit)} -> {time_text(row.time_b_ns, unit)}{per} "
                        f"({growth})"), file=sys.stderr)
    return 1


def _floor_text(ns: int) -> str:
    """The noise floor as it was most likely written: ``50 us``, ``1 ms``."""
    for unit in ("s", "ms", "us"):
        if ns >= _UNITS_NS[unit]:
            return f"{ns / _UNITS_NS[unit]:g} {unit}"
    return f"{ns} ns"


