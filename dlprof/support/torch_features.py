"""What the installed torch offers of the version-specific APIs dlprof uses, asked of torch itself.

dlprof supports torch 2.4 through 2.15, and the profiler's private surface moves between those
releases: ``_ExperimentalConfig`` gained ``profile_all_threads`` after 2.4 and ``trace_only`` in
2.13 (a keyword an older torch refuses with ``TypeError``), and up to torch 2.4 stopping a
recording turns every event into a Python ``FunctionEvent`` on the spot (later releases do that
only when ``events()`` is asked for). No version string is compared: each feature is found by
asking the API (the keywords the config accepts, the attributes that are there), so a release in
between, or a backport, gets what it really has::

    features = torch_features()
    config, notes = experimental_config(features, all_threads=False, trace_only=True)
    profiler = _KinetoProfile(..., experimental_config=config)
    profiler.prepare_trace()
    skip_python_events(features, profiler.profiler)

Where a feature is missing the collector keeps working without it and says, in a note, what
that costs. What the collector cannot work without is listed by :func:`missing_apis`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

# The _ExperimentalConfig keywords dlprof may pass, and what a torch without one loses.
ALL_THREADS = "profile_all_threads"
TRACE_ONLY = "trace_only"
CONFIG_FIELDS = (ALL_THREADS, TRACE_ONLY)

# What the torch collector and the range splitter (support/torch_ranges.py) reach into, by
# dotted path from the torch module: the profiler they drive, the ops that end and enter a
# record_function range again at a cut, and what tells Python inside a C++ range.
COLLECTOR_APIS = (
    "profiler.profiler._KinetoProfile",
    "_C._profiler._ExperimentalConfig",
    "autograd.profiler.record_function",
    "ops.profiler._record_function_enter_new",
    "ops.profiler._record_function_exit._RecordFunction",
    "_C._current_autograd_node",
    "_C._FunctionBase",
)
# The attributes of a record_function instance that the range splitter reads and sets.
RANGE_ATTRIBUTES = ("name", "args", "record", "run_callbacks_on_exit")


@dataclass(frozen=True)
class TorchFeatures:
    """What one torch offers, found once per process by :func:`torch_features`."""

    version: str  # torch.__version__, for notes only: nothing is decided on it
    config_fields: frozenset[str]  # the keywords of CONFIG_FIELDS that _ExperimentalConfig accepts
    parses_at_stop: bool  # stopping a recording builds Python FunctionEvents from all its events
    missing: tuple[str, ...]  # APIs of COLLECTOR_APIS / RANGE_ATTRIBUTES this torch lacks

    @property
    def trace_only(self) -> bool:
        return TRACE_ONLY in self.config_fields

    @property
    def all_threads(self) -> bool:
        return ALL_THREADS in self.config_fields


@functools.cache
def torch_features() -> TorchFeatures:
    """The installed torch's features (imports torch: call it where torch is already imported)."""
    import torch

    missing = [f"torch.{path}" for path in COLLECTOR_APIS if _lookup(torch, path) is None]
    record_function = _lookup(torch, "autograd.profiler.record_function")
    if record_function is not None:
        attributes = vars(record_function("dlprof.probe"))  # made, never entered: records nothing
        missing += [f"record_function.{name}" for name in RANGE_ATTRIBUTES if name not in attributes]
    profile = _lookup(torch, "autograd.profiler.profile")
    return TorchFeatures(
        version=str(torch.__version__),
        config_fields=frozenset(field for field in CONFIG_FIELDS if _config_accepts(field)),
        # Lazy parsing came with _ensure_function_events; before it, __exit__ parses everything.
        parses_at_stop=profile is not None and not hasattr(profile, "_ensure_function_events"),
        missing=tuple(missing),
    )


def missing_apis(features: TorchFeatures) -> str | None:
    """One line naming what the torch collector needs and this torch lacks, or None."""
    if not features.missing:
        return None
    return f"torch {features.version} lacks {', '.join(features.missing)}"


def experimental_config(features: TorchFeatures, *, all_threads: bool, trace_only: bool) -> tuple[Any, list[str]]:
    """Kineto's experimental config with what this torch accepts of what is asked, and the notes
    for what it does not.

    Args:
        features: from :func:`torch_features`.
        all_threads: record every Python thread's ops (``profile_all_threads``).
        trace_only: skip building torch's own event list at each stop (only the trace is read).

    Returns:
        The ``_ExperimentalConfig`` and one note per asked-for field this torch lacks.
    """
    config_class = _config_class()
    asked = {ALL_THREADS: all_threads, TRACE_ONLY: trace_only}
    notes = []
    if all_threads and not features.all_threads:
        notes.append(f"all threads: torch {features.version}'s profiler has no profile_all_threads; "
                     "only the profiling thread's ops were recorded")
    if trace_only and not features.trace_only:
        # Measured on torch 2.13's CPU build: 304 MiB more at the stop of 105,000 events without
        # trace_only, 231 MiB with it; the stop itself took about as long.
        notes.append(f"torch {features.version} has no trace_only (torch 2.13 and later): each stop of a "
                     "recording also builds torch's own list of its events, which dlprof never reads "
                     "(about 0.7 KiB of memory an event until the next stop)")
    accepted = {field: value for field, value in asked.items() if field in features.config_fields}
    return config_class(**accepted), notes


def skip_python_events(features: TorchFeatures, profile: Any) -> bool:
    """On a torch that parses every event into Python at each stop, make ``profile`` skip that.

    dlprof reads only the trace Kineto saves in C++, never ``events()``; up to torch 2.4 each
    stop would still spend tens of microseconds per event, on the program's thread, and keep every
    cycle's events alive until the end. Call it after each ``prepare_trace`` (which may make a new
    ``torch.autograd.profiler.profile``); other profilers the program runs are untouched.

    Returns:
        Whether the profile was changed (False where torch parses only when asked).
    """
    if not features.parses_at_stop:
        return False
    profile._parse_kineto_results = _no_python_events
    return True


def _no_python_events(result: Any) -> list[Any]:
    return []


def _config_class() -> Any:
    """``_ExperimentalConfig``, untyped: its keywords are those of the torch installed, not of the
    one whose type stubs mypy reads."""
    from torch._C._profiler import _ExperimentalConfig

    return _ExperimentalConfig


def _config_accepts(field: str) -> bool:
    try:
        _config_class()(**{field: False})
    except TypeError:  # pybind11's "incompatible constructor arguments": a keyword it does not know
        return False
    return True


def _lookup(root: Any, path: str) -> Any:
    """The object at ``path`` under ``root``, or None where any part is missing."""
    found = root
    for part in path.split("."):
        try:
            found = getattr(found, part)
        except (AttributeError, RuntimeError):  # torch.ops raises RuntimeError for an unknown op
            return None
    return found
