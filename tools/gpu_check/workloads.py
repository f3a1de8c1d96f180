"""The training programs the overhead and recordings parts run on ``cuda``, by stable paths.

    gpt_program()            # bench/workloads/gpt.py once it exists, else the check's own
    Workload("cnn", CNN, ("--device", "cuda", "--batch-size", "256"), "--steps")

The GPT-style model is the benchmarks': ``bench/workloads/gpt.py`` (:data:`BENCH_GPT`), run as
``python bench/workloads/gpt.py --device cuda --steps N`` and training in bf16 on CUDA. Until that
file exists, or when it does not run so, the check's own copy of the H200 recording's shape
stands in (:data:`OWN_GPT`, ``programs/gpt_workload.py``) and the report says which ran. The CNN
is the bundled example. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tools" / "gpu_check" / "programs"
BENCH_GPT = ROOT / "bench" / "workloads" / "gpt.py"
OWN_GPT = PROGRAMS / "gpt_workload.py"
CNN = ROOT / "examples" / "torch_cnn.py"
CNN_VARIANTS = PROGRAMS / "cnn_variants.py"
STEP_TIMER = PROGRAMS / "step_timer.py"
BARE_PROFILER = ROOT / "bench" / "bare_profiler.py"


@dataclass(frozen=True)
class Workload:
    """A script and its arguments, with the option that sets its number of steps."""

    name: str  # short key, in the report and in file names
    script: Path
    args: tuple[str, ...]
    steps_option: str = "--steps"

    def argv(self, steps: int) -> list[str]:
        """The script and its arguments for ``steps`` steps."""
        return [str(self.script), *self.args, self.steps_option, str(steps)]

    @property
    def shown(self) -> str:
        """The script as the report names it: relative to the tree."""
        try:
            return str(self.script.relative_to(ROOT))
        except ValueError:
            return str(self.script)


def gpt_program(bench: Path = BENCH_GPT) -> Workload:
    """The GPT-style workload in bf16 on CUDA: the benchmarks' when it exists, else the check's own."""
    if bench.is_file():
        return Workload("gpt", bench, ("--device", "cuda"))
    return own_gpt()


def own_gpt() -> Workload:
    """The check's own GPT-style program (the H200 recording's shape, plain torch)."""
    return Workload("gpt", OWN_GPT, ("--device", "cuda"))


def cnn() -> Workload:
    """The bundled CNN on CUDA, batches of 256."""
    return Workload("cnn", CNN, ("--device", "cuda", "--batch-size", "256"))
