"""XPlane import: profiles written by TensorFlow's own profiler, read back with TensorFlow's own
protobuf modules to compute what dlprof's tables must hold."""

from __future__ import annotations

import subprocess
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import dlprof
from dlprof.importers.hlo import hlo_ops
from dlprof.importers.tf_ops import layer_chain, logical_type, parse_op_event
from dlprof.importers.trace_file import TraceImportError, import_traces
from dlprof.importers.xplane import XPlaneOptions, convert_xspace
from dlprof.importers.xplane import read_xspace as dlprof_read_xspace
from dlprof.importers.xplane_stats import fold_id
from dlprof.keys import RunStatus
from tests.conftest import dlprof_program
from tests.tensorflow_runs import (
    BATCHES,
    dense_scopes,
    events,
    op_events,
    op_name,
    ops_matching_the_profile,
    read_xspace,
    tensorflow,
)

pytestmark = pytest.mark.tf

def profile_start(path: Path) -> int:
    [task] = [p for p in read_xspace(path).planes if p.name == "Task Environment"]
    names = {m.id: m.name for m in task.stat_metadata.values()}
    return next(int(s.uint64_value or s.int64_value) for s in task.stats
                if names[s.metadata_id] == "profile_start_time")


@pytest.fixture(scope="module")
def imported(tf_profile: Path, tmp_path_factory: pytest.TempPathFactory) -> dlprof.Run:
    out = tmp_path_factory.mktemp("imported") / "run"
    import_traces([tf_profile], out)
    return dlprof.load(out)


def test_every_op_event_is_an_op_slice_with_its_types(tf_profile: Path, imported: dlprof.Run) -> None:
    ops = ops_matching_the_profile(imported, tf_profile)
    assert {"_MklNativeFusedMatMul", "_MklMatMul"} <= set(ops.category), "oneDNN kernels, as TensorFlow names them"
    for raw, logical in zip(ops.category, ops.op_type, strict=True):
        if not raw.startswith("_"):
            assert logical == raw
    types = dict(zip(ops.category, ops.op_type, strict=True))
    assert types["_MklMatMul"] == types["_MklNativeFusedMatMul"] == "MatMul"


def test_scopes_and_times(tf_profile: Path, imported: dlprof.Run) -> None:
    base = profile_start(tf_profile)
    expected = Counter((op_name(e), base + e.offset_ps // 1000, e.duration_ps / 1000) for e in op_events(tf_profile))
    ops = imported.slices[imported.slices.kind == "op"]
    found = Counter(zip(ops.name, ops.start_ns, ops.dur_ns, strict=True))
    # Picoseconds become whole nanoseconds: within one of the exact figure.
    assert sorted((n, s) for n, s, _ in expected.elements()) == sorted((n, s) for n, s, _ in found.elements())
    durations = defaultdict(list)
    for name, _, dur in found.elements():
        durations[name].append(dur)
    for name, _, dur in expected.elements():
        assert min(abs(d - dur) for d in durations[name]) <= 1
    scoped = ops[ops.name.str.contains("/")]
    assert (scoped.scope == scoped.name.str.rsplit("/", n=1).str[0]).all()
    assert ops[~ops.name.str.contains("/")].scope.isna().all()
    [clock] = [c for c in imported.manifest.clocks if c.name == "xplane"]
    assert "profile_start_time" in clock.method and clock.offset_ns == 0


def test_layer_slices_hold_their_layers_ops(tf_profile: Path, imported: dlprof.Run) -> None:
    scopes = dense_scopes(tf_profile)
    assert len(scopes) == 3, "three Dense layers"
    slices = imported.slices
    modules = slices[slices.kind == "module"].set_index("id")
    children = slices.dropna(subset=["parent_id"]).groupby("parent_id")
    for scope in scopes:
        for direction, prefix in (("forward", ""), ("backward", "gradient_tape/")):
            mine = modules[modules.name == f"{scope} {direction}"]
            assert len(mine), (scope, direction)
            expected = sum(e.duration_ps for e in op_events(tf_profile)
                           if op_name(e).startswith(f"{prefix}{scope}/"))
            held = pd.concat([children.get_group(i) for i in mine.index])
            assert set(held.kind) == {"op"}, "a Dense layer holds ops, no layer below it"
            assert abs(held.dur_ns.sum() - expected / 1000) <= len(held)
            for module_id, module in mine.iterrows():
                kids = children.get_group(module_id)
                assert module.start_ns == kids.start_ns.min()
                assert module.start_ns + module.dur_ns == (kids.start_ns + kids.dur_ns).max()


def test_the_model_scope_encloses_its_layers(tf_profile: Path, imported: dlprof.Run) -> None:
    slices = imported.slices
    modules = slices[slices.kind == "module"]
    by_id = slices.set_index("id")
    [model] = {scope.split("/")[0] for scope in dense_scopes(tf_profile)}
    inner = modules[modules.name.str.startswith(f"{model}/")]
    assert len(inner) >= 3 * 2 * BATCHES, "three layers, forward and backward, in every step"
    for parent in inner.parent_id:
        assert by_id.loc[parent, "name"].split(" ")[0] == model


def test_xla_ops_are_the_tensorflow_ops_they_were_compiled_from(tf_xla_profile: Path, tmp_path: Path) -> None:
    tensorflow()
    from tensorflow.compiler.xla.service import hlo_pb2

    space = read_xspace(tf_xla_profile)
    [metadata] = [p for p in space.planes if p.name == "/host:metadata"]
    instructions: dict[tuple[str, str], Any] = {}
    for event_metadata in metadata.event_metadata.values():
        for stat in event_metadata.stats:
            proto = hlo_pb2.HloProto.FromString(stat.bytes_value)
            for computation in proto.hlo_module.computations:
                for instruction in computation.instructions:
                    instructions[(proto.hlo_module.name, instruction.name)] = instruction
    hlo_events = [e for e in events(space) if "hlo_op" in e.stats and e.duration_ps > 0]
    assert hlo_events, "an XLA-compiled step records HLO instructions"
    expected = Counter()
    for event in hlo_events:
        instruction = instructions[(event.stats["hlo_module"], event.stats["hlo_op"])]
        if instruction.metadata.op_name:
            expected[(instruction.metadata.op_name, f"xla:{instruction.opcode}")] += 1
    out = tmp_path / "run"
    import_traces([tf_xla_profile], out)
    slices = dlprof.load(out).slices
    ops = slices[slices.category.str.startswith("xla", na=False)]
    assert len(ops) == len(hlo_events)
    found = Counter(zip(ops.name, ops.category, strict=True))
    assert expected - found == Counter(), "every instruction XLA named an op for is that op"
    dots = ops[ops.category == "xla:dot"]
    assert len(dots) and set(dots.op_type) == {"MatMul"}
    modules = set(slices[slices.kind == "module"].name)
    for scope in {n.rsplit("/", 1)[0] for n in dots.name if not n.startswith("gradient_tape/")}:
        assert {f"{scope} forward", f"{scope} backward"} <= modules


def test_hlo_decoder_agrees_with_xla_protobuf(tf_xla_profile: Path) -> None:
    tensorflow()
    from tensorflow.compiler.xla.service import hlo_pb2

    [metadata] = [p for p in read_xspace(tf_xla_profile).planes if p.name == "/host:metadata"]
    [serialized] = [s.bytes_value for m in metadata.event_metadata.values() for s in m.stats]
    name, ops = hlo_ops(serialized)
    proto = hlo_pb2.HloProto.FromString(serialized)
    assert name == proto.hlo_module.name
    every = [i for c in proto.hlo_module.computations for i in c.instructions]
    assert len(ops) == len(every)
    for instruction in every:
        if instruction.metadata.op_name:
            op = ops[instruction.name]
            assert (op.opcode, op.tf_name, op.tf_type) == (
                instruction.opcode, instruction.metadata.op_name, instruction.metadata.op_type)


def test_allocator_events_become_memory_rows(tf_profile: Path, imported: dlprof.Run) -> None:
    # A CPU profile holds only what TensorFlow's default CPU allocator records (large blocks),
    # whatever that is here: the memory table holds exactly those.
    signs = {"MemoryAllocation": 1, "MemoryDeallocation": -1}
    allocations = [e for e in events(read_xspace(tf_profile)) if e.name in signs]
    expected = Counter((signs[e.name] * e.stats["allocation_bytes"], e.stats["bytes_allocated"]) for e in allocations)
    memory = imported.memory
    assert Counter(zip(memory.bytes, memory.total_allocated, strict=True)) == expected


def test_parsing_names() -> None:
    op = parse_op_event("StatefulPartitionedCall/mlp_1/hidden_1/Relu:_MklNativeFusedMatMul")
    assert op is not None
    assert (op.name, op.raw_type, op.op_type, op.scope) == (
        "mlp_1/hidden_1/Relu", "_MklNativeFusedMatMul", "MatMul", "mlp_1/hidden_1")
    assert op.layers == ("mlp_1 forward", "mlp_1/hidden_1 forward")
    for traceme in ("end: copy.2", "ThreadpoolListener::Record", "EagerLocalExecute: RangeDataset",
                    "Iterator::Root::Prefetch", "ExecutorState::Process"):
        assert parse_op_event(traceme) is None, traceme
    assert parse_op_event("optional:OptionalFromValue") is not None
    assert logical_type("_MklMatMul") == "MatMul"
    assert logical_type("_FusedConv2D") == "Conv2D"
    assert logical_type("_MklNativeFusedBatchNormV3") == "FusedBatchNormV3", "a TensorFlow op of its own"
    assert layer_chain("gradient_tape/mlp/dense/MatMul") == ("mlp backward", "mlp/dense backward")
    # Keras's optimizers open scopes named after their class: they are no layers of the model.
    assert layer_chain("adam/Sub_3") == layer_chain("adam_w_1/Mul") == layer_chain("sgd/AssignAddVariableOp") == ()
    assert layer_chain("adamant/MatMul") == ("adamant forward",)
    assert layer_chain("lstm/while/body/_1/lstm_cell") == ("lstm forward",)
    assert layer_chain("Add") == ()


def test_line_ids_fold_into_thread_ids() -> None:
    for line_id in (-9185311257431169779, 7284188216926946101, 2**63 - 1, -1):
        assert 0 <= fold_id(line_id) < 2**31
        assert fold_id(line_id) == fold_id(line_id)
    assert fold_id(7) == 7, "stream numbers stay as they are"


def test_device_planes_become_kernels_and_copies_linked_to_their_launches() -> None:
    # No GPU here: an XSpace laid out as TensorFlow's CUPTI tracer writes one (stat names as
    # xprof reads them); the real thing is untested.
    tensorflow()
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    task = space.planes.add(name="Task Environment")
    task.stat_metadata[1].id, task.stat_metadata[1].name = 1, "profile_start_time"
    task.stats.add(metadata_id=1, uint64_value=1_700_000_000_000_000_000)
    gpu = space.planes.add(name="/device:GPU:0")
    for stat_id, name in enumerate(["correlation_id", "kernel_details", "memcpy_details", "tf_op"], 1):
        gpu.stat_metadata[stat_id].id, gpu.stat_metadata[stat_id].name = stat_id, name
    for metadata_id, name in ((1, "volta_sgemm_128x64_nn"), (2, "MemcpyH2D")):
        gpu.event_metadata[metadata_id].id, gpu.event_metadata[metadata_id].name = metadata_id, name
    stream = gpu.lines.add(id=7, name="Stream #7(Compute)", timestamp_ns=1000)
    kernel = stream.events.add(metadata_id=1, offset_ps=2_000_000, duration_ps=5_000_000)
    kernel.stats.add(metadata_id=1, uint64_value=42)
    kernel.stats.add(metadata_id=2, str_value="regs:32 static_shared:0 dynamic_shared:1024 grid:80,1,1 block:128,1,1")
    kernel.stats.add(metadata_id=4, str_value="mlp/dense/MatMul:MatMul")
    copy = stream.events.add(metadata_id=2, offset_ps=9_000_000, duration_ps=1_000_000)
    copy.stats.add(metadata_id=1, uint64_value=43)
    copy.stats.add(metadata_id=3, str_value="kind_src:pageable size:4096 dest:device async:0")
    cupti = space.planes.add(name="/host:CUPTI")
    cupti.stat_metadata[1].id, cupti.stat_metadata[1].name = 1, "correlation_id"
    cupti.event_metadata[1].id, cupti.event_metadata[1].name = 1, "cuLaunchKernel"
    launch = cupti.lines.add(id=-123456789, name="python", timestamp_ns=1000).events.add(
        metadata_id=1, offset_ps=1_000_000, duration_ps=500_000)
    launch.stats.add(metadata_id=1, uint64_value=42)
    host = space.planes.add(name="/host:CPU")  # with a Python tracer's event, as JAX records them
    host.event_metadata[1].id, host.event_metadata[1].name = 1, "$train.py:12 train_step"
    host.lines.add(id=5, name="python", timestamp_ns=1000).events.add(metadata_id=1, offset_ps=0, duration_ps=9_000_000)

    slices = convert_xspace(space, XPlaneOptions(id_base=0)).slices.to_pandas().set_index("name")
    assert slices.loc["train.py:12 train_step"].kind == "python"
    kernel_row, copy_row, launch_row = (slices.loc[n] for n in ("volta_sgemm_128x64_nn", "MemcpyH2D", "cuLaunchKernel"))
    assert (kernel_row.kind, kernel_row.device, kernel_row.tid, kernel_row.stream) == ("kernel", "cuda:0", 7, 7)
    assert kernel_row.start_ns == 1_700_000_000_000_000_000 + 1000 + 2000 and kernel_row.dur_ns == 5000
    assert (kernel_row.grid, kernel_row.block, kernel_row.registers, kernel_row.shared_memory) == (
        "[80,1,1]", "[128,1,1]", 32, 1024)
    assert (kernel_row.op_type, kernel_row.scope) == ("MatMul", "mlp/dense")
    assert (copy_row.kind, copy_row.bytes) == ("memcpy", 4096)
    assert (launch_row.kind, launch_row.device) == ("runtime", "cpu")
    assert launch_row.correlation_id == kernel_row.correlation_id == 42


@pytest.mark.parametrize("content", [b"", b"not a protobuf at all \xff\xff\xff", b"\x0a\x05\x12\x03abc"],
                         ids=["empty", "junk", "no-events"])
def test_bad_files_fail_with_one_line_naming_them(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(content)
    with pytest.raises(TraceImportError) as failure:
        import_traces([path], tmp_path / "run")
    message = str(failure.value)
    assert message.startswith(str(path)) and "\n" not in message


def test_a_truncated_profile_fails_on_the_command_line(tf_profile: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "cut.xplane.pb"
    truncated.write_bytes(tf_profile.read_bytes()[:5000])
    done = subprocess.run([*dlprof_program(), "import", "-o", str(tmp_path / "run"), str(truncated)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and str(truncated) in done.stderr
    assert "Traceback" not in done.stderr


def test_import_run_is_complete_and_says_what_it_read(tf_profile: Path, imported: dlprof.Run) -> None:
    assert imported.status is RunStatus.COMPLETE
    [info] = imported.manifest.collectors
    assert info.name == "import:xplane"
    assert imported.manifest.host.hostname == dlprof_read_xspace(tf_profile).hostnames[0]
