"""Holistic Trace Analysis (HTA), the real one, in a virtual environment of its own.

HTA pins its own pandas and numpy, so it never joins the project's environment. The first test
that needs it makes ``.hta-venv`` at the repository's root (ignored by git) with
``pip install HolisticTraceAnalysis`` and later runs reuse it; where that cannot be done (no
network, no pip), the tests that need HTA are skipped with the reason.

:func:`hta_figures` runs HTA on a directory of traces in that environment and returns, per rank
HTA found, what it makes of the trace: the figures the tests compare with the original.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTA_VENV = ROOT / ".hta-venv"
_PYTHON = HTA_VENV / "bin" / "python"

# Run inside HTA's environment: its figures per rank, as JSON on the last line of stdout.
_FIGURES = """
import json, logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis

analysis = TraceAnalysis(trace_dir=sys.argv[1])
temporal = analysis.get_temporal_breakdown(visualize=False).set_index("rank")
figures = {}
for rank in sorted(analysis.t.traces):
    trace = analysis.t.get_trace(rank)
    ids = analysis.t.symbol_table.get_sym_id_map()
    on_device = trace[trace["stream"].ne(-1)]
    kernels = on_device[on_device["cat"].eq(ids.get("kernel", -1000))]
    figures[rank] = {
        "kernels": int(len(kernels)),
        "kernel_us": float(kernels["dur"].sum()),
        "device_events": int(len(on_device)),
        "idle_us": float(temporal.loc[rank, "idle_time(us)"]),
        "compute_us": float(temporal.loc[rank, "compute_time(us)"]),
        "idle_pctg": float(temporal.loc[rank, "idle_time_pctg"]),
    }
print(json.dumps(figures))
"""


def _installed() -> bool:
    if not _PYTHON.exists():
        return False
    check = subprocess.run([str(_PYTHON), "-c", "import hta.trace_analysis"], capture_output=True, check=False)
    return check.returncode == 0


@pytest.fixture(scope="session")
def hta_python() -> Path:
    """The interpreter of the environment HTA is installed in, made once and then reused."""
    if not _installed():
        made = subprocess.run([sys.executable, "-m", "venv", "--clear", str(HTA_VENV)],
                              capture_output=True, text=True, check=False, timeout=300)
        if made.returncode == 0:
            made = subprocess.run([str(_PYTHON), "-m", "pip", "install", "-q", "HolisticTraceAnalysis"],
                                  capture_output=True, text=True, check=False, timeout=900)
        if made.returncode != 0 or not _installed():
            last = (made.stderr or made.stdout).strip().splitlines()[-1:] or ["no output"]
            pytest.skip(f"Holistic Trace Analysis could not be installed in {HTA_VENV.name}: {last[0]}")
    return _PYTHON


def hta_figures(python: Path, trace_dir: Path) -> dict[int, dict[str, Any]]:
    """HTA's figures for each rank it finds among the traces in ``trace_dir``."""
    done = subprocess.run([str(python), "-c", _FIGURES, str(trace_dir)], capture_output=True, text=True,
                          check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {int(rank): figures for rank, figures in json.loads(done.stdout.splitlines()[-1]).items()}
