"""Per-kernel metric values from PM samples: each sample's counts shared among the kernels it saw.

    result = attribute_samples(sample_start, sample_end, values, kernel_start, kernel_end, names)
    result.kernel_values[k, m]   # metric m given to kernel k

CUPTI's PM sampling (``dlprof.collectors.cupti_metrics``) measures counters (instructions
executed, active cycles...) over consecutive sampling intervals on the GPU clock; it knows
nothing of kernels. A kernel's value is recovered from the samples that overlap it:

* **Proportional overlap.** Sample ``i`` spans ``[s_i, e_i)`` and counted ``v_i``. Kernel ``k``
  spanning ``[a_k, b_k)`` overlaps it for ``o_ik = max(0, min(e_i, b_k) - max(s_i, a_k))`` ns and
  is given ``v_i * o_ik / max(e_i - s_i, sum_k o_ik)``. Alone on the GPU for the whole sample, a
  kernel takes all of it; for half the sample, half (the other half was idle, or another
  process's work, and stays unattributed); kernels running concurrently split the sample in
  proportion to their overlap, so no count is given twice. The counts are assumed spread evenly
  over a sample and over concurrent kernels: a memory-bound kernel beside a compute-bound one
  gets the same share of instructions per nanosecond. That is the method's main limit.
* **Short kernels, per name.** A kernel shorter than the sampling interval (the median sample
  length) shares every sample it touches with its neighbours and the idle gaps between them,
  so its own share is noise. Short kernels are therefore pooled per name: the shares of all
  short kernels of one name are summed (errors of neighbouring launches cancel over many
  launches) and the sum is handed back to each of them in proportion to its duration. A name's
  total is what the method estimates well; one short launch's value is that name's average rate
  times its duration, not a measurement of that launch.

Pure functions over numpy arrays: no CUPTI, no GPU, no store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Attribution:
    """What :func:`attribute_samples` gives each kernel, and the per-name pools of short kernels."""

    own_share: FloatArray  # (kernels, metrics): proportional overlap, before pooling
    kernel_values: FloatArray  # (kernels, metrics): own share, or the name's pool for short ones
    short: npt.NDArray[np.bool_]  # (kernels,): shorter than the sampling interval
    names: list[str]  # the names of short kernels, one per pool
    name_values: FloatArray  # (names, metrics): the pool of each name (sum of own shares)
    name_counts: IntArray  # (names,): short launches pooled under each name
    name_dur_ns: IntArray  # (names,): their summed duration
    unattributed: FloatArray  # (metrics,): sample counts that no kernel overlapped
    interval_ns: int  # the sampling interval the short/long split used


def _as_int64(values: Any) -> IntArray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def sampling_interval(sample_start: IntArray, sample_end: IntArray) -> int:
    """The median sample length in ns (0 with no samples): what "shorter than a sample" means."""
    if sample_start.size == 0:
        return 0
    return int(np.median(sample_end - sample_start))


def overlap_pairs(sample_start: IntArray, sample_end: IntArray, kernel_start: IntArray,
                  kernel_end: IntArray) -> tuple[IntArray, IntArray, IntArray]:
    """Every (sample, kernel) pair that overlaps, with the overlap in ns.

    Samples must be sorted by start and not overlap one another (PM samples are consecutive).

    Returns:
        Sample indices, kernel indices and overlaps (ns, > 0), one entry per overlapping pair.
    """
    # Samples a kernel can touch: the first ending after it starts to the last starting before
    # it ends; a pair inside that range may still not overlap (a gap), its overlap is then <= 0.
    first = np.searchsorted(sample_end, kernel_start, side="right")
    last = np.searchsorted(sample_start, kernel_end, side="left")
    counts = np.maximum(last - first, 0)
    kernels = np.repeat(np.arange(kernel_start.size, dtype=np.int64), counts)
    offsets = np.cumsum(counts) - counts
    samples = first[kernels] + (np.arange(kernels.size, dtype=np.int64) - offsets[kernels])
    overlap = (np.minimum(sample_end[samples], kernel_end[kernels])
               - np.maximum(sample_start[samples], kernel_start[kernels]))
    keep = overlap > 0
    return samples[keep], kernels[keep], overlap[keep]


def attribute_samples(sample_start: Any, sample_end: Any, values: Any, kernel_start: Any,
                      kernel_end: Any, kernel_names: list[str],
                      interval_ns: int | None = None) -> Attribution:
    """Share PM sample values among kernels by proportional overlap; pool short kernels per name.

    Args:
        sample_start: each sample's start, ns (any clock, the kernels' own); sorted, not overlapping.
        sample_end: each sample's end, ns.
        values: (samples, metrics) counts per sample (metrics that add up over time: ``.sum``).
        kernel_start: each kernel's start, ns, on the samples' clock.
        kernel_end: each kernel's end, ns.
        kernel_names: each kernel's name (the pooling key for short kernels).
        interval_ns: the sampling interval; default the median sample length.

    Returns:
        The :class:`Attribution`; the method and its limits are in this module's docstring.
    """
    s_start, s_end = _as_int64(sample_start), _as_int64(sample_end)
    k_start, k_end = _as_int64(kernel_start), _as_int64(kernel_end)
    sample_values = np.asarray(values, dtype=np.float64)
    if sample_values.ndim == 1:  # one metric
        sample_values = sample_values[:, None]
    n_metrics = sample_values.shape[1]
    n_kernels = k_start.size
    if len(kernel_names) != n_kernels or k_end.size != n_kernels or s_end.size != s_start.size:
        raise ValueError("sample and kernel arrays must have matching lengths")
    if s_start.size > 1 and bool(np.any(s_start[1:] < s_end[:-1])):
        raise ValueError("samples must be sorted by start and must not overlap")
    interval = sampling_interval(s_start, s_end) if interval_ns is None else int(interval_ns)

    samples, kernels, overlap = overlap_pairs(s_start, s_end, k_start, k_end)
    busy = np.bincount(samples, weights=overlap, minlength=s_start.size)
    # Kernels overlapping one another in a sample share it; a sample with idle time keeps the rest.
    denominator = np.maximum((s_end - s_start).astype(np.float64), busy)
    weight = np.divide(overlap, denominator[samples], out=np.zeros(overlap.size),
                       where=denominator[samples] > 0)
    own = np.zeros((n_kernels, n_metrics))
    for metric in range(n_metrics):
        own[:, metric] = np.bincount(kernels, weights=weight * sample_values[samples, metric],
                                     minlength=n_kernels)
    unattributed = sample_values.sum(axis=0) - own.sum(axis=0)

    duration = np.maximum(k_end - k_start, 0)
    short = duration < interval
    values_out = own.copy()
    names_array = np.asarray(kernel_names, dtype=object)
    pooled_names, pool_of = np.unique(names_array[short], return_inverse=True)
    n_pools = pooled_names.size
    name_values = np.zeros((n_pools, n_metrics))
    short_index = np.flatnonzero(short)
    np.add.at(name_values, pool_of, own[short_index])
    name_counts = np.bincount(pool_of, minlength=n_pools).astype(np.int64)
    name_dur = np.bincount(pool_of, weights=duration[short_index], minlength=n_pools).astype(np.int64)
    # A name's pool goes back to its launches by duration; zero-length launches split it evenly.
    pool_dur = name_dur[pool_of].astype(np.float64)
    share = np.where(pool_dur > 0, duration[short_index] / np.where(pool_dur > 0, pool_dur, 1.0),
                     1.0 / name_counts[pool_of])
    values_out[short_index] = name_values[pool_of] * share[:, None]
    return Attribution(
        own_share=own, kernel_values=values_out, short=short, names=[str(n) for n in pooled_names],
        name_values=name_values, name_counts=name_counts, name_dur_ns=name_dur,
        unattributed=unattributed, interval_ns=interval,
    )
