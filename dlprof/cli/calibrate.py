"""``dlprof calibrate``: measure this machine's ceilings and efficiencies, and keep them as a
measured device row."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import click
import pandas as pd

from dlprof.analysis.efficiency import efficiency_buckets
from dlprof.cli.common import UsageError, progress_bar
from dlprof.cli.roofline import si
from dlprof.cli.table_options import format_option, wide_option
from dlprof.hardware.calibration import (
    CALIBRATION_VARIABLE,
    Calibration,
    calibration_path,
    calibrations_text,
    read_calibrations,
    replaced,
)
from dlprof.hardware.devices import Precision, Vendor, device_table
from dlprof.keys import TableFormat
from dlprof.store.manifest import HostInfo
from dlprof.store.safe_files import refuse_symlink, write_text
from dlprof.text import printable
from dlprof.viewers.terminal import write_table
from dlprof.workloads.ert import Budget, Ceilings, measure, planned
from dlprof.workloads.torch_device import DeviceType, device_properties, torch_device

HELP = f"""Measure this machine's ceilings and keep them as a measured device row.

Times GEMMs per number format (fp32; bf16 and fp16 where the device computes them natively) and a
triad stream (a = b + s c) over a ladder of sizes, ERT-style: the best GEMM rate is the row's peak
per format, the best triad rate over arrays larger than the caches its memory bandwidth. Per op
class (gemm, conv, elementwise), math mode and decade of FLOPs it keeps the efficiency (roof time
/ measured time) with its spread, which `dlprof estimate` uses for this device instead of assuming
equal efficiency.

The row is stored in --calibration-file (default: ${CALIBRATION_VARIABLE}, else
$XDG_CONFIG_HOME/dlprof/calibration.json, else ~/.config/dlprof/calibration.json), replacing an
earlier calibration of the same name. `dlprof roofline RUN --device NAME` and `dlprof estimate RUN
--device NAME` use it; a CPU run made on this host is measured against it; a measured GPU row
takes its datasheet row's place.

\b
Examples:
  dlprof calibrate                                # this CPU, about half a minute on two cores
  dlprof calibrate --quick                        # a second: rough figures
  dlprof calibrate --device-type cuda             # the first GPU
  dlprof calibrate --device-name lab-box --format json
"""


@click.command("calibrate", help=HELP)
@click.option("--device-name", default=None, metavar="NAME",
              help="The row's name. Default: cpu-<hostname> for the CPU; for a GPU its datasheet row's name.")
@click.option("--device-type", type=click.Choice([str(d) for d in DeviceType], case_sensitive=False),
              default=str(DeviceType.CPU), show_default=True, help="Measure the CPU or the first CUDA device.")
@click.option("--quick", is_flag=True, help="Time each size for 10 ms and stop at small sizes (about a second).")
@click.option("--calibration-file", "store", default=None, metavar="PATH",
              help=f"Where calibrations are kept (default: ${CALIBRATION_VARIABLE}, else the user's config directory).")
@format_option(help_text="Tables for a person, CSV (the efficiencies) or JSON (everything) for a script.")
@wide_option
def command(device_name: str | None, device_type: str, quick: bool, store: str | None, fmt: str) -> int:
    path = Path(store) if store else calibration_path()
    try:
        refuse_symlink(path)  # before minutes of measuring, not after
        stored = read_calibrations(path)
        device = torch_device(DeviceType(device_type))
    except (ValueError, OSError) as error:
        raise UsageError(str(getattr(error, "strerror", None) or error)) from None
    budget = Budget.quick() if quick else Budget.default()
    began = time.perf_counter()
    with progress_bar() as bar:
        task = bar.add_task("calibrating", total=planned(device, budget))
        ceilings = measure(device, budget, lambda label: bar.update(task, advance=1, description=label))
    calibration = _calibration(ceilings, device_name, device.type, time.perf_counter() - began)
    try:
        write_text(path, calibrations_text(replaced(stored, calibration)))
    except OSError as error:
        raise UsageError(f"{path}: cannot write ({error.strerror or error})") from None
    _print(calibration, path, TableFormat(fmt), ceilings.left_out)
    return 0


def _calibration(ceilings: Ceilings, name: str | None, device_type: str, seconds: float) -> Calibration:
    """The calibration of what was measured, with efficiencies against the measured row."""
    import torch

    host = HostInfo.this_machine()
    table = device_table()
    if device_type == "cuda":
        properties = device_properties(torch.device("cuda"))
        base = table.resolve(properties)
        vendor = Vendor.AMD if torch.version.hip else Vendor.NVIDIA
        chosen = name or (base.name if base else str(properties["name"]))
        cores = int(str(properties["numSms"]))
    else:
        base, vendor, chosen, cores = None, Vendor.CPU, name or f"cpu-{host.hostname}", torch.get_num_threads()
    calibration = Calibration(
        name=chosen, vendor=vendor, hostname=host.hostname, cpu_model=host.cpu_model, cores=cores,
        based_on=base.name if base else None, measured_at_ns=time.time_ns(), seconds=seconds,
        peaks=ceilings.peaks, memory_bandwidth=ceilings.memory_bandwidth)
    buckets = efficiency_buckets(ceilings.measurements, calibration.device(table))
    return Calibration(**{**calibration.__dict__, "efficiencies": buckets})


def _efficiency_frame(calibration: Calibration) -> pd.DataFrame:
    return pd.DataFrame(
        [{"op_class": str(b.op_class), "mode": b.mode, "flops": f"1e{b.decade}-1e{b.decade + 1}",
          "efficiency": b.median, "low": b.low, "high": b.high, "samples": b.samples}
         for b in calibration.efficiencies],
        columns=["op_class", "mode", "flops", "efficiency", "low", "high", "samples"])


def _print(calibration: Calibration, path: Path, fmt: TableFormat, left_out: dict[Precision, str]) -> None:
    frame = _efficiency_frame(calibration)
    if fmt is TableFormat.JSON:
        document = json.loads(calibrations_text([calibration]))["calibrations"][0]
        print(json.dumps({**document, "file": os.fspath(path),
                          "left_out": {str(p): why for p, why in left_out.items()}}, indent=1))
        return
    if fmt is TableFormat.CSV:
        write_table(frame, "", fmt)
        return
    print(f"{calibration.name}: measured in {calibration.seconds:.1f} s on {calibration.cores} "
          f"{'threads' if calibration.vendor is Vendor.CPU else 'SMs'} ({calibration.cpu_model})")
    for precision, peak in calibration.peaks.items():
        print(f"  {precision} GEMM peak: {si(peak, 'FLOP/s')}")
    for precision, why in left_out.items():
        print(f"  {precision}: not kept ({why})")
    print(f"  memory bandwidth (triad): {si(calibration.memory_bandwidth, 'B/s')}")
    shown = pd.DataFrame({"Op class": frame["op_class"], "Math mode": frame["mode"], "FLOPs": frame["flops"],
                          "Efficiency": [f"{v:.2f}" for v in frame["efficiency"]],
                          "Spread": [f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(frame["low"], frame["high"], strict=True)],
                          "Samples": frame["samples"]})
    write_table(shown, "efficiency (roof time / measured time) per op class, math mode and FLOPs", fmt,
                keep=["Efficiency", "Spread"])
    print(printable(f"stored in {path}; use: dlprof roofline RUN --device {calibration.name!r}"))
