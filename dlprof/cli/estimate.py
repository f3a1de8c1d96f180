"""``dlprof estimate``: a run's step time and op times predicted on another device."""

from __future__ import annotations

import json
import sys

import click
import pandas as pd

from dlprof.analysis.efficiency import MeasuredEfficiencies
from dlprof.analysis.estimate import Estimate, Method, estimate
from dlprof.analysis.run_device import named_device
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
from dlprof.hardware.calibration import calibration_path, read_calibrations
from dlprof.keys import TableFormat
from dlprof.store.reader import Run
from dlprof.text import printable
from dlprof.viewers.terminal import time_text, write_table

HELP = """Predict a GPU run's step time and op times on another device.

RUN is a run directory; by default the newest under ./dlprof-runs.

GEMM and convolution kernels scale with the two devices' roofs in each one's math mode (equal
efficiency assumed where the mode is the same); other kernels by Habitat's wave scaling
(--method wave) or by the ratio of the roofs (--method roofline); copies by link bandwidth;
collectives are excluded and listed. Every assumption is printed with the result. A device
calibrated with `dlprof calibrate` is known by its name, and its measured efficiencies replace the
equal-efficiency assumption (the assumptions say so).

\b
Examples:
  dlprof estimate RUN --device v100                    # an A100 run's steps on a V100
  dlprof estimate RUN --device h100 --method roofline  # roof ratios for every kernel
  dlprof estimate RUN --device l4 --format json        # for scripts
"""


@click.command("estimate", help=HELP)
@run_argument
@click.option("--device", "device", required=True, metavar="NAME",
              help="The device to predict for (a100, a100-80gb, h100, h100-pcie, h200, v100, l4, t4, mi250, mi300x).")
@click.option("--method", type=click.Choice([str(m) for m in Method], case_sensitive=False),
              default=str(Method.WAVE), show_default=True,
              help="Model for kernels that are neither GEMMs nor copies: wave scaling or roof ratio.")
@click.option("--source-device", default=None, metavar="NAME",
              help="The device the run ran on, when its recorded GPU is not in the table.")
@rank_option
@limit_option("Ops to show")
@format_option(help_text="Table for a person, CSV (the op table) or JSON (everything) for a script.")
@wide_option
@runs_dir_option
@engine_option
def command(run: str | None, device: str, method: str, source_device: str | None, rank: int | None,
            limit: int, fmt: str) -> int:
    loaded = open_run(run)
    found = compute_estimate(loaded, device, Method(method), source_device, rank)
    print_estimate(loaded, found, limit, TableFormat(fmt))
    return 0


def compute_estimate(loaded: Run, device: str, method: Method, source_device: str | None,
                     rank: int | None) -> Estimate:
    """The run's estimate on ``device``, or one line saying why there is none."""
    check_rank(loaded, rank)
    try:
        measured = MeasuredEfficiencies(read_calibrations(calibration_path()))
        return estimate(loaded, named_device(device), method, rank, efficiencies=measured, source_name=source_device)
    except ValueError as error:
        raise UsageError(str(error)) from None


def _summary(found: Estimate) -> list[str]:
    step, target_step = found.median_step_ns, found.median_target_step_ns
    lines = [f"{found.source.name} -> {found.target.name} ({found.method})"]
    if step is not None and target_step is not None:
        lines.append(f"median step: {time_text(step)} measured -> {time_text(target_step)} predicted "
                     f"({target_step / step:.2f}x)")
        lines.append(_bounds(found))
    else:
        lines.append("median step: the run has no steps")
    lines.append(f"coverage: {100 * found.coverage:.1f}% of device time predicted; "
                 f"{time_text(found.total_ns - found.predicted_ns)} of collectives left as measured")
    lines += [f"warning: {line}" for line in found.warnings]
    return lines


def _bounds(found: Estimate) -> str:
    """What holds the steps back, on the source and on the target: the GPU's busy share of the
    steps (median and quartiles, so that a warm-up or a stalled step does not decide it) and
    the bound most steps have."""
    steps = found.steps
    held = {"host": "host-bound", "GPU": "GPU-bound"}

    def share(column: str) -> str:
        low, median, high = (steps[column].quantile(q) for q in (0.25, 0.5, 0.75))
        return f"{median:.0f}% (quartiles {low:.0f}-{high:.0f}%)"

    source = held[str(steps["bound"].mode().iloc[0])]
    target = held[str(steps["target_bound"].mode().iloc[0])]
    stays = "stays" if source == target else "becomes"
    return (f"critical path: the GPU is busy {share('busy_pct')} of each step on {found.source.name}, "
            f"{source}; on {found.target.name} {share('target_busy_pct')}: the run {stays} {target}")


def print_estimate(loaded: Run, found: Estimate, limit: int, fmt: TableFormat) -> None:
    """Print the estimate: the summary, the op table, the collectives left out, the assumptions."""
    ops = found.ops.head(limit) if limit else found.ops
    if fmt is TableFormat.JSON:
        document = {
            "source": found.source.name, "target": found.target.name, "method": str(found.method),
            "median_step_ns": found.median_step_ns, "median_target_step_ns": found.median_target_step_ns,
            "coverage": found.coverage, "ops": json.loads(found.ops.to_json(orient="records")),
            "steps": json.loads(found.steps.to_json(orient="records")),
            "excluded": json.loads(found.excluded.to_json(orient="records")),
            "assumptions": list(found.assumptions),
        }
        print(json.dumps(document, indent=1))
        return
    if fmt is TableFormat.CSV:
        write_table(ops, "", fmt)
        print("\n".join(_summary(found)), file=sys.stderr)
        return
    print("\n".join(_summary(found)))
    shown = pd.DataFrame({"name": ops["op"], "Input shapes": ops["shapes"], "Calls": ops["calls"],
                          "source_ns": ops["source_ns"], "target_ns": ops["target_ns"],
                          "Method": ops["method"], "Bound": ops["bound"]})
    write_table(shown,
                f"{loaded.path.name}: device time per op on {found.source.name} and {found.target.name}",
                fmt, sort="source_ns", keep=["target_ns", "Method"])
    if len(found.excluded):
        names = ", ".join(f"{n} ({time_text(t)})" for n, t in zip(found.excluded["name"], found.excluded["time_ns"],
                                                                  strict=True))
        print(printable(f"excluded collectives: {names}"))
    print("assumptions:")
    for line in found.assumptions:
        print(f"  - {line}")
