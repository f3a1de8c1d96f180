"""The GPU counters dlprof samples by default, and the names that count the same thing elsewhere.

PM sampling (``dlprof.collectors.cupti_metrics``) reads Perfworks counters, and which of them a
chip can sample differs from chip to chip: on an H200 (GH100, CUPTI 13.5) CUPTI's profiler host
refused ``smsp__inst_executed_op_global_ld.sum`` ("invalid or not supported on GH100") while it
took the other three defaults. Each default is therefore a list of names that count the same
events, preferred first; the collector samples the first one the chip offers and says which, and
the analyses (``dlprof metrics``) read whichever of them a run holds::

    equivalents("smsp__inst_executed_op_global_ld.sum")
    # ("smsp__inst_executed_op_global_ld.sum", "smsp__sass_inst_executed_op_global_ld.sum", ...)

The names are those of NVIDIA's Nsight Compute metric reference (all warp-level counts summed
over the GPU, so that one replaces another without scaling): ``sm__`` and ``smsp__`` totals of
the same count are equal, the ``sass`` counts are the executed SASS instructions of that type,
``sm__inst_executed_realtime`` is the instruction count NVIDIA's own PM sampling sample reads, and
an L1TEX request of the LSU pipe is made once per warp-level global load instruction. Which of them
a given chip offers for sampling is known only on that chip: the GPU check's report says which
were taken. Data only: no CUPTI here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SampledCounter:
    """One default counter: what it counts, and its names on different chips, preferred first."""

    what: str  # in words, for notes
    names: tuple[str, ...]  # Perfworks names, each a count summed over the GPU (".sum")
    # Words a base counter's name holds when it may count the same thing: when no name of the
    # list is offered, the chip's base counters with all of them are named in the note.
    hint: tuple[str, ...]


DEFAULT_COUNTERS: tuple[SampledCounter, ...] = (
    SampledCounter("warp-level instructions executed",
                   ("smsp__inst_executed.sum", "sm__inst_executed.sum", "sm__inst_executed_realtime.sum"),
                   ("inst_executed",)),
    SampledCounter("active warps, summed over active cycles",
                   ("sm__warps_active.sum", "smsp__warps_active.sum"),
                   ("warps_active",)),
    SampledCounter("cycles with at least one warp active on an SM",
                   ("sm__cycles_active.sum",),
                   ("cycles_active",)),
    SampledCounter("warp-level global load instructions executed",
                   ("smsp__inst_executed_op_global_ld.sum", "smsp__sass_inst_executed_op_global_ld.sum",
                    "sm__sass_inst_executed_op_global_ld.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
                   ("global", "ld")),
)
"""What ``dlprof run --collectors cupti_metrics`` samples when no GPU metric is named."""

DEFAULT_METRICS: tuple[str, ...] = tuple(counter.names[0] for counter in DEFAULT_COUNTERS)
"""The preferred name of each default counter (``cupti_metrics``'s default ``--counters``)."""


def counter_of(name: str) -> SampledCounter | None:
    """The default counter ``name`` is one of the names of, if any."""
    return next((counter for counter in DEFAULT_COUNTERS if name in counter.names), None)


def equivalents(name: str) -> tuple[str, ...]:
    """``name`` and the names that count the same events on other chips, ``name`` first."""
    counter = counter_of(name)
    if counter is None:
        return (name,)
    return (name, *(other for other in counter.names if other != name))


def related(name: str, offered: list[str]) -> list[str]:
    """Base counters of a chip (``ProfilerHost.get_base_metrics``) that may count what ``name``
    counts: those whose names hold every word of its hint. For a note when none of its names is
    offered, so that the table above can gain the chip's own name."""
    counter = counter_of(name)
    if counter is None:
        return []
    return [base for base in offered if all(word in base for word in counter.hint)]
