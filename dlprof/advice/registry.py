"""The advice rules: one :class:`~dlprof.advice.base.Rule` per module of
:mod:`dlprof.advice.rules`, found there, so that a new rule is a new file and nothing else.

    rules()                          # every rule, by name
    rules(names=("input-bound",))    # only these
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Iterable
from functools import cache

from dlprof.advice import rules as rules_package
from dlprof.advice.base import Rule


@cache
def all_rules() -> tuple[Rule, ...]:
    """Every rule, by name: the one :class:`Rule` subclass each rules module defines."""
    found: list[Rule] = []
    for module_info in pkgutil.iter_modules(rules_package.__path__):
        module = importlib.import_module(f"{rules_package.__name__}.{module_info.name}")
        classes = [c for _, c in inspect.getmembers(module, inspect.isclass)
                   if issubclass(c, Rule) and c.__module__ == module.__name__ and not inspect.isabstract(c)
                   and "name" in vars(c)]
        if len(classes) != 1:
            raise TypeError(f"{module.__name__} defines {len(classes)} rules; a rules module defines one")
        found.append(classes[0]())
    return tuple(sorted(found, key=lambda rule: rule.name))


def rule_names() -> tuple[str, ...]:
    return tuple(rule.name for rule in all_rules())


def rules(names: Iterable[str] = (), everything: bool = False) -> tuple[Rule, ...]:
    """The rules to apply.

    Args:
        names: only these rules (on by default or not); empty for the default set.
        everything: every rule, those off by default too.

    Returns:
        The rules, by name.

    Raises:
        KeyError: a name no rule has.
    """
    wanted = set(names)
    unknown = wanted - set(rule_names())
    if unknown:
        raise KeyError(", ".join(sorted(unknown)))
    if wanted:
        return tuple(rule for rule in all_rules() if rule.name in wanted)
    return tuple(rule for rule in all_rules() if everything or rule.on_by_default)
