"""What the checks' Python can import, and the versions the report names: run as a child process.

    python -m tools.gpu_check.environment cupy cupti.pm_sampling torch
    {"modules": {"cupy": "", "torch": "", ...}, "environment": {"GPU": "NVIDIA H100 ...", ...}}

Each module named is imported for real (a module that is installed but broken counts as
missing, with its error); ``modules`` maps each to "" or the error. The environment is asked of
the libraries themselves: NVML for the GPU and driver, torch and CuPy for the CUDA they were
built for, package metadata for the rest.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
# Distributions whose versions the report names, by the label it shows.
DISTRIBUTIONS = {
    "cupti-python": "cupti-python",
    "CUPTI library (nvidia-cuda-cupti)": "nvidia-cuda-cupti",
    "CUPTI library (nvidia-cuda-cupti-cu12)": "nvidia-cuda-cupti-cu12",
    "cuda-bindings": "cuda-bindings",
    "nvidia-ml-py": "nvidia-ml-py",
    "pandas": "pandas",
    "pyarrow": "pyarrow",
    "orjson": "orjson",
    "perfetto": "perfetto",
}


def import_errors(modules: list[str]) -> dict[str, str]:
    """Each module -> "" if it imports, else its error in one line."""
    errors = {}
    for name in modules:
        try:
            importlib.import_module(name)
            errors[name] = ""
        except Exception as error:  # noqa: BLE001  any failure to import is the reason
            errors[name] = f"{type(error).__name__}: {error}".splitlines()[0]
    return errors


def _nvml(found: dict[str, str]) -> None:
    import pynvml

    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        names = [str(pynvml.nvmlDeviceGetName(h)) for h in handles]
        found["GPU"] = ", ".join(dict.fromkeys(names)) + (f" (x{len(names)})" if len(names) > 1 else "")
        found["GPU memory"] = ", ".join(f"{pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30:.0f} GiB"
                                        for h in handles[:1])
        found["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        found["CUDA (driver)"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    finally:
        pynvml.nvmlShutdown()


def _torch(found: dict[str, str]) -> None:
    import torch

    backends: Any = torch.backends  # cudnn.version() is untyped
    found["torch"] = f"{torch.__version__} (CUDA {torch.version.cuda}, cuDNN {backends.cudnn.version()})"
    found["torch sees"] = (f"{torch.cuda.device_count()} device(s): {torch.cuda.get_device_name(0)}"
                           if torch.cuda.is_available() else "no CUDA device")


def _cupy(found: dict[str, str]) -> None:
    import cupy

    runtime = int(cupy.cuda.runtime.runtimeGetVersion())
    found["CuPy"] = f"{cupy.__version__} (CUDA runtime {runtime // 1000}.{runtime % 1000 // 10})"


def _commit() -> str:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git here)"
    return done.stdout.strip() or "unknown (not a git checkout)"


def environment() -> dict[str, str]:
    """The GPU, driver and library versions; what cannot be asked says why."""
    found: dict[str, str] = {}
    for label, ask in (("GPU", _nvml), ("torch", _torch), ("CuPy", _cupy)):
        try:
            ask(found)
        except Exception as error:  # noqa: BLE001  the report shows why
            found.setdefault(label, f"unknown: {type(error).__name__}: {error}".splitlines()[0])
    for label, distribution in DISTRIBUTIONS.items():
        try:
            found[label] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            if "CUPTI library" not in label:
                found[label] = "not installed"
    found["Python"] = f"{platform.python_version()} ({sys.executable})"
    found["dlprof"] = _commit()
    found["host"] = f"{platform.node()}, {platform.platform()}"
    return found


def main(argv: list[str]) -> int:
    report: dict[str, Any] = {"modules": import_errors(argv), "environment": environment()}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
