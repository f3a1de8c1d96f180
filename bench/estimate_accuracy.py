"""How well ``dlprof estimate`` predicts one GPU's op times from another's, on recorded traces.

    .venv/bin/python bench/estimate_accuracy.py                  # A100 -> V100 and V100 -> A100
    .venv/bin/python bench/estimate_accuracy.py --method roofline --json accuracy.json

HTA's trace_diff traces (tests/data/kineto-traces/trace_diff) ran one model on an A100
(``control``, an A100-PG509-200, resolved to the A100 SXM4 40GB row) and a V100 (``test``, a
V100-SXM2-16GB). Both are imported into a temporary directory. Each kernel is tied to the op
whose runtime call launched it (the innermost slice enclosing the launch), and ops are matched
across the two runs on name, input shapes and input types. Keys whose kernels include a copy,
a memset or a collective on either side are left out, as are kernels with no op. For each
matched key the time per call (its kernels' time over its calls) is predicted from the source
run and compared with the target run's:

    total     |sum(predicted) - sum(measured)| / sum(measured), each key weighted by its calls
              in the target run
    median    the median over keys of |predicted - measured| / measured
    coverage  the matched keys' share of the source run's kernel time linked to an op

Two baselines are printed beside the model: identity (the source's time unchanged) and the ratio
of the two devices' memory bandwidths. These are recorded traces, not live hardware.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import dlprof  # noqa: E402  (after the path: the benchmark runs from a checkout)
from dlprof.analysis.estimate import EqualEfficiency, Method, Treatment, predict_items  # noqa: E402
from dlprof.analysis.run_device import run_device  # noqa: E402
from dlprof.analysis.work_items import work_items  # noqa: E402
from dlprof.importers.trace_file import import_traces  # noqa: E402
from dlprof.store.reader import Run  # noqa: E402

TRACES = ROOT / "tests" / "data" / "kineto-traces" / "trace_diff"
KEY = ["op_name", "input_shapes", "input_dtypes"]
# A key with any of these among its kernels is left out: the comparison is of computation.
_LEFT_OUT = {str(Treatment.COPY), str(Treatment.EXCLUDED)}


def per_call(items: pd.DataFrame, column: str) -> pd.DataFrame:
    """Per op key: calls, ``column`` summed over the key's kernels per call, and whether the key
    is to be left out."""
    linked = items.dropna(subset=["op_name"]).fillna({"input_shapes": "", "input_dtypes": ""})
    grouped = linked.groupby(KEY)
    return pd.DataFrame({
        "calls": grouped["op_id"].nunique(),
        "per_call": grouped[column].sum().astype("float64") / grouped["op_id"].nunique(),
        "left_out": grouped["treatment"].agg(lambda t: bool(set(t) & _LEFT_OUT)),
        "linked_ns": grouped["time_ns"].sum().astype("float64"),
    })


def compare(source: Run, target: Run, method: Method) -> dict[str, float | int | str]:
    """The model's and the baselines' errors predicting ``target`` from ``source``."""
    origin, destination = run_device(source), run_device(target)
    predicted = predict_items(work_items(source).table, origin, destination, method, EqualEfficiency())
    # The target's own items get treatments too (its copies and collectives leave keys out).
    measured = predict_items(work_items(target).table, destination, origin, method, EqualEfficiency())
    model = per_call(predicted, "target_ns")
    identity = per_call(predicted, "time_ns")
    actual = per_call(measured, "time_ns")
    keys = model.index.intersection(actual.index)
    keep = keys[~(model.loc[keys, "left_out"].to_numpy() | actual.loc[keys, "left_out"].to_numpy())]
    measured_per_call = actual.loc[keep, "per_call"].to_numpy()
    weights = actual.loc[keep, "calls"].to_numpy()
    bandwidth = origin.memory_bandwidth / destination.memory_bandwidth

    def errors(prediction: np.ndarray) -> tuple[float, float]:
        total = abs(float((prediction * weights).sum()) - float((measured_per_call * weights).sum()))
        per_key = np.abs(prediction - measured_per_call) / measured_per_call
        return total / float((measured_per_call * weights).sum()), float(np.median(per_key))

    found: dict[str, float | int | str] = {
        "source": origin.name, "target": destination.name, "method": str(method), "keys": len(keep),
        "coverage": float(identity.loc[keep, "linked_ns"].sum() / identity["linked_ns"].sum()),
    }
    for label, prediction in (("model", model.loc[keep, "per_call"].to_numpy()),
                              ("identity", identity.loc[keep, "per_call"].to_numpy()),
                              ("bandwidth", identity.loc[keep, "per_call"].to_numpy() * bandwidth)):
        found[f"{label}_total"], found[f"{label}_median"] = errors(prediction)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=[str(m) for m in Method], default=str(Method.WAVE))
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        runs = {}
        for name in ("control", "test"):
            (trace,) = (TRACES / name).glob("*.json.gz")
            import_traces([trace], Path(scratch) / name)
            runs[name] = dlprof.load(Path(scratch) / name)
        results = [compare(runs["control"], runs["test"], Method(args.method)),
                   compare(runs["test"], runs["control"], Method(args.method))]
    print("recorded traces, not live hardware (HTA trace_diff: control on an A100, test on a V100)")
    print(f"{'direction':34} {'keys':>5} {'coverage':>9}   {'model total/median':>19}   "
          f"{'identity':>15}   {'bandwidth':>15}")
    for r in results:
        print(f"{r['source'] + ' -> ' + r['target']:34} {r['keys']:>5} {100 * float(r['coverage']):>8.1f}%   "
              + "   ".join(f"{100 * float(r[f'{m}_total']):>7.1f}% / {100 * float(r[f'{m}_median']):>5.1f}%"
                           for m in ("model", "identity", "bandwidth")))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
