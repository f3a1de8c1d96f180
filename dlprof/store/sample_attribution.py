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
* **Only kernels the samples saw.** A kernel no sample overlaps (it ran while sampling was off)
  gets no value, not zero, and takes no part in its name's pool.

The functions above are pure, over numpy arrays. The samples are attributed once a rank of a run
is final, as a compaction step (:mod:`dlprof.store.pm_samples`), so that the kernels may come
from any collector, in any order.
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
    covered: npt.NDArray[np.bool_]  # (kernels,): overlapped by at least one sample
    short: npt.NDArray[np.bool_]  # (kernels,): shorter than the sampling interval, and covered
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


def own_shares(sample_start: IntArray, sample_end: IntArray, sample_values: FloatArray,
               kernel_start: IntArray, kernel_end: IntArray) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """Each kernel's proportional share of the samples it overlaps, and which kernels any sample
    overlapped.

    Shares add up over disjoint sets of samples, as long as each set is shared among every kernel
    that overlaps it: a long run is attributed a piece of samples at a time.

    Args:
        sample_start: sorted, not overlapping (ns).
        sample_end: (ns).
        sample_values: (samples, metrics).
        kernel_start: (ns), any order.
        kernel_end: (ns).

    Returns:
        (kernels, metrics) shares and a (kernels,) mask of kernels overlapped by a sample.
    """
    samples, kernels, overlap = overlap_pairs(sample_start, sample_end, kernel_start, kernel_end)
    busy = np.bincount(samples, weights=overlap, minlength=sample_start.size)
    # Kernels overlapping one another in a sample share it; a sample with idle time keeps the rest.
    denominator = np.maximum((sample_end - sample_start).astype(np.float64), busy)
    weight = np.divide(overlap, denominator[samples], out=np.zeros(overlap.size),
                       where=denominator[samples] > 0)
    own = np.zeros((kernel_start.size, sample_values.shape[1]))
    for metric in range(sample_values.shape[1]):
        own[:, metric] = np.bincount(kernels, weights=weight * sample_values[samples, metric],
                                     minlength=kernel_start.size)
    covered = np.bincount(kernels, minlength=kernel_start.size) > 0
    return own, covered


def pool_short_kernels(own: FloatArray, covered: npt.NDArray[np.bool_], duration: IntArray,
                       kernel_names: list[str], interval_ns: int,
                       unattributed: FloatArray) -> Attribution:
    """The kernels' values: a long kernel keeps its own share, the short ones of a name share
    their name's pool by duration (this module's docstring says why).

    Args:
        own: (kernels, metrics) shares (:func:`own_shares`, summed over pieces).
        covered: which kernels a sample overlapped; the others get nothing.
        duration: each kernel's duration (ns).
        kernel_names: the pooling key.
        interval_ns: the sampling interval: what "short" means.
        unattributed: (metrics,) counts no kernel took, for the result.
    """
    short = covered & (duration < interval_ns)
    values_out = np.where(covered[:, None], own, 0.0)
    names_array = np.asarray(kernel_names, dtype=object)
    pooled_names, pool_of = np.unique(names_array[short], return_inverse=True)
    n_pools = pooled_names.size
    name_values = np.zeros((n_pools, own.shape[1]))
    short_index = np.flatnonzero(short)
    np.add.at(name_values, pool_of, own[short_index])
    name_counts = np.bincount(pool_of, minlength=n_pools).astype(np.int64)
    name_dur = np.bincount(pool_of, weights=duration[short_index], minlength=n_pools).astype(np.int64)
    # A name's pool goes back to its launches by duration; zero-length launches split it evenly.
    pool_dur = name_dur[pool_of].astype(np.float64)
    share = np.where(pool_dur > 0, duration[short_index] / np.where(pool_dur > 0, pool_dur, 1.0),
                     1.0 / np.maximum(name_counts[pool_of], 1))
    values_out[short_index] = name_values[pool_of] * share[:, None]
    return Attribution(
        own_share=own, kernel_values=values_out, covered=covered, short=short,
        names=[str(n) for n in pooled_names], name_values=name_values, name_counts=name_counts,
        name_dur_ns=name_dur, unattributed=unattributed, interval_ns=interval_ns,
    )


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
    if len(kernel_names) != k_start.size or k_end.size != k_start.size or s_end.size != s_start.size:
        raise ValueError("sample and kernel arrays must have matching lengths")
    if s_start.size > 1 and bool(np.any(s_start[1:] < s_end[:-1])):
        raise ValueError("samples must be sorted by start and must not overlap")
    interval = sampling_interval(s_start, s_end) if interval_ns is None else int(interval_ns)
    own, covered = own_shares(s_start, s_end, sample_values, k_start, k_end)
    unattributed = sample_values.sum(axis=0) - own.sum(axis=0)
    return pool_short_kernels(own, covered, np.maximum(k_end - k_start, 0), kernel_names, interval,
                              unattributed)
