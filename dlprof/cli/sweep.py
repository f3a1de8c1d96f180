"""``dlprof sweep``: profile a grid of fully connected, convolutional and recurrent models
(ParaDnn) and place each on the roofline."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pandas as pd

from dlprof.analysis.run_device import UnknownDevice
from dlprof.analysis.sweep import FIGURE_COLUMNS, PointFigures, point_figures, sweep_chart
from dlprof.cli.common import UsageError, output_option, progress_bar, runs_dir, runs_dir_option
from dlprof.cli.roofline import si
from dlprof.cli.table_options import format_option, wide_option
from dlprof.keys import TableFormat
from dlprof.store.new_run import RunExistsError, prepare_run_dir
from dlprof.store.reader import load
from dlprof.store.safe_files import atomic_files, os_error_text
from dlprof.text import printable
from dlprof.viewers.roofline_svg import roofline_svg
from dlprof.viewers.terminal import readable_columns, write_table
from dlprof.workloads.paradnn import WARMUP_STEPS, Family, Point, grid, profile_point, warm_up_profiler
from dlprof.workloads.torch_device import DeviceType, torch_device

HELP = f"""Profile a grid of fully connected, convolutional and recurrent models (ParaDnn).

Each point of the grid is one model trained on random data (forward, cross-entropy loss, backward,
SGD step): {WARMUP_STEPS} warm-up steps, not recorded, then --steps profiled steps, written as a run
named <family>-l<layers>-w<width>-b<batch>-i<input> in the output directory. Each run becomes one
point on the roofline of this machine: FLOPs per step (the ops' FLOPs from their shapes), bytes
per step (their compulsory traffic), intensity (FLOPs per byte), the achieved rate (FLOPs per step
over the median step time), the percent of the roof at that intensity and the bound. The output
directory also gets summary.csv, summary.json and roofline.svg (one dot per model).

\b
What width and input mean per family:
  fc   width: units per layer;  input: features
  cnn  width: channels (3x3 convolutions, no pooling between them);  input: image side
  rnn  width: LSTM hidden units (and input features);  input: sequence length

\b
Examples:
  dlprof sweep --quick                              # a small grid, seconds per model on a CPU
  dlprof sweep --family fc --layers 2,4 --width 64,256,1024 --batch 64
  dlprof sweep --family cnn --width 16,64 --input 32 -o sweeps/cnn
  dlprof sweep --quick --format csv > summary.csv   # the summary for a script
  dlprof sweep --device-type cuda                   # the first GPU
"""

QUICK = {"layers": [2], "width": [16, 32], "batch": [8], "input": [8]}
QUICK_STEPS = 3
SUMMARY_FILES = ("summary.csv", "summary.json", "roofline.svg")
_SHOWN = [("family", "Family"), ("layers", "Layers"), ("width", "Width"), ("batch", "Batch"), ("input", "Input"),
          ("params", "Params"), ("step_ns", "Step"), ("flops", "FLOPs/step"), ("intensity", "FLOP/B"),
          ("gflop_rate", "GFLOP/s"), ("roof_pct", "% of roof"), ("bound", "Bound")]


def _integers(_context: click.Context, parameter: click.Parameter, value: str | None) -> list[int] | None:
    """A comma list of positive integers, or None when not given."""
    if value is None:
        return None
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected a comma list of positive integers (e.g. 2,4)") from None
    if not numbers or any(n < 1 for n in numbers):
        raise click.BadParameter(f"{value!r}: every value must be a positive integer")
    return sorted(set(numbers))


def _grid_option(name: str, dest: str, default: str, meaning: str) -> Callable[..., Any]:
    return click.option(f"--{name}", dest, callback=_integers, default=None, metavar="N[,N...]",
                        help=f"{meaning} (comma list). Default: {default}; --quick: "
                             f"{','.join(map(str, QUICK[name]))}.")


@click.command("sweep", help=HELP)
@click.option("--family", "families", multiple=True, type=click.Choice([str(f) for f in Family], case_sensitive=False),
              help="Model families, repeatable. Default: fc, cnn and rnn.")
@_grid_option("layers", "layers", "2,4", "Layers per model")
@_grid_option("width", "widths", "64,256", "Units (fc), channels (cnn) or hidden units (rnn)")
@_grid_option("batch", "batches", "16,64", "Batch sizes")
@_grid_option("input", "inputs", "32,128", "Features (fc), image side (cnn) or sequence length (rnn)")
@click.option("--steps", type=click.IntRange(min=1), default=None, metavar="N",
              help=f"Profiled steps per model, after {WARMUP_STEPS} warm-up steps. Default: 5; --quick: {QUICK_STEPS}.")
@click.option("--device-type", type=click.Choice([str(d) for d in DeviceType], case_sensitive=False),
              default=str(DeviceType.CPU), show_default=True, help="Run on the CPU or the first CUDA device.")
@click.option("--quick", is_flag=True, help="A tiny grid (6 models, 3 steps each): well under a minute on two cores.")
@click.option("--force", is_flag=True, help="Replace the sweep already in the output directory.")
@output_option("Directory for the runs and the summary. Default: a new sweep-<time> under the runs directory.",
               click.Path(file_okay=False, path_type=Path))
@format_option(help_text="Table for a person; the summary as CSV or JSON for a script.")
@wide_option
@runs_dir_option
def command(families: tuple[str, ...], layers: list[int] | None, widths: list[int] | None,
            batches: list[int] | None, inputs: list[int] | None, steps: int | None, device_type: str, quick: bool,
            force: bool, output: Path | None, fmt: str) -> int:
    chosen = [Family(f.lower()) for f in dict.fromkeys(families)] or list(Family)
    base: dict[str, list[int]] = QUICK if quick else {"layers": [2, 4], "width": [64, 256], "batch": [16, 64],
                                                      "input": [32, 128]}
    points = grid(chosen, layers or base["layers"], widths or base["width"], batches or base["batch"],
                  inputs or base["input"])
    try:
        device = torch_device(DeviceType(device_type))
    except ValueError as error:
        raise UsageError(str(error)) from None
    out = output if output is not None else runs_dir() / f"sweep-{time.strftime('%Y%m%d-%H%M%S')}"
    _prepare(out, points, force)
    began = time.perf_counter()
    figures: list[PointFigures] = []
    params: list[int] = []
    with progress_bar() as bar:
        task = bar.add_task("sweep", total=len(points))
        bar.update(task, description="warming the profiler up")
        warm_up_profiler(points[0], device)
        for point in points:
            bar.update(task, description=point.name)
            work = profile_point(point, device, out / point.name, steps or (QUICK_STEPS if quick else 5))
            params.append(work.parameters)
            try:
                figures.append(point_figures(load(out / point.name)))
            except UnknownDevice as error:
                raise UsageError(str(error)) from None
            bar.update(task, advance=1)
    summary = _summary(points, params, figures)
    _write(out, summary, points, figures)
    _print(summary, out, TableFormat(fmt), time.perf_counter() - began, figures[0].device.name)
    return 0


def _prepare(out: Path, points: list[Point], force: bool) -> None:
    """Refuse an output directory that holds anything unless it holds a sweep and --force is given;
    then remove that sweep's runs and summary (nothing else)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"{out}: not a directory; choose another output directory")
    if not out.exists() or not any(out.iterdir()):
        out.mkdir(parents=True, exist_ok=True)
        return
    if not (out / "summary.json").is_file():
        raise UsageError(f"{out}: not empty and not a sweep; choose another output directory")
    if not force:
        raise UsageError(f"{out}: already holds a sweep; pass --force to replace it, or choose another -o")
    try:
        for child in out.iterdir():
            if child.is_dir() and not child.is_symlink():
                prepare_run_dir(child, force=True)  # removes a run; refuses anything else
        for name in SUMMARY_FILES:
            (out / name).unlink(missing_ok=True)
    except RunExistsError as error:
        raise UsageError(str(error)) from None
    for point in points:
        if (out / point.name).exists():
            shutil.rmtree(out / point.name)  # left empty by prepare_run_dir


def _summary(points: list[Point], params: list[int], figures: list[PointFigures]) -> pd.DataFrame:
    rows = [{"family": str(p.family), "layers": p.layers, "width": p.width, "batch": p.batch, "input": p.input,
             "params": n, "run": p.name, **f.row(), "gflop_rate": f.flop_rate / 1e9}
            for p, n, f in zip(points, params, figures, strict=True)]
    columns = ["family", "layers", "width", "batch", "input", "params", "run", *FIGURE_COLUMNS, "gflop_rate"]
    return pd.DataFrame(rows, columns=columns)


def _write(out: Path, summary: pd.DataFrame, points: list[Point], figures: list[PointFigures]) -> None:
    device = figures[0].device.name if figures else ""
    records = json.loads(summary.to_json(orient="records"))
    chart = sweep_chart([p.name for p in points], figures)
    texts = (summary.to_csv(index=False), json.dumps({"device": device, "models": records}, indent=1) + "\n",
             roofline_svg(chart, "models (area: step time)") + "\n")
    try:
        # The three files together or none of them.
        with atomic_files([out / name for name in SUMMARY_FILES]) as partials:
            for partial, text in zip(partials, texts, strict=True):
                partial.write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"{out}: cannot write the summary ({os_error_text(error)})") from None


def _print(summary: pd.DataFrame, out: Path, fmt: TableFormat, seconds: float, device: str) -> None:
    if fmt is not TableFormat.TABLE:
        write_table(summary, "", fmt)
        return
    step = readable_columns(summary, [], [[("step_ns", "Step")]])
    shown = pd.DataFrame({header: step[step.columns[0]] if column == "step_ns" else _cells(column, summary[column])
                          for column, header in _SHOWN})
    shown = shown.rename(columns={"Step": step.columns[0]})
    write_table(shown, f"sweep of {len(summary)} models on {device}: {out}", fmt,
                keep=[step.columns[0], "FLOPs/step", "GFLOP/s", "Bound"])
    print(f"{len(summary)} runs, summary.csv, summary.json and roofline.svg in {printable(out)} ({seconds:.1f} s)")


def _cells(column: str, values: pd.Series) -> list[object]:
    if column == "params":
        return [f"{int(v):,}" for v in values]
    if column == "flops":
        return [si(float(v)) for v in values]
    if column in ("intensity", "gflop_rate", "roof_pct"):
        return ["-" if v != v else f"{v:.2f}" for v in values]
    return list(values)
