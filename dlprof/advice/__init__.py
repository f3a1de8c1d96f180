"""Advice: rules that read a run and say what to change, ranked by the time at stake.

    from dlprof.advice.ranking import advise
    advice = advise(run)
    advice.findings   # Finding per rule that fired, most time at stake first
    advice.skipped    # Skipped per rule whose data the run lacks, with the reason

Each rule is a small class in its own module under :mod:`dlprof.advice.rules` that describes
itself (:class:`dlprof.advice.base.Rule`); :mod:`dlprof.advice.registry` finds them.
"""
