"""Run a program under a bare CUPTI activity tracer and write CUPTI's own records of it as JSON.

    python -m tools.gpu_check.programs.cupti_reference OUT.json program.py [ARGS...]

The reference side of the cupti check, sharing no code with dlprof: cupti-python's Activity API
used as NVIDIA's own samples use it (``cupti-python-samples/cupti_common.py``): the same activity
kinds dlprof's cupti collector enables are enabled before the program starts, each completed
buffer's records are kept with the names CUPTI's own enums give their fields, and all buffers
are flushed when it ends. The program runs as ``__main__``, as ``dlprof run`` runs it.

OUT.json: ``{"records": [{"kind": "CONCURRENT_KERNEL", "name", "dur_ns", "correlation_id",
"copy", "src", "dst", "memory", "api"}...], "dropped": N}`` (fields a kind lacks are absent).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

from tools.gpu_check.programs import run_as_main

# The activity kinds dlprof's cupti collector enables (CONCURRENT_KERNEL, not the serialising KERNEL).
KINDS = ("CONCURRENT_KERNEL", "MEMCPY", "MEMCPY2", "MEMSET", "RUNTIME", "DRIVER")
BUFFER_BYTES = 8 * 1024 * 1024


def _enum_name(enum: Any, value: int) -> str:
    try:
        return str(enum(int(value)).name)
    except ValueError:
        return f"UNKNOWN_{int(value)}"


def describe(activity: Any, cupti: Any, api_names: dict[tuple[str, int], str]) -> dict[str, Any] | None:
    """One activity record as JSON-able fields named by CUPTI's enums; None for other kinds.

    Args:
        activity: a cupti-python activity object (``ActivityKernel9``, ``ActivityAPI``...).
        cupti: the ``cupti.cupti`` module, for its enums and ``get_callback_name``.
        api_names: (kind, cbid) -> the API function's name, filled as calls are seen.
    """
    kind = _enum_name(cupti.ActivityKind, activity.kind)
    if kind not in KINDS:
        return None
    record: dict[str, Any] = {"kind": kind, "dur_ns": int(activity.end) - int(activity.start),
                              "correlation_id": int(activity.correlation_id)}
    if kind == "CONCURRENT_KERNEL":
        record["name"] = str(activity.name)
    elif kind in ("MEMCPY", "MEMCPY2"):
        record["copy"] = _enum_name(cupti.ActivityMemcpyKind, activity.copy_kind)
        record["src"] = _enum_name(cupti.ActivityMemoryKind, activity.src_kind)
        record["dst"] = _enum_name(cupti.ActivityMemoryKind, activity.dst_kind)
        record["bytes"] = int(activity.bytes)
    elif kind == "MEMSET":
        record["memory"] = _enum_name(cupti.ActivityMemoryKind, activity.memory_kind)
        record["bytes"] = int(activity.bytes)
    else:
        key = (kind, int(activity.cbid))
        if key not in api_names:
            domain = cupti.CallbackDomain.RUNTIME_API if kind == "RUNTIME" else cupti.CallbackDomain.DRIVER_API
            api_names[key] = str(cupti.get_callback_name(domain, key[1]))
        record["api"] = api_names[key]
    return record


class Tracer:
    """CUPTI's Activity API with nothing but a list behind it."""

    def __init__(self, cupti: Any) -> None:
        self.cupti = cupti
        self.records: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self._names: dict[tuple[str, int], str] = {}
        self._lock = threading.Lock()

    def _requested(self) -> tuple[int, int]:
        return BUFFER_BYTES, 0

    def _completed(self, activities: Any) -> None:
        try:
            taken = [r for r in (describe(a, self.cupti, self._names) for a in activities) if r is not None]
        except Exception as error:  # noqa: BLE001  CUPTI's thread must go on; reported at the end
            self.errors.append(f"{type(error).__name__}: {error}")
            return
        with self._lock:
            self.records.extend(taken)

    def start(self) -> None:
        for name in KINDS:
            self.cupti.activity_enable(getattr(self.cupti.ActivityKind, name))
        self.cupti.activity_register_callbacks(self._requested, self._completed)

    def stop(self) -> int:
        """Flush every buffer, disable the kinds; the records CUPTI dropped."""
        self.cupti.activity_flush_all(1)
        for name in KINDS:
            self.cupti.activity_disable(getattr(self.cupti.ActivityKind, name))
        import numpy as np

        dropped = np.zeros(1, dtype=np.uint64)  # a size_t CUPTI writes through the pointer
        self.cupti.activity_get_num_dropped_records(0, 0, dropped.ctypes.data)
        return int(dropped[0])


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m tools.gpu_check.programs.cupti_reference OUT.json PROGRAM [ARGS...]",
              file=sys.stderr)
        return 2
    out, program, program_args = Path(argv[0]), Path(argv[1]), argv[2:]
    from cupti import cupti

    tracer = Tracer(cupti)
    tracer.start()
    try:
        status = run_as_main(program, program_args)
    finally:
        dropped = tracer.stop()
    if status != 0:
        return status
    out.write_text(json.dumps({"records": tracer.records, "dropped": dropped, "errors": tracer.errors}))
    print(f"CUPTI: {len(tracer.records)} records, {dropped} dropped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
