"""A synthetic PyTorch profiler (Kineto) trace of any size, in the layout torch 2.x writes.

    .venv/bin/python bench/synthetic_trace.py --events 1000000 trace.json

One field per line, relative microseconds with ``baseTimeNanoseconds``: CPU ops with input
shapes, runtime calls with correlation ids, kernels on one stream and memcpy/memset on another,
flow events, memory allocation and free instants, a ``ProfilerStep#N`` range every 500 launch
groups. The benchmarks of import, export and analysis at scale build their inputs with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _field(key: str, value: Any) -> str:
    return f"{json.dumps(key)}: {json.dumps(value)}"


def _event(fields: dict[str, Any], args: dict[str, Any] | None = None) -> str:
    """One event in Kineto's layout: a field per line, the args on one line."""
    lines = [f"    {_field(key, value)}" for key, value in fields.items()]
    if args is not None:
        inner = ", ".join(_field(key, value) for key, value in args.items())
        lines.append(f'    "args": {{\n      {inner}\n    }}')
    return "  {\n" + ",\n".join(lines) + "\n  }"


def _synthetic_events(pid: int) -> Iterator[str]:
    """An endless training loop's events, in Kineto's order: per group, an op, its launch, the
    kernel, the flow between them, an allocation and its free; copies and memsets now and then."""
    group = 0
    correlation = 1
    while True:
        t = group * 10.0
        if group % 500 == 0:
            yield _event({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{group // 500}",
                          "pid": pid, "tid": pid, "ts": t, "dur": 4999.5}, {"External id": correlation})
        common = {"External id": correlation, "Sequence number": group, "Fwd thread id": 0,
                  "Record function id": 0, "Ev Idx": group}
        yield _event({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": pid, "tid": pid,
                      "ts": t + 0.1, "dur": 8.5},
                     {**common, "Input Dims": [[64, 256], [256, 256], [256]],
                      "Input type": ["float", "float", "float"], "Concrete Inputs": ["", "", ""]})
        yield _event({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid,
                      "ts": t + 0.5, "dur": 7.0},
                     {**common, "Input Dims": [[64, 256], [256, 256]], "Input type": ["float", "float"],
                      "Input Strides": [[256, 1], [256, 1]], "Concrete Inputs": ["", ""]})
        memory = {"Total Reserved": 2 << 20, "Device Id": 0, "Device Type": 1, "Addr": 0x7F0000000000 + group % 64}
        yield _event({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid,
                      "tid": pid, "ts": t + 1.0}, {**memory, "Total Allocated": 65536, "Bytes": 65536})
        launches = [("cudaLaunchKernel", 211, "kernel", "void gemm_64x64_kernel<float>(Params)", 7)]
        if group % 4 == 0:
            launches.append(("cudaMemcpyAsync", 41, "gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 20))
        if group % 8 == 0:
            launches.append(("cudaMemsetAsync", 51, "gpu_memset", "Memset (Device)", 20))
        for offset, (call, cbid, category, name, stream) in enumerate(launches):
            at = t + 1.5 + offset
            yield _event({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": pid, "tid": pid,
                          "ts": at, "dur": 0.8}, {"External id": correlation, "cbid": cbid,
                                                  "correlation": correlation})
            yield _event({"ph": "s", "id": correlation, "pid": pid, "tid": pid, "ts": at,
                          "cat": "ac2g", "name": "ac2g"})
            device_args: dict[str, Any] = {"External id": correlation, "device": 0, "context": 1,
                                           "stream": stream, "correlation": correlation}
            if category == "kernel":
                device_args.update({"registers per thread": 90, "shared memory": 49152,
                                    "blocks per SM": 0.59, "warps per SM": 2.37, "grid": [64, 1, 1],
                                    "block": [128, 1, 1], "est. achieved occupancy %": 4})
            else:
                device_args["bytes"] = 65536
            yield _event({"ph": "X", "cat": category, "name": name, "pid": 0, "tid": stream,
                          "ts": at + 3.0, "dur": 4.0}, device_args)
            yield _event({"ph": "f", "id": correlation, "pid": 0, "tid": stream, "ts": at + 3.0,
                          "cat": "ac2g", "name": "ac2g", "bp": "e"})
            correlation += 1
        yield _event({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid,
                      "tid": pid, "ts": t + 9.0}, {**memory, "Total Allocated": 0, "Bytes": -65536})
        group += 1


def write_synthetic(path: Path, events: int) -> None:
    """A Kineto trace of exactly ``events`` events (metadata events included)."""
    pid = 4242
    header = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Synthetic GPU", "numSms": 108}],
              "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
              "baseTimeNanoseconds": 1700000000000000000}
    metadata = [_event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0.0},
                       {"name": "python"}),
                _event({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "ts": 0.0},
                       {"name": "GPU 0"})]
    with path.open("w") as out:
        out.write(json.dumps(header)[:-1] + ',\n  "traceEvents": [\n')
        generated = _synthetic_events(pid)
        for index in range(events):
            out.write((",\n" if index else "") + (metadata[index] if index < len(metadata) else next(generated)))
        out.write('\n  ],\n  "traceName": "synthetic"\n}\n')



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the trace")
    parser.add_argument("path", type=Path, help="the .json file to write")
    args = parser.parse_args(argv)
    write_synthetic(args.path, args.events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
