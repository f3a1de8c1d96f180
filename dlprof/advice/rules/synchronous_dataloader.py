"""Synchronous DataLoader: batches are loaded in the training loop's own process (no workers),
so the loop does nothing else while each batch is read and collated."""

from __future__ import annotations

from dlprof.advice.base import Finding, Need, Rule, Severity, Skip, duration, evidence_of, percent
from dlprof.advice.data import RunData
from dlprof.keys import Kind

# torch's range around each batch of a DataLoader iterated without workers.
SINGLE_PROCESS = "enumerate(DataLoader)#_SingleProcessDataLoaderIter%"
MIN_SHARE = 0.01  # of the step time: below this the loading is too cheap to move
HIGH_SHARE = 0.20  # of the step time: loading sets the pace


class SynchronousDataLoader(Rule):
    name = "synchronous-dataloader"
    title = "DataLoader without workers loads batches in the training loop"
    needs = (Need.STEPS,)
    threshold = (f"single-process DataLoader iteration taking >= {MIN_SHARE:.0%} of the steps' time "
                 "(less dlprof's pauses)")
    stake_basis = "the time the loop spent iterating single-process DataLoaders: workers load batches meanwhile"
    fix = ("Give the DataLoader workers: DataLoader(..., num_workers=N) with N up to the CPU cores per "
           "GPU, persistent_workers=True so they live across epochs, pin_memory=True for GPU training.")
    source = "PyTorch torch.utils.data documentation, 'Single- and Multi-process Data Loading'"

    def check(self, data: RunData) -> Finding | None:
        if not data.kinds & {Kind.DATA_WAIT, Kind.DATALOADER}:
            raise Skip("needs DataLoader activity (data_wait or dataloader slices)")
        loading = data.named(SINGLE_PROCESS, Kind.DATA_WAIT)
        # Batches of every step, warm-up too: the loader's cost is the same in each. The steps'
        # time is the user's: dlprof's pauses would make the loading look cheaper than it is.
        total = float(data.all_steps["user_ns"].sum())
        spent = float(loading["dur_ns"].sum())
        if loading.empty or spent < MIN_SHARE * total:
            return None
        evidence = evidence_of(
            loading.to_dict("records"), lambda r: str(r["name"]),
            lambda r: f"{r['calls']} batches, {duration(r['dur_ns'] / r['calls'])} each", lambda r: r["dur_ns"])
        summary = (f"single-process DataLoader iteration took {duration(spent)}, "
                   f"{percent(spent, total)} of the steps' time")
        severity = Severity.HIGH if spent >= HIGH_SHARE * total else Severity.MODERATE
        return self.finding(severity, spent, summary, evidence)
