"""Apply the advice rules to a run and rank what they find by the time at stake.

    advice = advise(run)
    for finding in advice.findings:        # most time at stake first
        print(finding.title, finding.stake_ns)
    advice.skipped                         # rules that could not judge the run, with why
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dlprof.advice.base import Finding, Rule, Skip, Skipped
from dlprof.advice.data import RunData
from dlprof.advice.registry import rules as default_rules
from dlprof.store.reader import Run


@dataclass(frozen=True)
class Advice:
    """What the rules said about one run."""

    findings: tuple[Finding, ...]  # most time at stake first
    skipped: tuple[Skipped, ...]  # by rule name
    passed: tuple[str, ...]  # the rules that judged the run and found nothing


def advise(run: Run, rank: int | None = None, rules: Sequence[Rule] | None = None) -> Advice:
    """Apply rules to a run.

    Args:
        run: the run.
        rank: only this rank (rules that compare ranks are then skipped).
        rules: the rules to apply (default: those on by default, :func:`registry.rules`).

    Returns:
        The findings, ranked by the time at stake (then by rule name); the rules skipped, with
        the reason; the rules that found nothing.
    """
    data = RunData(run, rank)
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    passed: list[str] = []
    for rule in default_rules() if rules is None else rules:
        reason = next((r for need in rule.needs if (r := data.missing(need)) is not None), None)
        if reason is None:
            try:
                found = rule.check(data)
            except Skip as skip:
                reason = str(skip)
        if reason is not None:
            skipped.append(Skipped(rule.name, reason))
        elif found is None:
            passed.append(rule.name)
        else:
            findings.append(found)
    ranked = without_double_claims(findings)
    return Advice(tuple(ranked), tuple(skipped), tuple(passed))


def without_double_claims(findings: Sequence[Finding]) -> list[Finding]:
    """The findings ranked by the time at stake, no time claimed by two of them.

    In order of their own stake, each finding takes of every time it claims its share of what
    the findings before it left: the GPU's idle time that low utilisation claims whole is not
    claimed again by the memory headroom that would fill it, and a kernel's time that one fix
    saves half of leaves the next its share of the other half. Findings are then ranked by what
    they kept; what they lost is ``shared_ns``, with the rules that claimed it.
    """
    left: dict[str, float] = {}
    claimed_by: dict[str, list[str]] = {}
    kept: list[Finding] = []
    for finding in sorted(findings, key=lambda f: (-f.stake_ns, f.rule)):
        stake = shared = 0.0
        sharers: list[str] = []
        for claim in finding.claims:
            remaining = left.setdefault(claim.key, claim.of_ns)
            taken = claim.share * min(remaining, claim.of_ns)
            stake += taken
            shared += claim.ns - taken
            if claim.ns - taken > 0:
                sharers.extend(r for r in claimed_by.get(claim.key, []) if r not in sharers)
            left[claim.key] = remaining - taken
            claimed_by.setdefault(claim.key, []).append(finding.rule)
        kept.append(replace(finding, stake_ns=stake, shared_ns=shared, shared_with=tuple(sharers)))
    return sorted(kept, key=lambda f: (-f.stake_ns, f.rule))
