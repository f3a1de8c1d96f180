"""A biased convolution followed by batch norm: batch norm subtracts the channel mean, so the
convolution's bias is cancelled, yet it is added, stored and given a gradient every step."""

from __future__ import annotations

import json

import pandas as pd

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of
from dlprof.advice.data import RunData
from dlprof.keys import Kind

CONVOLUTIONS = ("aten::conv1d", "aten::conv2d", "aten::conv3d")
BATCH_NORM = "aten::batch_norm"
BIAS_INPUT = 2  # aten::convN(input, weight, bias, ...)
EXPECTED_SAVING = 0.05  # assumed: adding the bias and its gradient, a pass over the output each


class ConvBiasBeforeBatchNorm(Rule):
    name = "conv-bias-before-batchnorm"
    title = "Convolution with a bias followed by batch norm"
    needs = (Need.OPS, Need.SHAPES)
    threshold = "a convolution called with a bias whose next op on the thread, at its depth, is batch norm"
    stake_basis = (f"those convolutions' time (on a GPU run, their kernels' GPU time) x {EXPECTED_SAVING:.0%}, "
                   "an assumed cost of the bias: its addition and its gradient, a pass over the output each")
    fix = "Build the convolutions that feed a BatchNorm with bias=False: nn.Conv2d(..., bias=False)."
    source = ("PyTorch performance tuning guide, 'Disable bias for convolutions directly followed by "
              "a batch norm'")

    def check(self, data: RunData) -> Finding | None:
        names = data.run.engine.dialect.literals((*CONVOLUTIONS, BATCH_NORM))
        ordered = (
            "SELECT name, input_shapes, dur_ns, lead(name) OVER (PARTITION BY rank, pid, tid, depth "
            "ORDER BY start_ns) AS next_name FROM slices "
            f"WHERE kind = '{Kind.OP}' AND name IN {names}{data.where()}")
        pairs = data.run.sql(
            f"SELECT name, input_shapes, count(*) AS calls, CAST(sum(dur_ns) AS BIGINT) AS dur_ns FROM ({ordered}) AS o "
            f"WHERE next_name = '{BATCH_NORM}' AND name <> '{BATCH_NORM}' GROUP BY name, input_shapes")
        if data.named("aten::conv%d", Kind.OP).empty:
            raise Skip("needs convolutions (aten::conv1d, conv2d or conv3d ops)")
        biased = pairs[pairs["input_shapes"].map(_has_bias)]
        if biased.empty:
            return None
        biased = biased.assign(spent_ns=[data.time_spent(r["dur_ns"], r["device_ns"])
                                         for r in _with_device_time(data, biased).to_dict("records")])
        spent = float(biased["spent_ns"].sum())
        evidence = evidence_of(
            biased.to_dict("records"), lambda r: f"{r['name']} {r['input_shapes']}",
            lambda r: f"{r['calls']} calls, {duration(r['spent_ns'])} of {data.time_word}, then batch norm",
            lambda r: r["spent_ns"] * EXPECTED_SAVING)
        summary = (f"{int(biased['calls'].sum())} biased convolution calls feed batch norm "
                   f"({duration(spent)} of {data.time_word})")
        return self.finding(Severity.MODERATE, spent * EXPECTED_SAVING, summary, evidence)


def _with_device_time(data: RunData, convolutions: pd.DataFrame) -> pd.DataFrame:
    """``convolutions`` (``name``, ``input_shapes``) with ``device_ns``, the GPU time of the
    kernels convolutions of that signature launched (0 on a CPU run)."""
    if not data.has_device:
        return convolutions.assign(device_ns=0)
    launched = data.device_time_under(f"kind = '{Kind.OP}' AND name IN {data.run.engine.dialect.literals(CONVOLUTIONS)}")
    per_signature = launched.groupby(["op", "input_shapes"], as_index=False)["device_ns"].sum()
    joined = convolutions.merge(per_signature.rename(columns={"op": "name"}), on=["name", "input_shapes"], how="left")
    return joined.assign(device_ns=joined["device_ns"].fillna(0))


def _has_bias(shapes: object) -> bool:
    """Whether a convolution's recorded input shapes hold a bias tensor."""
    try:
        parsed = json.loads(str(shapes))
    except ValueError:
        return False
    return isinstance(parsed, list) and len(parsed) > BIAS_INPUT and bool(parsed[BIAS_INPUT])
