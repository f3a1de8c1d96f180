"""The names every command shares: event kinds, run states, sort and grouping keys, formats.

Commands take these as choices (``dlprof top --by self --kind module``), so a key exists in one
place and its help text with it. Kinds are an open set in the store (an imported trace may carry
its own category as a kind); :class:`Kind` lists the ones dlprof itself understands.
"""

from __future__ import annotations

from enum import StrEnum


class Kind(StrEnum):
    """What a slice is."""

    STEP = "step"
    REGION = "region"
    MODULE = "module"
    OP = "op"
    KERNEL = "kernel"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    RUNTIME = "runtime"
    COMM = "comm"
    PYTHON = "python"
    USER_ANNOTATION = "user_annotation"
    DATALOADER = "dataloader"  # a DataLoader fetching one batch, in a worker or in the loop
    # The training loop waiting for its next batch: PyTorch's ``enumerate(DataLoader)#...``
    # ranges, tf.data's IteratorGetNext on the host (dlprof/importers/data_wait.py).
    DATA_WAIT = "data_wait"
    # dlprof itself holding the program's thread (a save, a profiler cycle's stop and start, a
    # flush), on the thread it held: never the user's time in any analysis.
    PROFILER = "profiler"
    # torch.compile compiling (Dynamo's and Inductor's phases, dlprof/importers/compile_phases.py):
    # set-up, not the ops of a step.
    COMPILE = "compile"


# Work that runs on an accelerator rather than on a CPU thread.
DEVICE_KINDS = frozenset({Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET})

# The range dlprof opens at the start of every profiler cycle, timed on its own clock too: how
# the framework's clock is mapped onto dlprof's (torch.profiler's and TensorFlow's traces).
CLOCK_MARKER = "dlprof::clock_sync"
# Kineto's per-kernel counter ranges (CUPTI range profiler): their durations are placeholders.
PROFILER_RANGE = "cuda_profiler_range"
# The category of layer slices derived from TensorFlow name scopes (a Keras layer's ops): the
# graph executor interleaves a layer's ops with others', so one call is several such slices.
SCOPE_LAYER_CATEGORY = "name_scope"

# As TAU throttles a timer: a name recorded more than this many times at under this many ns a
# call on average is counted from then on, not traced (dlprof/store/slice_buffer.py).
THROTTLE_CALLS = 100_000
THROTTLE_PER_CALL_NS = 10_000

# CPU counter metrics that count nanoseconds (perf's software clocks, unit "ns" in
# dlprof/support/perf_event.py); every other counter metric counts events. Tables show these
# in the table's time unit.
NANOSECOND_COUNTERS = frozenset({"perf:task-clock", "perf:cpu-clock"})

# When two slices start together and last as long, the outer one is the one that comes first here.
NESTING_ORDER: dict[str, int] = {
    Kind.STEP: 0,
    Kind.REGION: 1,
    # The loop's wait for a batch holds the fetch when the loop fetches itself (num_workers=0).
    Kind.DATA_WAIT: 1,
    Kind.DATALOADER: 2,
    Kind.USER_ANNOTATION: 3,
    Kind.MODULE: 4,
    Kind.PYTHON: 5,
    Kind.OP: 6,
    Kind.COMM: 6,
    Kind.COMPILE: 6,
    Kind.RUNTIME: 7,
    Kind.KERNEL: 8,
    Kind.MEMCPY: 8,
    Kind.MEMSET: 8,
}


class RunStatus(StrEnum):
    """The state a run directory is in, as ``run.json`` records it."""

    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    # The program ran to its end but the recording is not whole (a collector that could not start
    # or stopped, a full disk): Manifest.degraded says why.
    DEGRADED = "degraded"
    # Never written: a reader reports it for a manifest left "running" with no live writer.
    KILLED = "killed"


class SortKey(StrEnum):
    """``dlprof top --by``: what the table is ordered by."""

    TOTAL = "total"  # total time, nested work included
    # tfprof's name for total time, which ``--by`` first took: an alias, so SortKey.MICROS and
    # SortKey("micros") are SortKey.TOTAL.
    MICROS = "total"
    SELF = "self"
    CALLS = "calls"
    BYTES = "bytes"
    FLOPS = "flops"
    DEVICE = "device"

    @classmethod
    def _missing_(cls, value: object) -> SortKey | None:
        if isinstance(value, str):
            return SORT_KEY_ALIASES.get(value.lower())
        return None


# Older spellings ``--by`` still takes, each with the key it means.
SORT_KEY_ALIASES: dict[str, SortKey] = {"micros": SortKey.TOTAL}


class GroupKey(StrEnum):
    """``dlprof top --group-by``: what one row aggregates."""

    NAME = "name"
    SHAPE = "shape"
    OP = "op"  # device work under the CPU op that launched it
    TYPE = "type"  # tfprof's op view: ops by their logical type (MatMul, Conv2D, aten::mm)


class TreeView(StrEnum):
    """``dlprof tree --view``: which hierarchy time is attributed to."""

    SCOPE = "scope"  # name scopes (TensorFlow) or module paths (PyTorch)
    CODE = "code"  # Python frames, file:line:function


class DiffBasis(StrEnum):
    """``dlprof diff --per``: what the times of the two runs are divided by before comparing."""

    STEP = "step"  # each run's number of steps: runs of different lengths compare
    RUN = "run"  # nothing: whole-run totals


class TableFormat(StrEnum):
    """How a table command prints: for a person or for a script."""

    TABLE = "table"
    CSV = "csv"
    JSON = "json"


class StoreTable(StrEnum):
    """The tables of a run directory, one Parquet dataset each."""

    SLICES = "slices"
    COUNTERS = "counters"
    METRICS = "metrics"
    MEMORY = "memory"
    SERIES = "series"  # metric values over training (dlprof.log, Keras logs, MLPerf log lines)


class SeriesSource(StrEnum):
    """Where a row of the ``series`` table came from."""

    LOG = "log"  # the program called dlprof.log()
    KERAS = "keras"  # a Keras fit's callback logs, under ``dlprof run``
    MLPERF = "mlperf"  # an MLPerf ``:::MLLOG`` line the program printed, under ``dlprof run``


class EngineKind(StrEnum):
    """``--engine``: the query engine that runs the analyses."""

    DUCKDB = "duckdb"  # embedded, out of core: the default
    SPARK = "spark"  # Apache Spark, for runs larger than one machine (the ``spark`` extra)
