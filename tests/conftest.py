"""Shared pytest configuration.

* The ``gpu`` marker skips without a CUDA device.
* Tests that launch real ranks (a launch helper of ``testkit``, ``tests/support`` and friends,
  reached from the test, its fixtures or the helpers they call) are marked ``mpi``
  automatically, so ``scripts/test.sh --quick`` can leave them out without every test having to
  remember its marker, and keeps the single-process tests of the same modules; ``smoke`` marks
  the few 2-rank runs the quick tier keeps (README, "Tests").
* Under ``--dist loadgroup`` (scripts/test.sh) every worker checks that pytest-xdist really
  grouped the ``xdist_group`` tests: when it does not (pytest 9.2 renamed the node id attribute
  xdist 3.8 rewrites), tests that share a cached conversion or run repeat it on every worker and
  CI silently takes minutes longer, so the run stops at collection instead.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator

import pytest


def _has_gpu() -> bool:
    try:
        import cupy  # type: ignore[import-not-found]

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


# The helpers that start mpiexec (or a multi-host test bed) for a test.
_LAUNCHERS = frozenset(
    {"run_ranks", "run_script", "mnify_run", "run_verdict", "TestBed", "mnify_scale"}
)
_OURS = ("tests.", "testkit.")


def _ours(obj: object) -> bool:
    return str(getattr(obj, "__module__", "")).startswith(_OURS)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """A code object and the ones nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _reaches_launcher(obj: object, seen: set[int]) -> bool:
    """Whether calling ``obj`` may start ranks: it names a launcher, or a function or class of
    the test code that does. What cannot be read counts as launching (the test stays ``mpi``)."""
    if id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, type):
        return any(
            _reaches_launcher(member, seen)
            for member in vars(obj).values()
            if inspect.isfunction(member) or isinstance(member, (staticmethod, classmethod))
        )
    function = getattr(obj, "__func__", obj)
    function = inspect.unwrap(function) if callable(function) else function
    code = getattr(function, "__code__", None)
    if code is None:
        return True
    scope = getattr(function, "__globals__", {})
    for nested in _codes(code):
        for name in nested.co_names:
            if name in _LAUNCHERS:
                return True
            target = scope.get(name)
            if target is not None and _ours(target) and callable(target):
                if _reaches_launcher(target, seen):
                    return True
    return False


def _launches_ranks(item: pytest.Item) -> bool:
    """Whether a test starts ranks: its module holds a launcher and the test function, one of
    its fixtures from the test code, or a helper either calls reaches one."""
    module = getattr(item, "module", None)
    if module is None or not any(
        name in _LAUNCHERS and _ours(obj) for name, obj in vars(module).items()
    ):
        return False
    function = getattr(item, "function", None)
    if function is None:
        return True
    seen: set[int] = set()
    if _reaches_launcher(function, seen):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(info, "names_closure", ()):
        for definition in getattr(info, "name2fixturedefs", {}).get(name, ()):
            fixture = getattr(definition, "func", None)
            if fixture is not None and _ours(fixture) and _reaches_launcher(fixture, seen):
                return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("mpi") is None and _launches_ranks(item):
            item.add_marker(pytest.mark.mpi)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="no CUDA device/CuPy on this machine")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


def _ungrouped(item: pytest.Item) -> bool:
    """An ``xdist_group`` test that pytest-xdist's ``--dist loadgroup`` left without its group."""
    config = item.config
    return (
        bool(getattr(config.option, "loadgroup", False))
        and hasattr(config, "workerinput")
        and item.get_closest_marker("xdist_group") is not None
        and "@" not in item.nodeid
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _ungrouped(item):
        pytest.fail(
            "pytest-xdist did not put this xdist_group test in its group under --dist loadgroup: "
            "this pytest and pytest-xdist do not work together (pytest 9.2 renamed the node id "
            "xdist 3.8 rewrites; pyproject.toml pins pytest below 9.2), so every worker would "
            "repeat the work the group shares",
            pytrace=False,
        )
