"""``dlprof tta``: time, steps, samples and epochs to a target accuracy, per run and MLPerf's score."""

from __future__ import annotations

import json

import click

from dlprof.analysis.tta import (
    MLPERF_DROPPED,
    OlympicMean,
    Target,
    TimeToTarget,
    olympic_mean,
    time_to_target,
)
from dlprof.cli.common import UsageError, engine_option, open_run, runs_dir_option
from dlprof.cli.table_options import format_option
from dlprof.keys import TableFormat
from dlprof.viewers.terminal import write_table

# The exit status when a run never reached the target: apart from 0 (all did), 1 (a failure)
# and 2 (bad input), so that a script can tell them apart.
NOT_REACHED = 3

HELP = f"""Time to a target accuracy: when a logged metric first reached it, with the steps,
samples and epochs it took and the share of that time spent in evaluation; over several runs,
MLPerf's score (the olympic mean: the fastest and slowest runs dropped, the rest averaged; a run
that never reached the target counts as a slowest one).

RUN... are run directories (by default the newest under ./dlprof-runs). The values come from
the run's series table: dlprof.log(eval_accuracy=...) in the program, or under `dlprof run` a
Keras fit's logs (val_accuracy, val_loss...) and MLPerf's :::MLLOG lines, with no change to the
program. Time counts from MLPerf's run_start where logged, else from the start of profiling.
Only the first crossing counts.

Exit status {NOT_REACHED} when a run never reached the target.

\b
Examples:
  dlprof tta RUN --target "eval_accuracy>=0.759"
  dlprof tta runs/r1 runs/r2 runs/r3 runs/r4 runs/r5 --target "eval_accuracy>=0.759"
  dlprof tta RUN --target "val_loss<0.3"           # a Keras fit's validation loss
  dlprof tta runs/* --target "mean_dice>=0.908" --drop 4   # UNet3D drops 4 at each end
  dlprof tta RUN --target "eval_accuracy>=0.759" --format json
"""


@click.command("tta", help=HELP)
@click.argument("runs", nargs=-1, metavar="[RUN]...")
@click.option("--target", "target_text", required=True, metavar="METRIC>=VALUE",
              help="The metric and the value it must reach (>=, >, <=, <).")
@click.option("--drop", type=click.IntRange(min=0), default=MLPERF_DROPPED, show_default=True,
              help="Runs dropped at each end for the olympic mean (MLPerf: 1; UNet3D: 4).")
@format_option(help_text="A table for a person, or CSV (one row per run) or JSON for a script.")
@runs_dir_option
@engine_option
def command(runs: tuple[str, ...], target_text: str, drop: int, fmt: str) -> int:
    try:
        target = Target.parse(target_text)
    except ValueError as error:
        raise UsageError(str(error)) from None
    results = []
    for path in runs or (None,):
        try:
            results.append(time_to_target(open_run(path), target))
        except ValueError as error:
            raise UsageError(str(error)) from None
    summary = olympic_mean(results, drop)
    print_results(results, summary, target, TableFormat(fmt))
    return 0 if all(r.reached for r in results) else NOT_REACHED


def _row(result: TimeToTarget) -> dict[str, object]:
    share = result.eval_share
    return {
        "run": result.run, "reached": result.reached, "seconds": result.seconds, "steps": result.steps,
        "samples": result.samples, "epochs": result.epochs, "value": result.value,
        "eval_seconds": result.eval_seconds, "eval_pct": None if share is None else 100.0 * share,
        "best": result.best, "from": result.origin,
    }


def print_results(results: list[TimeToTarget], summary: OlympicMean, target: Target, fmt: TableFormat) -> None:
    """Print each run's figures and, over several runs, the olympic mean."""
    import pandas as pd

    rows = [_row(r) for r in results]
    if fmt is TableFormat.JSON:
        print(json.dumps({"target": str(target), "runs": rows, "olympic_mean": {
            "seconds": summary.seconds, "kept": summary.kept, "dropped_fastest": summary.dropped_fastest,
            "dropped_slowest": summary.dropped_slowest, "not_reached": summary.not_reached,
            "drop": summary.drop}}, indent=1))
        return
    if fmt is TableFormat.CSV:
        write_table(pd.DataFrame(rows), "", fmt)
        return
    shown = pd.DataFrame([{
        "Run": r.run, "Reached": "yes" if r.reached else f"no (best {r.best:g})",
        "Time (s)": _number(r.seconds, ".1f"), "Steps": _number(r.steps, "d"),
        "Samples": _number(r.samples, ",d"), "Epochs": _number(r.epochs, "g"),
        "Value": _number(r.value, "g"), "Eval (s)": f"{r.eval_seconds:.1f}",
        "Eval %": _number(None if r.eval_share is None else 100 * r.eval_share, ".1f"), "From": r.origin,
    } for r in results])
    write_table(shown, f"time to {target}", fmt, keep=["Reached", "Time (s)", "Eval %"])
    if len(results) > 1:
        print(_summary_line(summary))


def _number(value: float | int | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _summary_line(summary: OlympicMean) -> str:
    """MLPerf's score in words, with what was dropped."""
    if summary.seconds is None:
        why = (f"{summary.not_reached} runs never reached the target (at most {summary.drop} may)"
               if summary.not_reached > summary.drop else "too few runs to drop the fastest and slowest")
        return f"olympic mean: none ({why})"
    dropped = f"dropped {summary.dropped_fastest} fastest, {summary.dropped_slowest} slowest"
    if summary.not_reached:
        dropped += f" and {summary.not_reached} that never reached the target"
    return f"olympic mean: {summary.seconds:.1f} s over {summary.kept} runs ({dropped})"
