"""The checks, one module each, run as ``python -m MODULE --work DIR --result FILE --seconds N
[--out REPORT_DIR]``, then the parts that run after them when time is left.

These tables are all the process that sets up and reports needs to know of them (standard
library only); each module imports dlprof and the GPU libraries itself, in its own process. A
check proves rows of the README's verification table; a part after the checks brings back what
the GPU showed (recordings, what each analysis command does on a GPU run, the overhead).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CheckSpec:
    """One check: what it proves, where its code is, what it needs and how long it may take."""

    name: str  # short key, also the name of its work directory
    title: str  # what it exercises, for the report
    module: str  # run as ``python -m module``
    needs: tuple[str, ...]  # modules that must import in the check's Python, or it cannot run
    timeout_s: int  # a check still running then is killed with everything it started
    covers: tuple[str, ...]  # rows of the README's "What was verified where" table
    least_s: int = 30  # not started with less time than this left


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "torch_cuda",
        "the bundled CNN on CUDA under `dlprof run` (default collectors) against torch.profiler's "
        "own events of the same program run the same way: kernels, memcpy, memset, launching ops",
        "tools.gpu_check.checks.torch_cuda", ("dlprof", "torch"), 240,
        ("`torch` collector, CUDA kernels/memcpy/memset",)),
    CheckSpec(
        "cupti_activity",
        "a CuPy program (no PyTorch) under `dlprof run --collectors cupti` against CUPTI's own "
        "records of the same program, counted by a bare cupti-python tracer in another process",
        "tools.gpu_check.checks.cupti_activity", ("dlprof", "cupy", "cupti.cupti"), 180,
        ("`cupti` collector (kernels, memcpy, memset, CUDA API calls)",)),
    CheckSpec(
        "cupti_metrics",
        "a memory-bound and a compute-bound CuPy kernel under `dlprof run --collectors "
        "cupti_metrics,cupti`: per-kernel metrics, `dlprof metrics` in physical ranges, roofline",
        "tools.gpu_check.checks.cupti_metrics",
        ("dlprof", "cupy", "cupti.pm_sampling", "cupti.profiler_host"), 180,
        ("`cupti_metrics` (PM sampling), metric names checked with `profiler_host`",)),
    CheckSpec(
        "nvml",
        "`dlprof run --collectors nvml` on a program that idles, keeps the GPU busy, then idles: "
        "utilisation and power rise while it works",
        "tools.gpu_check.checks.nvml_sampler", ("dlprof", "pynvml", "torch"), 120,
        ("`nvml` sampler",)),
)

AFTER_CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec(
        "recordings",
        "real GPU runs brought back for the tests' data: `dlprof run` of the GPT-style workload in "
        "bf16 and of the CNN (DataLoader workers; torch.compile reduce-overhead), and a bare "
        "torch.profiler trace of the GPT-style workload",
        "tools.gpu_check.checks.recordings", ("dlprof", "torch"), 240, (), least_s=60),
    CheckSpec(
        "overhead",
        "what dlprof costs on the GPU: the GPT-style workload (bf16) and the CNN, plain / bare "
        "torch.profiler + export / `dlprof run`, interleaved over 3 rounds: wall time, step time, "
        "peak memory",
        "tools.gpu_check.checks.overhead", ("dlprof", "torch", "psutil"), 300, (), least_s=90),
    CheckSpec(
        "commands",
        "every analysis command on the GPU run as a user types it (top by each kind, steps, gpu, memory, "
        "roofline, estimate, advise, tune, metrics, report, export in every format), 30 s each",
        "tools.gpu_check.checks.commands", ("dlprof",), 150, (), least_s=20),
)
"""Run after the checks, in this order, each only when time is left; they prove no row. The
overhead comes before the commands: it needs its three rounds whole, the commands are skipped one
by one."""
