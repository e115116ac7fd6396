"""Every hazard, found by walking this package: no hand-kept list to forget a rule in.

A module named ``mnNNN_<name>`` (its code, then its rule name with ``_`` for ``-``) defines
exactly one :class:`~mnify.hazards.rule.Rule` subclass, the hazard, whose ``code`` and ``name`` match
the module's name. Modules with other names are helpers shared by several hazards and define
none.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from types import ModuleType

import mnify.hazards as package
from mnify.hazards.rule import Rule

HAZARD_MODULE = re.compile(r"^mn[0-9]{3}_[a-z0-9_]+$")


def hazard_module_name(rule: type[Rule]) -> str:
    """The module a hazard lives in: ``MN503`` ``optimizer-not-multi-node`` ->
    ``mn503_optimizer_not_multi_node``."""
    return f"{rule.code.lower()}_{rule.name.replace('-', '_')}"


def package_modules() -> list[ModuleType]:
    """Every module of the package, imported, in name order."""
    names = sorted(info.name for info in pkgutil.iter_modules(package.__path__))
    return [importlib.import_module(f"{package.__name__}.{name}") for name in names]


def rules_defined_in(module: ModuleType) -> list[type[Rule]]:
    """The rule classes ``module`` defines itself (not imported bases), those with a code."""
    return [
        value
        for value in vars(module).values()
        if inspect.isclass(value)
        and issubclass(value, Rule)
        and value.__module__ == module.__name__
        and "code" in vars(value)
    ]


def _the_hazard(module: ModuleType) -> type[Rule]:
    found = rules_defined_in(module)
    short = module.__name__.rsplit(".", 1)[-1]
    if len(found) != 1:
        raise ImportError(
            f"{module.__name__}: a hazard module defines one rule, found {len(found)}"
        )
    if hazard_module_name(found[0]) != short:
        raise ImportError(
            f"{module.__name__}: holds {found[0].code} {found[0].name}, "
            f"so it must be named {hazard_module_name(found[0])}"
        )
    return found[0]


def discover_rules() -> tuple[type[Rule], ...]:
    """Every hazard's rule class, in code order."""
    rules = [
        _the_hazard(module)
        for module in package_modules()
        if HAZARD_MODULE.match(module.__name__.rsplit(".", 1)[-1])
    ]
    return tuple(sorted(rules, key=lambda rule: rule.code))
