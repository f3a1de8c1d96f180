"""The one table from legacy CUPTI event and metric names to Perfworks metric names.

CUPTI's event API (nvprof, up to Volta) named counters ``inst_executed`` or ``active_warps``;
the Perfworks metrics that replaced it (Nsight Compute, CUPTI's profiler and PM-sampling APIs,
Kineto's range profiler) name them ``smsp__inst_executed.sum`` or ``sm__warps_active.sum``. A
derived-metric formula may use either; names are resolved here and nowhere else::

    perfworks_name("inst_executed")            # "smsp__inst_executed.sum"
    perfworks_name("smsp__inst_executed.sum")  # unchanged
    perfworks_names("gld_request")             # the name, then what counts the same on other chips

The pairs are those of NVIDIA's nvprof-to-Nsight-Compute event and metric comparison tables,
restricted to counters that are sums (an nvprof ratio such as ``ipc`` is a derived metric here,
computed from its counters, so that it can be summed over a group first).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import Final

from dlprof.hardware.pm_metrics import equivalents

_SASS = "smsp__sass_thread_inst_executed_op_{}_pred_on.sum"

LEGACY_TO_PERFWORKS: Final = MappingProxyType(
    {
        # Events (per-SM hardware counters of the CUPTI event API).
        "inst_executed": "smsp__inst_executed.sum",
        "active_warps": "sm__warps_active.sum",
        "active_cycles": "sm__cycles_active.sum",
        "elapsed_cycles_sm": "sm__cycles_elapsed.sum",
        "gld_request": "smsp__inst_executed_op_global_ld.sum",
        "gst_request": "smsp__inst_executed_op_global_st.sum",
        "shared_load": "smsp__inst_executed_op_shared_ld.sum",
        "shared_store": "smsp__inst_executed_op_shared_st.sum",
        "warps_launched": "smsp__warps_launched.sum",
        # Metrics that are plain counts: floating-point instructions per precision and kind
        # (thread-level, predicated on) and DRAM traffic.
        **{
            f"flop_count_{precision}_{operation}": _SASS.format(f"{letter}{operation}")
            for precision, letter in (("dp", "d"), ("sp", "f"), ("hp", "h"))
            for operation in ("add", "mul", "fma")
        },
        "dram_read_bytes": "dram__bytes_read.sum",
        "dram_write_bytes": "dram__bytes_write.sum",
    }
)
"""Legacy CUPTI name -> Perfworks metric name (without dlprof's ``cupti:`` source prefix)."""


def perfworks_name(name: str) -> str:
    """The Perfworks name of a legacy CUPTI event or metric; any other name unchanged.

    Args:
        name: a counter name without its source prefix.

    Returns:
        The name to look for among a run's metrics.
    """
    return LEGACY_TO_PERFWORKS.get(name, name)


def perfworks_names(name: str) -> tuple[str, ...]:
    """The Perfworks name of ``name`` (:func:`perfworks_name`), then the names that count the same
    events on other chips (:func:`dlprof.hardware.pm_metrics.equivalents`): a run holds the one its
    GPU could sample."""
    return equivalents(perfworks_name(name))


def legacy_name(perfworks: str) -> str | None:
    """The legacy CUPTI name of a Perfworks metric, if it had one (for messages)."""
    for legacy, modern in LEGACY_TO_PERFWORKS.items():
        if modern == perfworks:
            return legacy
    return None


def describe_names(names: Sequence[str]) -> str:
    """Counter names in words for a message, each with its other name where it has one.

    ``["inst_executed", "sm__cycles_active.sum"]`` gives
    ``"inst_executed (smsp__inst_executed.sum), sm__cycles_active.sum (legacy active_cycles)"``.
    """
    parts = []
    for name in names:
        modern = perfworks_name(name)
        legacy = legacy_name(name.partition(":")[2] or name)
        if modern != name:
            parts.append(f"{name} ({modern})")
        else:
            parts.append(f"{name} (legacy {legacy})" if legacy else name)
    return ", ".join(parts)
