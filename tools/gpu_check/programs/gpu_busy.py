"""Leave a GPU idle, keep it busy with matrix products, then idle again; write when each phase ran.

    python tools/gpu_check/programs/gpu_busy.py --phases phases.json --idle 2.5 --busy 5

The program the nvml check profiles. The CUDA context is made before the first idle phase, so
that idle means a GPU with a context and nothing to do. Phases are written as epoch nanoseconds
(``time.time_ns()``, the clock dlprof's NVML samples carry), with the device's UUID so that the
check reads the NVML device this program used.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MATRIX = 8192  # float32: 256 MiB a matrix; one product is about 1.1 TFLOP


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--phases", type=Path, required=True, help="where to write the phases (JSON)")
    parser.add_argument("--idle", type=float, default=2.5, help="seconds idle before and after")
    parser.add_argument("--busy", type=float, default=5.0, help="seconds of matrix products")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_busy: torch sees no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda:0")
    torch.ones(1, device=device)
    torch.cuda.synchronize(device)
    phases: dict[str, object] = {"device_uuid": str(torch.cuda.get_device_properties(device).uuid),
                                 "device_name": torch.cuda.get_device_name(device)}
    started = time.time_ns()
    time.sleep(args.idle)
    phases["idle"] = [started, time.time_ns()]
    busy_start = time.time_ns()
    a = torch.randn(MATRIX, MATRIX, device=device)
    b = torch.randn(MATRIX, MATRIX, device=device)
    c, products = a, 0
    while time.time_ns() - busy_start < args.busy * 1e9:
        c = a @ b
        torch.cuda.synchronize(device)
        products += 1
    phases["busy"] = [busy_start, time.time_ns()]
    del a, b, c
    torch.cuda.empty_cache()
    after = time.time_ns()
    time.sleep(args.idle)
    phases["after"] = [after, time.time_ns()]
    phases["products"] = products
    args.phases.write_text(json.dumps(phases))
    print(f"{products} products of {MATRIX}x{MATRIX} in {args.busy:g} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
