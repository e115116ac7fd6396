"""The runtime's collectives, marked on the communicator classes, and lint's list of them
(``mnify.vocabulary.COLLECTIVE_METHODS``) are the same list: neither can drift from the other."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from mnify import vocabulary as vocab
from mnify.runtime import observers
from mnify.runtime.communicators import NAMES, communicator_class
from mnify.runtime.communicators.base import CommunicatorBase
from mnify.runtime.communicators.marks import collective, collective_names

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [CommunicatorBase, *(communicator_class(name) for name in NAMES if name != "auto")]
by_name = pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)


def _public_methods(cls: type) -> dict[str, list[ast.FunctionDef]]:
    """Every definition, along the MRO, of each public method of ``cls`` in the runtime."""
    found: dict[str, list[ast.FunctionDef]] = {}
    for klass in cls.__mro__:
        if not klass.__module__.startswith("mnify.runtime."):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or not inspect.isfunction(value):
                continue
            tree = ast.parse(textwrap.dedent(inspect.getsource(value)))
            fn = tree.body[0]
            assert isinstance(fn, ast.FunctionDef)
            found.setdefault(name, []).append(fn)
    return found


def _self_calls(fn: ast.FunctionDef) -> set[str]:
    """The methods ``fn`` calls on ``self`` or ``super()``."""
    return {
        node.func.attr
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (
            (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
            or (isinstance(node.func.value, ast.Call) and ast.unparse(node.func.value) == "super()")
        )
    }


@by_name
def test_every_marked_collective_is_in_the_vocabulary(cls: type) -> None:
    marked = collective_names(cls)
    assert marked, f"{cls.__name__} marks no collective"
    missing = sorted(marked - vocab.COLLECTIVE_METHODS)
    assert not missing, f"{cls.__name__} collectives lint does not know: {missing}"


@by_name
def test_every_vocabulary_collective_the_class_has_is_marked(cls: type) -> None:
    has = {
        name
        for name in vocab.COLLECTIVE_METHODS
        if name.islower() and callable(getattr(cls, name, None))
    }
    unmarked = sorted(has - collective_names(cls))
    assert not unmarked, f"{cls.__name__}: lint calls these collectives, unmarked: {unmarked}"


@by_name
def test_a_public_method_is_marked_exactly_when_it_enters_a_collective(cls: type) -> None:
    """Marked: some definition enters a collective (``self._enter``) or calls a marked one;
    unmarked: none does (point to point enters ``_enter_p2p``, configuration nothing)."""
    marked = collective_names(cls)
    for name, definitions in _public_methods(cls).items():
        calls = set().union(*(_self_calls(fn) for fn in definitions))
        enters = "_enter" in calls or bool((calls - {name}) & marked)
        assert enters == (name in marked), (
            f"{cls.__name__}.{name}: {'enters' if enters else 'does not enter'} a collective "
            f"but is {'marked' if name in marked else 'not marked'}"
        )


def test_the_mark_keeps_what_the_method_does_and_publishes_it() -> None:
    def method(self: object, x: int) -> int:
        return x

    marked = collective(method)
    assert marked.__wrapped__ is method and marked.__name__ == "method"  # type: ignore[attr-defined]
    assert collective_names(type("C", (), {"m": marked, "n": lambda self: 0})) == {"m"}

    class Comm:
        _seq = 4
        m = marked

    assert Comm().m(3) == 3  # nobody watches: the method's own result

    class Seen(observers.Observer):
        calls: list[tuple[str, int, bool]] = []

        def collective_enters(self, comm: object, kind: str, seq: int, *rest: object) -> None:
            self.calls.append((kind, seq, False))

        def collective_leaves(self, comm: object, kind: str, seq: int, *rest: object) -> None:
            self.calls.append((kind, seq, True))

    unsubscribe = observers.subscribe(Seen())
    try:
        assert Comm().m(5) == 5
    finally:
        unsubscribe()
    assert Seen.calls == [("method", 5, False), ("method", 5, True)]
    assert "barrier" in collective_names(CommunicatorBase)
    assert "send" not in collective_names(CommunicatorBase)


def test_the_runtime_never_imports_the_vocabulary() -> None:
    offenders = []
    for path in sorted((ROOT / "mnify/runtime").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n.startswith("mnify.vocabulary") for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders
