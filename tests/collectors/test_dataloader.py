"""DataLoader workers: their batches and regions land in the run, under their own pids."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import dlprof
from dlprof.collectors.dataloader import FETCH, batch_bytes
from dlprof.keys import Kind

torch = pytest.importorskip("torch", reason="needs PyTorch (pip install 'dlprof[torch]')")
pytestmark = pytest.mark.torch

BATCHES, BATCH_SIZE, FEATURES = 6, 4, 32


class _Samples(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return BATCHES * BATCH_SIZE

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with dlprof.region("read_sample"):
            return torch.full((FEATURES,), float(index)), index


@pytest.fixture(scope="module")
def worker_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "workers"
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = torch.utils.data.DataLoader(
        _Samples(), batch_size=BATCH_SIZE, num_workers=2, multiprocessing_context="fork"
    )
    with dlprof.profile(out=out) as prof:
        for x, _ in loader:
            model(x).sum().backward()
            optimizer.step()
            prof.step()
    return out


def test_each_batch_is_fetched_in_a_worker_process(worker_run: Path) -> None:
    slices = dlprof.load(worker_run).slices
    fetches = slices[slices.kind == Kind.DATALOADER]
    assert len(fetches) == BATCHES and set(fetches.name) == {FETCH}
    assert os.getpid() not in set(fetches.pid)
    assert fetches.pid.nunique() == 2, "two workers, each its own process"
    # A batch is float32 features plus int64 indices.
    assert set(fetches.bytes) == {BATCH_SIZE * FEATURES * 4 + BATCH_SIZE * 8}
    assert slices.id.is_unique


def test_regions_in_the_dataset_run_under_the_fetch(worker_run: Path) -> None:
    slices = dlprof.load(worker_run).slices
    reads = slices[(slices.kind == Kind.REGION) & (slices.name == "read_sample")]
    assert len(reads) == BATCHES * BATCH_SIZE
    fetch_ids = set(slices.loc[slices.kind == Kind.DATALOADER, "id"])
    assert set(reads.parent_id) <= fetch_ids


def test_a_worker_fetch_overlaps_the_loop_waiting_for_it(worker_run: Path) -> None:
    slices = dlprof.load(worker_run).slices
    waits = slices[slices.name.str.startswith("enumerate(DataLoader)")]
    fetches = slices[slices.kind == Kind.DATALOADER]
    assert len(waits) and (waits.pid == os.getpid()).all()
    first_wait = waits.sort_values("start_ns").iloc[0]
    # The first batch cannot be ready before the loop asks: its fetch runs during that wait.
    wait_end = first_wait.start_ns + first_wait.dur_ns
    overlapping = fetches[(fetches.start_ns < wait_end) & (fetches.start_ns + fetches.dur_ns > first_wait.start_ns)]
    assert len(overlapping) >= 1


def test_batch_bytes_counts_nested_tensors() -> None:
    batch = {"x": torch.zeros(3, 4), "y": [torch.zeros(5, dtype=torch.int64), "label"]}
    assert batch_bytes(batch) == 3 * 4 * 4 + 5 * 8
    assert batch_bytes("text") == 0


def test_batch_bytes_counts_a_sparse_tensors_parts() -> None:
    """torch gives no nbytes for a sparse tensor (it raises): before, that error reached the
    program's loop from dlprof's fetch wrapper."""
    sparse = torch.sparse_coo_tensor([[0, 1, 2], [2, 0, 1]], [1.0, 2.0, 3.0], (3, 3), check_invariants=True)
    assert batch_bytes(sparse) == 2 * 3 * 8 + 3 * 4
    assert batch_bytes([sparse, torch.zeros(2)]) == 2 * 3 * 8 + 3 * 4 + 2 * 4


class LazyRecord:
    """A sample of the program's whose size is known only once loaded (its ``nbytes`` raises)."""

    def __init__(self, index: int) -> None:
        self.index = index

    @property
    def nbytes(self) -> int:
        raise ValueError(f"record {self.index} is not loaded yet")


class _Records(torch.utils.data.Dataset):  # type: ignore[misc]
    """Tensors, then from index 2 records whose size cannot be read."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> torch.Tensor | LazyRecord:
        return torch.full((FEATURES,), float(index)) if index < 2 else LazyRecord(index)


def test_a_batch_whose_size_cannot_be_read_stops_the_collector_not_the_loop(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before, the record's ValueError reached the program's loop from dlprof's fetch wrapper."""
    loader = torch.utils.data.DataLoader(_Records(), batch_size=None)
    with dlprof.profile(out=tmp_path / "run", collectors=("dataloader", "host")):
        got = [batch.index if isinstance(batch, LazyRecord) else int(batch[0]) for batch in loader]
    assert got == [0, 1, 2, 3, 4], "the program got every batch"
    run = dlprof.load(tmp_path / "run")
    reason = ("dataloader collector: recording failed (ValueError: record 2 is not loaded yet) in its DataLoader "
              "fetch wrapper after step 0: its recording stopped")
    assert run.manifest.degraded == [reason]
    assert capsys.readouterr().err == f"dlprof: {reason}; the program goes on\n"
    assert (run.slices.kind == Kind.DATALOADER).sum() == 2, "the batches fetched before are kept"
    assert (run.slices.kind == "step").sum() == 1, "the other collectors and the session record on"


def test_in_a_worker_a_batch_whose_size_cannot_be_read_stops_the_workers_recording(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(f"""
        import sys, torch, dlprof
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from tests.collectors.test_dataloader import LazyRecord, _Records
        loader = torch.utils.data.DataLoader(_Records(), batch_size=None, num_workers=1,
                                             multiprocessing_context="fork")
        with dlprof.profile(out=sys.argv[1], collectors=("dataloader",)):
            print([batch.index if isinstance(batch, LazyRecord) else int(batch[0]) for batch in loader])
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "[0, 1, 2, 3, 4]\n"
    (line,) = done.stderr.splitlines()
    assert re.fullmatch(r"dlprof: forked process \d+: recording failed \(ValueError: record 2 is not loaded yet\): "
                        r"its recording stopped", line), done.stderr
    fetches = dlprof.load(tmp_path / "run").slices
    assert (fetches.kind == Kind.DATALOADER).sum() == 2, "what the worker fetched before is kept"


def _run_program(tmp_path: Path, body: str, options: tuple[str, ...] = ()) -> tuple[dlprof.Run, str]:
    """``dlprof run`` of a program using the samples above, as a user runs a script."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(f"""
        import torch, dlprof
        class Samples(torch.utils.data.Dataset):
            def __len__(self): return {BATCHES * BATCH_SIZE}
            def __getitem__(self, index): return torch.full(({FEATURES},), float(index)), index
        model = torch.nn.Linear({FEATURES}, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    """) + textwrap.dedent(body))
    done = subprocess.run([sys.executable, "-m", "dlprof", "run", "--top", "0", *options, "-o", str(tmp_path / "run"),
                           str(script)], capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return dlprof.load(tmp_path / "run"), done.stdout


def test_persistent_workers_alive_at_the_end_keep_every_batch(tmp_path: Path) -> None:
    run, _ = _run_program(tmp_path, f"""
        loader = torch.utils.data.DataLoader(Samples(), batch_size={BATCH_SIZE}, num_workers=2,
                                             persistent_workers=True, multiprocessing_context="fork")
        for epoch in range(2):
            for x, _ in loader:
                model(x).sum().backward()
                optimizer.step()
        # the workers are still alive when the program, and profiling, end
    """)
    fetches = run.slices[run.slices.kind == Kind.DATALOADER]
    assert len(fetches) == 2 * BATCHES, "every batch of both epochs, from workers never ended"
    children = run.manifest.saving["forked_children"]["children"]
    assert sum(kinds.get("dataloader", 0) for kinds in children.values()) == 2 * BATCHES
    assert {int(pid) for pid in children} == set(fetches.pid)


def test_persistent_workers_forked_after_a_save_do_not_hang_the_end(tmp_path: Path) -> None:
    """Workers forked once the background finisher runs inherit a copy of its input pipe; alive at
    the end, that copy kept the finisher from seeing its input end, and ``dlprof run`` waited for
    it forever (seen on torch 2.4, where a save came before the DataLoader's first epoch)."""
    run, _ = _run_program(tmp_path, f"""
        import time
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:  # steps, and saves every 0.1 s: the finisher starts
            model(torch.ones(4, {FEATURES})).sum().backward()
            optimizer.step()
        loader = torch.utils.data.DataLoader(Samples(), batch_size={BATCH_SIZE}, num_workers=2,
                                             persistent_workers=True, multiprocessing_context="fork")
        for x, _ in loader:
            model(x).sum().backward()
            optimizer.step()
    """, ("--save-seconds", "0.1"))
    assert run.manifest.saving["saves"] >= 2
    assert (run.slices.kind == Kind.DATALOADER).sum() == BATCHES


def test_workers_of_a_loop_cut_short_keep_what_they_fetched(tmp_path: Path) -> None:
    """The profiled block ends while its workers have fetched ahead: what they fetched while
    profiling is saved when it ends, and nothing they fetch after."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(f"""
        import sys, time, torch, dlprof
        class Samples(torch.utils.data.Dataset):
            def __len__(self): return {BATCHES * BATCH_SIZE}
            def __getitem__(self, index): return torch.full(({FEATURES},), float(index)), index
        loader = torch.utils.data.DataLoader(Samples(), batch_size=1, num_workers=2,
                                             multiprocessing_context="fork")
        with dlprof.profile(out=sys.argv[1]):
            batches = iter(loader)  # the workers start here
            for _ in range(3):
                next(batches)
            time.sleep(1.0)  # the workers fetch ahead meanwhile
        print("fetched before the end", 3)
        time.sleep(0.5)
        rest = sum(1 for _ in batches)  # after profiling: not recorded
        print("fetched after", rest)
    """))
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    run = dlprof.load(tmp_path / "run")
    fetches = run.slices[run.slices.kind == Kind.DATALOADER]
    # Three consumed, and the two workers' prefetched batches (prefetch_factor 2 each).
    assert len(fetches) == 3 + 2 * 2
    assert (fetches.start_ns + fetches.dur_ns <= run.manifest.end_ns).all()
    children = run.manifest.saving["forked_children"]
    assert sorted(children["children"]) == sorted(str(pid) for pid in fetches.pid.unique())
    assert not children["not_answering"]
