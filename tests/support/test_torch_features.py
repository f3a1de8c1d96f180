"""The torch features dlprof finds, checked against the installed torch itself.

`make test-torch-versions` runs this module in an environment per torch release (2.4, 2.11,
2.15; `make test` runs it on the pinned 2.13), so each assertion holds on every supported torch:
what is found is what torch really accepts, and the collector records with what there is.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import dlprof
from dlprof.support.torch_features import (
    CONFIG_FIELDS,
    TRACE_ONLY,
    experimental_config,
    missing_apis,
    skip_python_events,
    torch_features,
)
from tests.conftest import EXAMPLES, dlprof_program, profile_tiny_cnn

pytestmark = pytest.mark.torch

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
from torch._C._profiler import _ExperimentalConfig  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402
from torch.profiler.profiler import _KinetoProfile  # noqa: E402


def test_every_api_the_collector_reaches_into_is_there() -> None:
    features = torch_features()
    assert features.missing == () and missing_apis(features) is None, features


def test_the_config_fields_found_are_those_torchs_own_signature_lists() -> None:
    # pybind11 writes the constructor's keywords into its docstring: a second way to ask torch.
    signature = _ExperimentalConfig.__init__.__doc__ or ""
    listed = {field for field in CONFIG_FIELDS if f"{field}: bool" in signature}
    assert torch_features().config_fields == listed, signature[:400]


def test_the_experimental_config_builds_and_notes_each_field_this_torch_lacks() -> None:
    """torch 2.11 refused ``trace_only`` with a TypeError, and the collector did not start."""
    features = torch_features()
    config, notes = experimental_config(features, all_threads=True, trace_only=True)
    assert isinstance(config, _ExperimentalConfig)
    assert len(notes) == len(CONFIG_FIELDS) - len(features.config_fields)
    for field in features.config_fields:
        assert getattr(config, field, True) is True  # asked for and accepted: set (where readable)
    _, notes = experimental_config(features, all_threads=False, trace_only=False)
    assert notes == []


def _recording(skip: bool) -> _KinetoProfile:
    profile = _KinetoProfile(activities=[ProfilerActivity.CPU], record_shapes=True)
    profile.prepare_trace()
    if skip:
        skip_python_events(torch_features(), profile.profiler)
    profile.start_trace()
    x = torch.randn(16, 16)
    for _ in range(20):
        x = x @ x / 16
    profile.stop_trace()
    return profile


def _python_events_built(profile: _KinetoProfile) -> int:
    events = getattr(profile.profiler, "_function_events", None)  # lazily parsing torch
    if events is None and not hasattr(profile.profiler, "_ensure_function_events"):
        events = profile.profiler.function_events  # torch that parses at every stop
    return len(events or ())


def test_a_stop_builds_python_events_only_where_torch_parses_at_stop() -> None:
    features = torch_features()
    built = _python_events_built(_recording(skip=False))
    assert (built > 20) == features.parses_at_stop, (built, features)


def test_skipping_python_events_keeps_the_trace_whole(tmp_path: Path) -> None:
    kept, skipped = _recording(skip=False), _recording(skip=True)
    assert _python_events_built(skipped) == 0
    names = []
    for profile, name in ((kept, "kept.json"), (skipped, "skipped.json")):
        profile.export_chrome_trace(str(tmp_path / name))
        names.append([e["name"] for e in json.loads((tmp_path / name).read_text())["traceEvents"]
                      if e.get("cat") == "cpu_op"])
    assert names[0].count("aten::matmul") == names[1].count("aten::matmul") == 20


def test_the_collector_records_ops_and_says_what_this_torch_lacks(tmp_path: Path) -> None:
    run = dlprof.load(profile_tiny_cnn(tmp_path / "run", steps=3, collectors=("torch",)))
    assert (run.slices["name"] == "aten::convolution").sum() == 3  # one forward convolution a step
    [torch_info] = [c for c in run.manifest.collectors if c.name == "torch"]
    assert torch_info.active
    lacks_trace_only = [n for n in torch_info.notes if "no trace_only" in n]
    assert bool(lacks_trace_only) == (TRACE_ONLY not in torch_features().config_fields), torch_info.notes


def test_dlprof_run_leaves_no_profiler_chatter_on_the_programs_stderr(tmp_path: Path) -> None:
    """A CUDA build of torch on a machine without a GPU driver prints Kineto's
    ``gpuGetDeviceCount failed`` at the first save: Kineto's line, not the program's."""
    done = subprocess.run([*dlprof_program(), "run", "-o", str(tmp_path / "run"), "--collectors", "torch",
                           str(EXAMPLES / "torch_cnn.py"), "--steps", "2", "--batch-size", "4"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gpuGetDeviceCount" not in done.stderr and "USDT:" not in done.stderr, done.stderr[-2000:]


def test_all_threads_on_a_torch_without_it_says_so(tmp_path: Path) -> None:
    if torch_features().all_threads:
        pytest.skip(f"torch {torch.__version__} has profile_all_threads")
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "--all-threads", "-o", str(tmp_path / "run"),
                           "--collectors", "torch", str(EXAMPLES / "torch_cnn.py"), "--steps", "1",
                           "--batch-size", "4"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    notes = " ".join(next(c for c in dlprof.load(tmp_path / "run").manifest.collectors if c.name == "torch").notes)
    assert "has no profile_all_threads" in notes and "their ops recorded" not in notes, notes
