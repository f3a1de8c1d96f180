"""What every advice rule is: a small class that describes itself and checks a run.

A rule names itself, says what data it needs (:class:`Need`), its threshold, how it estimates
the time at stake, the fix and where the advice comes from, then ``check``s a run's
:class:`~dlprof.advice.data.RunData` and answers a :class:`Finding` or None, as the patterns of
torch.profiler's ``_pattern_matcher`` name, describe and match. A rule whose data the run lacks
is skipped with the reason, never guessed at: the needs are checked before ``check`` runs, and
a rule that finds out more itself (no convolution to judge) raises :class:`Skip`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar, TypeVar

if TYPE_CHECKING:
    from dlprof.advice.data import RunData

EVIDENCE_PLACES = 3  # the places each finding shows: enough to act on, few enough to read


class Need(StrEnum):
    """Data a rule needs, in the words a skipped rule's reason uses."""

    STEPS = "training steps (end each step with prof.step(), or profile under `dlprof run`)"
    DEVICE = "GPU activity (kernels, memcpy, memset)"
    OPS = "framework ops (torch.profiler's aten:: ops)"
    SHAPES = "op input shapes and dtypes (record_shapes)"
    DEVICE_PROPERTIES = "the GPUs' properties (compute capability, memory)"
    MEMORY = "memory records (profile_memory)"
    RANKS = "several ranks (a distributed job)"


class Severity(StrEnum):
    """How far past its threshold a finding is."""

    HIGH = "high"
    MODERATE = "moderate"


@dataclass(frozen=True)
class Evidence:
    """One place where a rule saw what it reports, with its numbers."""

    place: str  # a step, an op, a kernel, a rank
    detail: str  # the numbers, in words
    time_ns: float  # what this place puts at stake


@dataclass(frozen=True)
class Claim:
    """A part of a finding's time at stake, named so that two rules' claims on the same time meet.

    ``key`` names the time (``gpu idle rank 0 cuda:0``, ``kernel <name> on cuda:0``); ``of_ns``
    is all of that time, and the claim takes ``share`` of it (a fix's assumed saving, or 1 for
    all of it). Ranking gives a key's time to the findings in rank order: each takes its share
    of what the ones above it left (:func:`dlprof.advice.ranking.advise`).
    """

    key: str
    of_ns: float
    share: float = 1.0

    @property
    def ns(self) -> float:
        return self.of_ns * self.share


@dataclass(frozen=True)
class Finding:
    """A rule that fired: what it saw, what it puts at stake, and what to do."""

    rule: str
    title: str
    severity: Severity
    stake_ns: float  # the estimated time to gain, as ``stake_basis`` defines it
    summary: str  # what was measured, against the threshold
    evidence: tuple[Evidence, ...]  # the top places, most at stake first
    threshold: str
    stake_basis: str
    fix: str
    source: str
    claims: tuple[Claim, ...] = ()  # what the stake is made of; by default the rule's own time
    shared_ns: float = 0.0  # of the claims, the time rules ranked above claimed first
    shared_with: tuple[str, ...] = ()  # those rules


@dataclass(frozen=True)
class Skipped:
    """A rule that could not judge this run, and why."""

    rule: str
    reason: str


class Skip(Exception):
    """Raised by a rule's check when the run lacks what it needs; the message is the reason."""


class Rule:
    """An advice rule; subclasses fill the class attributes and ``check``."""

    name: ClassVar[str]  # kebab-case, as ``--rule`` takes it
    title: ClassVar[str]  # one line, what is wrong
    needs: ClassVar[tuple[Need, ...]] = ()
    threshold: ClassVar[str]  # when it fires, in words
    stake_basis: ClassVar[str]  # how the time at stake is estimated, with any assumption
    fix: ClassVar[str]
    source: ClassVar[str]  # where the advice comes from (a guide, a paper)
    on_by_default: ClassVar[bool] = True

    def check(self, data: RunData) -> Finding | None:
        """A finding for the run, or None when the rule does not fire.

        Raises:
            Skip: the run lacks what the rule needs to judge it.
        """
        raise NotImplementedError

    def finding(self, severity: Severity, stake_ns: float, summary: str,
                evidence: Iterable[Evidence], claims: Iterable[Claim] = ()) -> Finding:
        """This rule's finding, its description filled in from the class; the evidence kept to
        the :data:`EVIDENCE_PLACES` places with most at stake.

        Args:
            severity: how far past the threshold.
            stake_ns: the time at stake, when no ``claims`` are given (they sum to it).
            summary: what was measured, against the threshold.
            evidence: the places, any number.
            claims: what the stake is made of, where another rule may claim the same time (the
                GPU's idle time, a kernel's); none: time only this rule counts.
        """
        top = sorted(evidence, key=lambda e: -e.time_ns)[:EVIDENCE_PLACES]
        parts = tuple(claims) or (Claim(f"{self.name}: its own", float(stake_ns)),)
        stake = sum(claim.ns for claim in parts)
        return Finding(self.name, self.title, severity, stake, summary, tuple(top),
                       self.threshold, self.stake_basis, self.fix, self.source, parts)


_Row = TypeVar("_Row")


def evidence_of(rows: Iterable[_Row], place: Callable[[_Row], str], detail: Callable[[_Row], str],
                time_ns: Callable[[_Row], float]) -> list[Evidence]:
    """Evidence from rows of any shape, given how to read each part of it."""
    return [Evidence(place(row), detail(row), float(time_ns(row))) for row in rows]


def duration(ns: float) -> str:
    """A time in the unit that reads best: ``820 ns``, ``41.2 us``, ``3.07 ms``, ``12.5 s``."""
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(ns) >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.0f} ns"


def percent(part: float, whole: float) -> str:
    """``part`` as a percentage of ``whole``, one decimal."""
    return f"{100.0 * part / whole:.1f}%" if whole else "n/a"
