"""A synthetic PyTorch profiler trace shaped as a GPU training program's, of any size.

    .venv/bin/python bench/realistic_trace.py --events 1000000 trace.json
    .venv/bin/python bench/realistic_trace.py --events 1000000 --layout kineto trace.json

The mix of events, their args and their nesting follow the two real GPU traces in the tests'
data, measured with ``--measure`` (``python bench/realistic_trace.py --measure FILE...``):

    share of events           H200 (torch 2.11)   A100 (trace_diff)   this generator
    cpu_op                    41.9 %              37.1 %              37.0 %
    cuda_runtime, driver       9.4 %              22.6 %              10.6 %
    kernel, memset, memcpy     7.5 %               8.7 %               9.7 %
    flows (ac2g, fwdbwd)      23.6 %              31.3 %              28.7 %
    [memory] instants         17.4 %               0.0 %              13.9 %
    bytes per event (JSON)    304                 319                 284 (kineto layout: 335)
    op nesting depth          0-6, most 1-3       0-8, most 2-4       0-4, most 1-2

Each op unit is the forward of a linear layer and its backward: ``aten::linear > aten::t >
aten::transpose > aten::as_strided`` and an ``aten::addmm`` that allocates its output and calls
``cudaLaunchKernel``, which launches a GEMM kernel (correlation id, stream, grid, block,
registers, occupancy) joined to it by an ``ac2g`` flow; a ``fwdbwd`` flow to the backward on the
autograd thread (``evaluate_function: AddmmBackward0 > AddmmBackward0 > aten::mm`` with its own
allocation, launch, kernel and free); every fifth unit a ``cudaStreamIsCapturing`` call, every
tenth a ``cudaMemsetAsync`` and its memset; a ``ProfilerStep#N`` annotation around every 50
units. Every op has the args Kineto writes (External id, Record function id, Sequence number,
Fwd thread id, Concrete Inputs, Input type, Input Strides, Input Dims, Ev Idx), every
allocation Kineto's [memory] args. Layouts: ``torch`` (the default), all on one line as torch's
``export_chrome_trace`` wrote the H200 trace; ``kineto``, a field per line as Kineto's C++
writer wrote the A100 traces.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LAYOUTS = ("torch", "kineto")
PID, MAIN_TID, AUTOGRAD_TID, STREAM = 1430, 1430, 1478, 7
BF16 = "c10::BFloat16"
# Shapes of a GPT-2 layer's MLP projection (batch 8, sequence 512, width 768, 4x inner).
_X, _W, _B = [8, 512, 768], [3072, 768], [3072]
_KERNEL = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
_UNITS_PER_STEP = 50


def _op(name: str, tid: int, ts: float, dur: float, ids: dict[str, int], dims: list[Any], types: list[str],
        strides: list[Any], concrete: list[str], sequence: int | None = None, fwd_tid: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"External id": ids["external"]}
    if sequence is not None:
        args.update({"Sequence number": sequence, "Fwd thread id": fwd_tid})
    args.update({"Record function id": 0, "Concrete Inputs": concrete, "Input type": types,
                 "Input Strides": strides, "Input Dims": dims, "Ev Idx": ids["event"]})
    ids["external"] += 1
    ids["event"] += 1
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": PID, "tid": tid, "ts": round(ts, 3),
            "dur": round(dur, 3), "args": args}


def _memory(tid: int, ts: float, size: int, allocated: int, ids: dict[str, int]) -> dict[str, Any]:
    ids["event"] += 1
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID, "tid": tid,
            "ts": round(ts, 3), "args": {"Total Reserved": 4427087872, "Total Allocated": allocated,
                                         "Bytes": size, "Device Id": 0, "Device Type": 1,
                                         "Addr": 140688398221312 + (ids["event"] % 4096) * 25165824,
                                         "finished": False, "Ev Idx": ids["event"]}}


def _launch(call: str, cbid: int, tid: int, ts: float, ids: dict[str, int],
            device_work: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A runtime call and, when it launches something, the flow and the work on the stream."""
    correlation, external = ids["correlation"], ids["external"] - 1
    ids["correlation"] += 1
    events = [{"ph": "X", "cat": "cuda_runtime", "name": call, "pid": PID, "tid": tid, "ts": round(ts, 3),
               "dur": 6.5, "args": {"External id": external, "cbid": cbid, "correlation": correlation}}]
    if device_work is None:
        return events
    start = round(ts + 40.0, 3)
    category, name, extra = device_work["cat"], device_work["name"], device_work["args"]
    events += [
        {"ph": "s", "id": correlation, "pid": PID, "tid": tid, "ts": round(ts, 3), "cat": "ac2g", "name": "ac2g"},
        {"ph": "X", "cat": category, "name": name, "pid": 0, "tid": STREAM, "ts": start, "dur": device_work["dur"],
         "args": {"External id": external, "queued": 0, "device": 0, "context": 1, "stream": STREAM,
                  "correlation": correlation, **extra}},
        {"ph": "f", "id": correlation, "pid": 0, "tid": STREAM, "ts": start, "cat": "ac2g", "name": "ac2g",
         "bp": "e"},
    ]
    return events


def _gemm(grid: list[int]) -> dict[str, Any]:
    return {"cat": "kernel", "name": _KERNEL, "dur": 61.184,
            "args": {"registers per thread": 168, "shared memory": 213248, "blocks per SM": 1.454545,
                     "warps per SM": 5.818182, "grid": grid, "block": [384, 1, 1],
                     "est. achieved occupancy %": 6}}


def _unit(index: int, t: float, ids: dict[str, int]) -> list[dict[str, Any]]:
    """One linear layer's forward on the main thread and its backward on the autograd thread."""
    sequence = index
    events = [
        _op("aten::linear", MAIN_TID, t, 60.2, ids, [_X, _W, _B], [BF16] * 3,
            [[393216, 768, 1], [768, 1], [1]], ["", "", ""], sequence),
        _op("aten::t", MAIN_TID, t + 2.1, 8.4, ids, [_W], [BF16], [[768, 1]], [""]),
        _op("aten::transpose", MAIN_TID, t + 3.3, 5.9, ids, [_W, [], []], [BF16, "Scalar", "Scalar"],
            [[768, 1], [], []], ["", "0", "1"]),
        _op("aten::as_strided", MAIN_TID, t + 4.6, 2.2, ids, [_W, [], [], []], [BF16, "ScalarList", "ScalarList", ""],
            [[768, 1], [], [], []], ["", "[768, 3072]", "[1, 768]", ""]),
        _op("aten::addmm", MAIN_TID, t + 12.0, 44.8, ids, [_B, [4096, 768], [768, 3072], [], []],
            [BF16, BF16, BF16, "Scalar", "Scalar"], [[1], [768, 1], [1, 768], [], []], ["", "", "", "1", "1"],
            sequence),
        _memory(MAIN_TID, t + 14.5, 25165824, 3901451776, ids),
        *_launch("cudaLaunchKernel", 211, MAIN_TID, t + 20.0, ids, _gemm([24, 32, 1])),
        {"ph": "s", "id": sequence + 1, "pid": PID, "tid": MAIN_TID, "ts": round(t, 3), "cat": "fwdbwd",
         "name": "fwdbwd"},
    ]
    back = t + 200.0
    events += [
        _op("autograd::engine::evaluate_function: AddmmBackward0", AUTOGRAD_TID, back, 95.3, ids, [], [], [], [],
            sequence, fwd_tid=1),
        _op("AddmmBackward0", AUTOGRAD_TID, back + 3.2, 80.1, ids, [[4096, 3072]], [BF16], [[3072, 1]], [""],
            sequence, fwd_tid=1),
        {"ph": "f", "id": sequence + 1, "pid": PID, "tid": AUTOGRAD_TID, "ts": round(back + 3.2, 3),
         "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"},
        _op("aten::mm", AUTOGRAD_TID, back + 9.0, 50.7, ids, [[4096, 3072], [3072, 768]], [BF16, BF16],
            [[3072, 1], [768, 1]], ["", ""]),
        _memory(AUTOGRAD_TID, back + 11.0, 6291456, 3907743232, ids),
        *_launch("cudaLaunchKernel", 211, AUTOGRAD_TID, back + 18.0, ids, _gemm([6, 32, 1])),
        _memory(AUTOGRAD_TID, back + 85.0, -6291456, 3901451776, ids),
    ]
    if index % 5 == 0:
        events += _launch("cudaStreamIsCapturing", 317, MAIN_TID, t + 61.0, ids, None)
    if index % 10 == 0:
        events += _launch("cudaMemsetAsync", 51, AUTOGRAD_TID, back + 86.0, ids,
                          {"cat": "gpu_memset", "name": "Memset (Device)", "dur": 1.184,
                           "args": {"bytes": 384, "memory bandwidth (GB/s)": 0.32432432432432434}})
    return events


def realistic_events() -> Iterator[dict[str, Any]]:
    """An endless training loop's events, a ProfilerStep#N range around every 50 units."""
    ids = {"external": 1, "event": 0, "correlation": 1}
    t0, period = 4904246297857.726, 400.0
    for index in range(sys.maxsize):
        t = t0 + index * period
        if index % _UNITS_PER_STEP == 0:
            yield {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{index // _UNITS_PER_STEP}",
                   "pid": PID, "tid": MAIN_TID, "ts": round(t - 1.0, 3), "dur": _UNITS_PER_STEP * period - 2.0,
                   "args": {"External id": ids["external"], "Record function id": 0, "Ev Idx": ids["event"]}}
            ids["external"] += 1
            ids["event"] += 1
        yield from _unit(index, t + 1.0, ids)


def _kineto_text(event: dict[str, Any]) -> str:
    """One event as Kineto's C++ writer lays it out: the fields on a line, the args a field per line."""
    fields = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in event.items() if k != "args")
    if "args" not in event:
        return "  {\n    " + fields + "\n  }"
    args = ",\n      ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in event["args"].items())
    return "  {\n    " + fields + ',\n    "args": {\n      ' + args + "\n    }\n  }"


def write_realistic(path: Path, events: int, layout: str = "torch") -> None:
    """A trace of exactly ``events`` events (metadata events included), in ``layout``."""
    header = {"schemaVersion": 1, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "computeMajor": 9, "computeMinor": 0,
         "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
         "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
         "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}],
        "record_shapes": 1, "profile_memory": 1, "with_flops": 1,
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "baseTimeNanoseconds": 1790857026000000000}
    metadata = [{"name": "process_name", "ph": "M", "ts": 4904240204894.686, "pid": PID, "tid": 0,
                 "args": {"name": "python"}},
                {"name": "process_name", "ph": "M", "ts": 4904240204894.686, "pid": 0, "tid": 0,
                 "args": {"name": "GPU 0"}}]
    text = json.dumps if layout == "torch" else _kineto_text
    separator = ", " if layout == "torch" else ",\n"
    generated = realistic_events()
    with path.open("w") as out:
        opening = json.dumps(header)[:-1] + ', "traceEvents": ['
        out.write(opening if layout == "torch" else opening.replace(', "traceEvents"', ',\n  "traceEvents"') + "\n")
        for index in range(events):
            event = metadata[index] if index < len(metadata) else next(generated)
            out.write((separator if index else "") + text(event))
        out.write('], "traceName": "realistic"}' if layout == "torch" else '\n  ],\n  "traceName": "realistic"\n}\n')


def measure_mix(path: Path) -> str:
    """The shares of a trace's events by kind, its bytes per event and its op nesting depths."""
    with gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb") as handle:
        raw = handle.read()
    events = json.loads(raw)["traceEvents"]
    groups = {"cpu_op": ("cpu_op",), "runtime": ("cuda_runtime", "cuda_driver"),
              "device": ("kernel", "gpu_memset", "gpu_memcpy"), "flows": ("ac2g", "fwdbwd", "async_cpu_to_gpu")}
    counts: collections.Counter[str] = collections.Counter()
    for event in events:
        category = event.get("cat")
        group = next((g for g, cats in groups.items() if category in cats), None)
        counts[group or ("memory" if event.get("name") == "[memory]" else "other")] += 1
    tracks: dict[tuple[Any, Any], list[tuple[float, float]]] = collections.defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in ("cpu_op", "user_annotation"):
            tracks[event["pid"], event["tid"]].append((event["ts"], -event["dur"]))
    depths: collections.Counter[int] = collections.Counter()
    for track in tracks.values():
        open_ends: list[float] = []
        for ts, negative_dur in sorted(track):
            while open_ends and open_ends[-1] <= ts:
                open_ends.pop()
            depths[len(open_ends)] += 1
            open_ends.append(ts - negative_dur)
    shares = ", ".join(f"{group} {100 * count / len(events):.1f} %" for group, count in counts.most_common())
    return (f"{path.name}: {len(events):,} events, {len(raw) / len(events):.0f} bytes each; {shares}; "
            f"op depths {dict(sorted(depths.items()))}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the trace")
    parser.add_argument("--layout", choices=LAYOUTS, default="torch", help="how events are laid out")
    parser.add_argument("--measure", action="store_true", help="print the mix of the traces given instead")
    parser.add_argument("paths", type=Path, nargs="+", help="the .json file to write (or the traces to measure)")
    args = parser.parse_args(argv)
    if args.measure:
        for path in args.paths:
            print(measure_mix(path))
        return 0
    write_realistic(args.paths[0], args.events, args.layout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
