"""``cudnn.benchmark`` off: cuDNN runs each convolution with its default algorithm rather than
timing the candidates once and keeping the fastest for the shape.

With benchmark mode on, the first call of each convolution shape launches the candidates one
after another: many more kernels than its later calls. A run that holds the program's first
step and shows no such call ran with benchmark mode off.
"""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of
from dlprof.advice.data import RunData
from dlprof.analysis.steps import StepStatus
from dlprof.keys import Kind

CONVOLUTION_OPS = "aten::cudnn_convolution%"
TRYING_FACTOR = 3  # a call launching this many times its name's median kernels is trying algorithms
EXPECTED_SAVING = 0.1  # assumed: the fastest algorithm against the default one, for fixed shapes


class CudnnBenchmarkOff(Rule):
    name = "cudnn-benchmark-off"
    title = "cudnn.benchmark off"
    needs = (Need.DEVICE, Need.OPS, Need.STEPS)
    threshold = (f"convolutions on the GPU, the program's first step recorded, and no convolution call "
                 f"launching >= {TRYING_FACTOR}x its name's median kernels (benchmark mode's trials)")
    stake_basis = (f"the convolution kernels' time x {EXPECTED_SAVING:.0%}, an assumed gain of the fastest "
                   "algorithm over the default one")
    fix = ("Set torch.backends.cudnn.benchmark = True when input shapes stay the same from step to "
           "step (pad or bucket variable ones); the first step pays for the trials.")
    source = ("PyTorch performance tuning guide, 'Enable cuDNN auto-tuner' "
              "(pytorch.org/tutorials/recipes/recipes/tuning_guide.html)")

    def check(self, data: RunData) -> Finding | None:
        if not (data.steps.steps["status"] == StepStatus.WARMUP).any():
            raise Skip("needs the program's first step, in which benchmark mode tries the algorithms")
        per_call = data.run.sql(
            "SELECT o.name, o.id, count(*) AS kernels, CAST(sum(w.dur_ns) AS BIGINT) AS dur_ns FROM slices o "
            f"JOIN slices r ON r.rank = o.rank AND r.pid = o.pid AND r.tid = o.tid AND r.kind = '{Kind.RUNTIME}' "
            "AND r.start_ns >= o.start_ns AND r.start_ns < o.start_ns + o.dur_ns "
            f"JOIN slices w ON w.rank = r.rank AND w.correlation_id = r.correlation_id AND w.kind = '{Kind.KERNEL}' "
            f"WHERE o.kind = '{Kind.OP}' AND o.name LIKE '{CONVOLUTION_OPS}'{data.where('o.rank')} GROUP BY o.name, o.id")
        if per_call.empty:
            raise Skip("needs convolutions on the GPU (aten::cudnn_convolution ops that launch kernels)")
        median = per_call.groupby("name")["kernels"].transform("median")
        if (per_call["kernels"] >= TRYING_FACTOR * median).any() and (per_call["kernels"] > median).any():
            return None
        by_name = per_call.groupby("name").agg(calls=("id", "size"), dur_ns=("dur_ns", "sum")).reset_index()
        spent = float(by_name["dur_ns"].sum())
        evidence = evidence_of(
            by_name.to_dict("records"), lambda r: str(r["name"]),
            lambda r: f"{r['calls']} calls, {duration(r['dur_ns'])} of kernels, none trying algorithms",
            lambda r: r["dur_ns"] * EXPECTED_SAVING)
        summary = f"{int(by_name['calls'].sum())} convolution calls, {duration(spent)} of kernels, no algorithm trials"
        return self.finding(Severity.MODERATE, spent * EXPECTED_SAVING, summary, evidence)
