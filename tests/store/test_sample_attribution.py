"""PM samples shared among kernel intervals: hand-worked cases and a brute-force reference; then the
compaction step that attributes a rank's samples from its files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from dlprof.keys import StoreTable
from dlprof.store.pm_samples import DURATION_TRACK, attribute_rank, read_summary
from dlprof.store.sample_attribution import attribute_samples, overlap_pairs
from dlprof.store.writer import RankWriter


def reference(sample_start: list[int], sample_end: list[int], values: np.ndarray,
              kernel_start: list[int], kernel_end: list[int]) -> np.ndarray:
    """The proportional-overlap shares by double loop, straight from the definition."""
    own = np.zeros((len(kernel_start), values.shape[1]))
    for i, (s, e) in enumerate(zip(sample_start, sample_end, strict=True)):
        overlaps = [max(0, min(e, b) - max(s, a)) for a, b in zip(kernel_start, kernel_end, strict=True)]
        denominator = max(e - s, sum(overlaps))
        for k, o in enumerate(overlaps):
            if o and denominator:
                own[k] += values[i] * o / denominator
    return own


def test_one_kernel_alone_takes_what_it_overlaps() -> None:
    # Samples of 100 ns counting 1000, 2000, 3000; the kernel covers all of the second, half of
    # the first and a quarter of the third.
    result = attribute_samples([0, 100, 200], [100, 200, 300], [[1000.0], [2000.0], [3000.0]],
                               [50], [225], ["k"])
    assert result.own_share[0, 0] == pytest.approx(500 + 2000 + 750)
    assert not result.short[0] and result.interval_ns == 100
    assert result.kernel_values[0, 0] == result.own_share[0, 0]
    assert result.unattributed[0] == pytest.approx(6000 - 3250)


def test_concurrent_kernels_split_a_sample_without_counting_twice() -> None:
    # Two kernels both running the whole sample: each gets half, nothing is left over.
    result = attribute_samples([0], [100], [[800.0, 80.0]], [0, 0], [100, 100], ["a", "b"],
                               interval_ns=50)
    assert result.own_share.tolist() == [[400.0, 40.0], [400.0, 40.0]]
    assert result.unattributed.tolist() == [0.0, 0.0]
    # Overlapping for 60 and 40 ns of a 100 ns sample, with no idle time: 60 % and 40 %.
    result = attribute_samples([0], [100], [[1000.0]], [0, 60], [60, 100], ["a", "b"],
                               interval_ns=10)
    assert result.own_share[:, 0].tolist() == pytest.approx([600.0, 400.0])


def test_short_kernels_are_pooled_per_name_and_shared_by_duration() -> None:
    # Sampling interval 100 ns; "tiny" runs three times (10, 10 and 20 ns), "big" once for 200 ns.
    sample_start, sample_end = [0, 100, 200, 300], [100, 200, 300, 400]
    values = np.array([[100.0], [200.0], [300.0], [400.0]])
    kernel_start, kernel_end = [0, 50, 120, 200], [10, 60, 140, 400]
    names = ["tiny", "tiny", "tiny", "big"]
    result = attribute_samples(sample_start, sample_end, values, kernel_start, kernel_end, names)
    own = reference(sample_start, sample_end, values, kernel_start, kernel_end)
    np.testing.assert_allclose(result.own_share, own)
    assert result.short.tolist() == [True, True, True, False]
    assert result.names == ["tiny"]
    pool = own[:3, 0].sum()  # 10 + 10 + 40
    assert result.name_values[0, 0] == pytest.approx(pool)
    assert result.name_counts.tolist() == [3] and result.name_dur_ns.tolist() == [40]
    np.testing.assert_allclose(result.kernel_values[:3, 0], [pool * 10 / 40, pool * 10 / 40, pool * 20 / 40])
    assert result.kernel_values[3, 0] == pytest.approx(own[3, 0])  # long: its own share


def test_random_runs_match_the_reference_and_conserve_counts() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 30))
        lengths = rng.integers(50, 150, n)
        gaps = rng.integers(0, 3, n) * rng.integers(0, 40, n)  # samples may leave gaps
        sample_start = np.cumsum(lengths + gaps) - lengths
        sample_end = sample_start + lengths
        values = rng.uniform(0, 1000, (n, 3))
        k = int(rng.integers(0, 40))
        kernel_start = rng.integers(-50, int(sample_end[-1]) + 50, k)
        kernel_end = kernel_start + rng.integers(0, 400, k)
        names = [f"k{i}" for i in rng.integers(0, 4, k)]
        result = attribute_samples(sample_start, sample_end, values, kernel_start, kernel_end, names)
        own = reference(sample_start.tolist(), sample_end.tolist(), values,
                        kernel_start.tolist(), kernel_end.tolist())
        np.testing.assert_allclose(result.own_share, own, rtol=1e-9, atol=1e-9)
        # Nothing created or lost: kernels' values plus the unattributed rest are the samples' sum.
        np.testing.assert_allclose(result.kernel_values.sum(axis=0) + result.unattributed,
                                   values.sum(axis=0), rtol=1e-9)
        assert (result.unattributed >= -1e-6).all()
        for pool, name in enumerate(result.names):
            members = [i for i in range(k) if names[i] == name and result.short[i]]
            np.testing.assert_allclose(result.name_values[pool], own[members].sum(axis=0), atol=1e-9)
            np.testing.assert_allclose(result.kernel_values[members].sum(axis=0),
                                       own[members].sum(axis=0), atol=1e-9)


def test_overlap_pairs_skips_gaps_and_touching_edges() -> None:
    samples, kernels, overlap = overlap_pairs(np.array([0, 200]), np.array([100, 300]),
                                              np.array([100, 150, 90]), np.array([200, 160, 210]))
    # Kernel 0 touches both samples only at their edges; kernel 1 sits in the gap.
    assert sorted(zip(samples.tolist(), kernels.tolist(), overlap.tolist(), strict=True)) == [
        (0, 2, 10), (1, 2, 10)]


def test_edge_cases() -> None:
    empty = attribute_samples([], [], np.zeros((0, 2)), [5], [9], ["k"])
    assert empty.own_share.shape == (1, 2) and empty.kernel_values.tolist() == [[0.0, 0.0]]
    none = attribute_samples([0], [10], [[4.0]], [], [], [])
    assert none.kernel_values.shape == (0, 1) and none.unattributed.tolist() == [4.0]
    with pytest.raises(ValueError, match="overlap"):
        attribute_samples([0, 5], [10, 15], [[1.0], [1.0]], [], [], [])
    with pytest.raises(ValueError, match="matching"):
        attribute_samples([0], [10], [[1.0]], [0, 1], [2], ["a", "b"])


# --- the compaction step over a rank's files (dlprof.store.pm_samples) ------------------------

def _samples(ends: list[int], lengths: list[int], values: list[float], device: str = "cuda:0") -> pa.Table:
    """Counter rows as the cupti_metrics collector writes them: one metric and each sample's length."""
    n = len(ends)
    return pa.table({"pid": [1] * 2 * n, "device": [device] * 2 * n,
                     "track": ["cupti.smsp__inst_executed.sum"] * n + [DURATION_TRACK] * n,
                     "ts_ns": ends * 2, "value": [*values, *map(float, lengths)],
                     "unit": ["count"] * n + ["ns"] * n})


def _kernels(spans: list[tuple[int, int]], device: str = "cuda:0") -> pa.Table:
    n = len(spans)
    return pa.table({"id": list(range(100, 100 + n)), "pid": [1] * n, "tid": [7] * n, "device": [device] * n,
                     "kind": ["kernel"] * n, "name": [f"k{i}" for i in range(n)],
                     "start_ns": [a for a, _ in spans], "dur_ns": [b - a for a, b in spans]})


def _metrics(run_dir: Path) -> dict[int, float]:
    table = ds.dataset(run_dir / "metrics", format="parquet", partitioning="hive").to_table()
    return dict(zip(table["slice_id"].to_pylist(), table["value"].to_pylist(), strict=True))


def test_compaction_attributes_once_and_only_kernels_the_samples_saw(tmp_path: Path) -> None:
    writer = RankWriter(tmp_path, 0, {"rank": "0"})
    writer.write_chunk(StoreTable.SLICES, _kernels([(0, 150), (150, 200), (900, 950)]), "cupti")
    writer.write_chunk(StoreTable.COUNTERS, _samples([100, 200], [100, 100], [1000.0, 2000.0]), "pm_sampling")
    counts, _ = writer.compact()
    # The third kernel ran while nothing sampled: no value at all, rather than zero.
    assert _metrics(tmp_path) == pytest.approx({100: 1000.0 + 1000.0, 101: 1000.0})
    assert counts["metrics"] == 2
    summary = read_summary(tmp_path, 0)
    assert summary is not None and summary.devices["cuda:0"].attributed == 2
    assert summary.devices["cuda:0"].kernels == 3
    assert attribute_rank(tmp_path, 0) is None  # done before: not again
    writer.compact()
    assert len(list((tmp_path / "metrics" / "rank=0").glob("part-*"))) == 1


def test_samples_that_overlap_or_lack_a_length_are_left_out_and_counted(tmp_path: Path) -> None:
    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, _kernels([(0, 400)]), "cupti")
    rows = _samples([100, 150, 300], [100, 100, 100], [1.0, 5.0, 3.0])  # the second overlaps the first
    lost = pa.table({"pid": [1], "device": ["cuda:0"], "track": ["cupti.smsp__inst_executed.sum"],
                     "ts_ns": [400], "value": [7.0], "unit": ["count"]})  # a count with no length
    writer.write_chunk(StoreTable.COUNTERS, pa.concat_tables([rows, lost]), "pm_sampling")
    writer.compact()
    assert _metrics(tmp_path) == pytest.approx({100: 4.0})
    summary = read_summary(tmp_path, 0)
    assert summary is not None
    device = summary.devices["cuda:0"]
    assert device.dropped == {"a count with no sample length": 1, "it overlapped the sample before": 1}
    assert "2 samples shared among 1 of its 1 kernels" in device.note("cuda:0")


def test_each_device_gets_its_own_samples_and_no_kernels_is_said(tmp_path: Path) -> None:
    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, _kernels([(0, 100)], "cuda:1"), "cupti")
    writer.write_chunk(StoreTable.COUNTERS, pa.concat_tables([_samples([100], [100], [8.0], "cuda:1"),
                                                              _samples([100], [100], [9.0], "cuda:0")]), "pm")
    writer.compact()
    assert _metrics(tmp_path) == pytest.approx({100: 8.0})
    summary = read_summary(tmp_path, 0)
    assert summary is not None
    assert sorted(summary.notes()) == [
        "cuda:0: no kernel slices to attribute 1 samples to (collect them with the cupti or torch collector)",
        "cuda:1: 1 samples shared among 1 of its 1 kernels; 0 % of smsp__inst_executed.sum fell outside every kernel"]


def test_a_rank_without_pm_samples_is_left_as_it_is(tmp_path: Path) -> None:
    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, _kernels([(0, 100)]), "cupti")
    writer.write_chunk(StoreTable.COUNTERS, pa.table({"pid": [1], "device": ["cuda:0"], "track": ["nvml.power"],
                                                      "ts_ns": [50], "value": [300.0], "unit": ["W"]}), "nvml")
    writer.compact()
    assert not (tmp_path / "metrics").exists() and read_summary(tmp_path, 0) is None


def test_dlprof_finish_attributes_a_killed_runs_samples(tmp_path: Path) -> None:
    """Saves a killed run left waiting: made final by ``finish_pending``, then attributed."""
    from dlprof.recording.finisher import finish_pending
    from dlprof.store.save_jobs import PendingSaves, SaveJob

    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, _kernels([(0, 100)]), "cupti")
    writer.write_chunk(StoreTable.COUNTERS, _samples([100], [100], [6.0]), "pm_sampling")
    PendingSaves(tmp_path, 0).put(SaveJob(run_dir=tmp_path, rank=0, number=0, metadata={},
                                          chunks=writer.take_written(), cycles=[], open_slices=[],
                                          open_before=[]))
    assert finish_pending(tmp_path) == 1
    assert _metrics(tmp_path) == pytest.approx({100: 6.0})


def test_samples_that_cannot_be_shared_leave_the_reason_not_an_error(tmp_path: Path) -> None:
    writer = RankWriter(tmp_path, 0)
    writer.write_chunk(StoreTable.SLICES, _kernels([(0, 100)]), "cupti")
    writer.write_chunk(StoreTable.COUNTERS, _samples([100], [100], [6.0]), "pm_sampling")
    kernels = tmp_path / "slices" / "rank=0"
    writer.compact()  # attributed once: now make a second run of the step fail on a damaged file
    (tmp_path / "metrics").rename(tmp_path / "attributed")
    next(kernels.glob("part-*")).write_bytes(b"PAR1 damaged PAR1")
    summary = attribute_rank(tmp_path, 0)
    assert summary is not None and summary.devices == {}
    assert summary.problem.startswith("PM samples not attributed to kernels: ")
    assert read_summary(tmp_path, 0) == summary
