"""Each rank's clock against rank 0's, measured through the job's own process group.

Ranks on one host read one clock. Ranks on different hosts do not, and their timelines only
line up once each rank's offset from rank 0 is known. At the first step after the program has
set up ``torch.distributed`` (every rank reaches it), the ranks exchange host names; where a
rank's host is not rank 0's, they meet at a barrier several times and all-gather the time each
read on leaving it. The median difference from rank 0's reading is the offset (a barrier
releases ranks within a network latency of each other, so that is the uncertainty, recorded as
the spread of the rounds); the reader subtracts it from that rank's timestamps.
"""

from __future__ import annotations

import socket
import statistics
import time
from typing import Any

from dlprof.collectors.base import Collector, CollectorContext
from dlprof.schedule import Action
from dlprof.store.manifest import RANK0_CLOCK, ClockDomain

ROUNDS = 7
EXCHANGE_RANGE = "dlprof::rank_clock_exchange"


class RankClock(Collector):
    name = "rank_clock"
    description = "each rank's clock offset from rank 0 (ranks on other hosts)"
    requires = ("torch", "torch")
    framework = "torch"
    internal = True

    def start(self, context: CollectorContext) -> None:
        self._context = context
        self._done = context.config.world_size <= 1

    def on_step(self, step: int, previous: Action, action: Action) -> None:
        if self._done:
            return
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return  # the program has not joined its process group yet
        self._done = True
        self._context.clocks.append(measure_offset(dist))

    def stop(self) -> None:
        if not self._done:
            self.notes.append("the program never set up torch.distributed: offsets not measured")


def measure_offset(dist: Any) -> ClockDomain:
    """This rank's clock minus rank 0's, as :data:`RANK0_CLOCK` (a collective: every rank calls it)."""
    import torch.profiler

    with torch.profiler.record_function(EXCHANGE_RANGE):
        hosts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, socket.gethostname())
        differences = []
        for _ in range(ROUNDS):
            dist.barrier()
            now = time.time_ns()
            readings: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(readings, now)
            differences.append(now - readings[0])
    bounds = (min(differences), max(differences))
    if hosts[dist.get_rank()] == hosts[0]:
        return ClockDomain(RANK0_CLOCK, f"same host as rank 0 ({hosts[0]}): one clock; "
                           "bounds are what a barrier exchange measured", 0, bounds)
    return ClockDomain(RANK0_CLOCK, f"median of {ROUNDS} barrier exchanges with rank 0 "
                       f"on {hosts[0]}", int(statistics.median(differences)), bounds)


COLLECTOR = RankClock
