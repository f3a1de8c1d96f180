"""The old home of TAU's flat profile, kept so that code written against it still runs: the
analysis is :mod:`dlprof.analysis.tau_profile` ("pprof" names Google's format in dlprof).

``pprof_tables`` is :func:`dlprof.analysis.tau_profile.tau_profiles`.
"""

from __future__ import annotations

from dlprof.analysis.tau_profile import (
    OTHERS,
    PROFILE_COLUMNS,
    THREAD_KEYS,
    FunctionSummary,
    SummaryKind,
    ThreadProfile,
    fold_others,
    function_summaries,
    outermost_of_name,
    parent_positions,
    tau_profiles,
)

PPROF_COLUMNS = PROFILE_COLUMNS
pprof_tables = tau_profiles

__all__ = [
    "OTHERS", "PPROF_COLUMNS", "THREAD_KEYS", "FunctionSummary", "SummaryKind", "ThreadProfile", "fold_others",
    "function_summaries", "outermost_of_name", "parent_positions", "pprof_tables",
]
