"""Check (d): the NVML sampler sees a GPU go from idle to busy and back.

    python -m tools.gpu_check.checks.nvml_sampler --work DIR --result FILE --seconds 120

:mod:`tools.gpu_check.programs.gpu_busy` idles 2.5 s, multiplies matrices for 5 s, then idles
again, under ``dlprof run --collectors nvml``, and writes when each phase ran. On the NVML device
it used (matched by UUID), utilisation must rise by 30 points and power by 20 W and a quarter
while it works (its first second left out: NVML averages over up to a second), memory used must
rise by the matrices it holds, and every gauge must have been sampled.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import pandas as pd

from dlprof.collectors.nvml import TRACKS
from dlprof.store.reader import Run
from tools.gpu_check.checks.harness import PROGRAMS, Check, main
from tools.gpu_check.checks.stored import run_complete
from tools.gpu_check.compare import Window, check_rise
from tools.gpu_check.report import Part, Status

RAMP_NS = 1_000_000_000  # NVML's utilisation and power average over up to a second
SETTLE_NS = 500_000_000  # the first idle half second: the context was just made
MATRIX_BYTES = 2 * 8192 * 8192 * 4  # the two operands gpu_busy holds while busy


def nvml_index(uuid: str) -> tuple[int, str]:
    """The NVML index of the device with this UUID (torch's spelling), and how it was found."""
    import pynvml

    wanted = uuid.lower().removeprefix("gpu-")
    pynvml.nvmlInit()
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            found = str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(index)))
            if found.lower().removeprefix("gpu-") == wanted:
                return index, f"NVML device {index} has the program's UUID {found}"
    finally:
        pynvml.nvmlShutdown()
    return 0, f"no NVML device has UUID {uuid}: device 0 read"


def gauge(counters: pd.DataFrame, device: str, track: str) -> list[tuple[int, float]]:
    """(epoch ns, value) samples of one NVML track of one device."""
    rows = counters[(counters["device"].astype(str) == device) & (counters["track"].astype(str) == track)]
    return list(zip(rows["ts_ns"].astype("int64"), rows["value"].astype(float), strict=True))


def nvml_parts(run: Run, device: str, phases: Mapping[str, Any]) -> list[Part]:
    """Every judgement of the check on one run and the phases its program wrote."""
    counters = run.counters
    idle = Window(int(phases["idle"][0]) + SETTLE_NS, int(phases["idle"][1]))
    busy = Window(int(phases["busy"][0]) + RAMP_NS, int(phases["busy"][1]))
    parts = [
        check_rise(gauge(counters, device, "nvml.gpu_util"), idle, busy,
                   "GPU utilisation rises while the GPU works", "%", min_rise=30),
        check_rise(gauge(counters, device, "nvml.power"), idle, busy,
                   "power rises while the GPU works", "W", min_rise=20, min_ratio=1.25),
        check_rise(gauge(counters, device, "nvml.memory_used"), idle, busy,
                   "memory used rises by the matrices the program holds", "bytes",
                   min_rise=MATRIX_BYTES * 0.9),
    ]
    counts = {track: len(gauge(counters, device, track)) for track, _ in TRACKS}
    absent = [track for track, n in counts.items() if n == 0]
    notes = next((i.notes for i in run.manifest.collectors if i.name == "nvml"), [])
    parts.append(Part(f"every NVML gauge is sampled on {device}", Status.FAILED if absent else Status.PASSED,
                      f"absent: {', '.join(absent)} ({' '.join(notes)})" if absent
                      else f"{min(counts.values())} to {max(counts.values())} samples each",
                      {"samples": counts}))
    return parts


def check(c: Check) -> None:
    phases_path = c.work / "phases.json"
    program = [str(PROGRAMS / "gpu_busy.py"), "--phases", str(phases_path), "--idle", "2.5", "--busy", "5"]
    run = c.load(c.dlprof_run("dlprof run --collectors nvml", "run", "nvml", program))
    c.add(run_complete(run, ["nvml"]))
    phases = json.loads(phases_path.read_text())
    index, how = nvml_index(str(phases["device_uuid"]))
    print(how, file=sys.stderr)
    for part in nvml_parts(run, f"cuda:{index}", phases):
        c.add(part)


if __name__ == "__main__":
    sys.exit(main(check))
