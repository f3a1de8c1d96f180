"""The advice rules, one per module; :mod:`dlprof.advice.registry` finds them here."""
