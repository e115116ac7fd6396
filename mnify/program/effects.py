"""What each function of a program does, transitively through its calls: its effects
(docs/design.md §1 "Effects").

The converter's decisions are about effects, whatever shape the code that has them takes: a
statement of the training flow whose callee writes files is rank 0's, wherever the writing is
(``record_setting(out)`` in a sub-package doing ``os.mkdir`` and a ``subprocess`` copy; a model
method in another module doing ``json.dump(..., open(path, "w"))``); a script that calls a
library's ``run_train`` trains, through the library. The kinds:

* ``writes``: a file written, created or removed (``open`` in a writing mode anywhere, ``os`` /
  ``shutil`` / ``pathlib`` writers, ``np.save*``, Chainer's serializers and writing extensions,
  ``json``/``pickle``/``yaml`` dumps, ``to_csv``, ``savefig``; a subprocess may write anything);
* ``trains``: an optimizer's or updater's ``update()``, a Trainer's ``run()``;
* ``reads-data``: one of Chainer's dataset getters;
* ``imports``: ``sys.path`` changed, or a module imported by name;
* ``forks``: a subprocess, ``os.fork``, a multiprocessing pool or process;
* ``collective``: a call every rank must join (a communicator's collective, scattering);
* ``opaque``: a call whose function cannot be known (a parameter or variable called, a method
  the object's known class does not define, such as a class kept in ``self.<attr>`` and called):
  it may do anything, so nothing that must not train is decided on it.

Every function, method and lambda of the converted files is summarised from the syntax tree the
conversion already has (``effect_summary``); calls resolve by qualified name (imports, the
module's own definitions) and method calls through the receiver's class where it is known (made
in the function, held in ``self.<attr>``, from the project or a package; bases followed). The
standard library, Chainer, NumPy, CuPy and a few large libraries come from the fixed table in
``mnify.vocabulary`` and are never read; any other package is read from its source on disk,
found on ``sys.path`` without importing anything, only the modules calls reach, and cached
(``effect_cache``). Computed once per conversion; a cycle of calls counts what the rest of the
cycle has been found to do so far, in source order, so the result never depends on a hash seed.
"""

from __future__ import annotations

import ast
import bisect
import builtins
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mnify import vocabulary as vocab
from mnify.program.effect_cache import SummaryCache, default_directory
from mnify.program.effect_summary import MODULE_CODE, Summary, summarise, table_root

_BUILTIN_NAMES = frozenset(dir(builtins))
KINDS = ("writes", "trains", "reads-data", "imports", "forks", "collective", "opaque")


@dataclass(frozen=True)
class Effect:
    """One effect and where it happens: ``what`` is called at ``path:line``, reached through
    the functions ``via`` (outermost first; empty for a call made right there)."""

    kind: str
    what: str
    path: str
    line: int
    via: tuple[str, ...] = ()

    def describe(self) -> str:
        where = f"{self.what} at {os.path.basename(self.path)}:{self.line}"
        return f"{where} (through {' -> '.join(self.via)})" if self.via else where


Effects = Mapping[str, Effect]  # kind -> the first place it happens
_Target = tuple[
    str, Any, str
]  # ("func", summary, key) | ("class", summary, name) | ("table", qname, method)


class ProjectEffects:
    """The effects of a program's functions: the converted files ``trees`` (path -> syntax
    tree) and the packages they call (see the module docstring)."""

    def __init__(
        self,
        trees: Mapping[str, ast.Module],
        *,
        search_path: Sequence[str] | None = None,
        cache: SummaryCache | None = None,
    ) -> None:
        self.cache = cache if cache is not None else SummaryCache(default_directory())
        paths = sorted(os.path.abspath(p) for p in trees)
        dirs = sorted({os.path.dirname(p) for p in paths})
        root = os.path.commonpath(dirs) if dirs else os.getcwd()
        self._roots: list[str] = []
        for d in [*dirs, root, *(sys.path if search_path is None else search_path)]:
            d = os.path.abspath(d or os.getcwd())
            if d not in self._roots and os.path.isdir(d):
                self._roots.append(d)
        self._by_path: dict[str, Summary] = {}
        self._paths: dict[str, str] = {}  # module name -> its file
        self._modules: dict[str, Summary | None] = {}
        self._given: dict[str, str] = {}  # the path as the caller gave it -> absolute
        for given, tree in trees.items():
            absolute = os.path.abspath(given)
            rel = Path(os.path.relpath(absolute, root))
            package = rel.name == "__init__.py"
            parts = list(rel.parent.parts if package else rel.with_suffix("").parts)
            name = ".".join(p for p in parts if p not in ("", ".")) or rel.stem
            summary = summarise(tree, name, package)
            self._by_path[absolute] = summary
            self._paths[name] = absolute
            self._modules[name] = summary
            self._given[given] = absolute
        self._memo: dict[tuple[str, str], dict[str, Effect]] = {}
        self._busy: set[tuple[str, str]] = set()
        self._sites: dict[str, list[tuple[int, str, Summary, list[Any]]]] = {}
        self._site_lines: dict[str, list[int]] = {}
        self._methods = self._project_methods()
        self._made: dict[tuple[str, str], tuple[str, tuple[str, ...]] | None] = {}

    # questions ------------------------------------------------------------------------
    def function(self, path: str, key: str) -> Effects:
        """The effects of ``key`` (``"main"``, ``"Model.save_structure"``, ``"<module>"`` for the
        module's own code) of the converted file ``path``."""
        summary = self._by_path.get(self._given.get(path, os.path.abspath(path)))
        if summary is None or key not in summary["functions"]:
            return {}
        return self._function(summary, key)

    def at_lines(self, path: str, first: int, last: int, name: str | None = None) -> Effects:
        """The effects of the calls that start on lines ``first..last`` of the converted file
        ``path`` (only those called by ``name``, when given: ``save_structure``, ``dump``)."""
        found: dict[str, Effect] = {}
        for _line, called, summary, site in self._sites_on(path, first, last):
            if name is None or called == name:
                for kind, effect in self._site(summary, site).items():
                    found.setdefault(kind, effect)
        return found

    def resolves_outside(self, path: str, line: int, name: str) -> str | None:
        """The module (a package's, or one of the project not converted) that defines what the
        call by ``name`` on ``line`` of ``path`` calls; None for the converted files' own
        functions, the fixed table's, or what does not resolve."""
        for _at, called, summary, site in self._sites_on(path, line, line):
            if called == name and site[2].startswith(("q:", "m:")):
                target = self._ref_target(summary, site[2])
                if target is not None and target[0] in ("func", "class"):
                    module = target[1]["module"]
                    if self._paths.get(module) not in self._by_path:
                        return str(module)
        return None

    def defined_at(self, path: str, line: int, name: str) -> tuple[str, str] | None:
        """The file and key (``"load"``, ``"Model.save"``) of the function the call by ``name``
        on ``line`` of ``path`` calls, wherever it is; None when it does not resolve to one."""
        for _at, called, summary, site in self._sites_on(path, line, line):
            if called == name and site[2].startswith(("q:", "m:")):
                target = self._ref_target(summary, site[2])
                if target is not None and target[0] == "func":
                    return self._paths.get(target[1]["module"], ""), str(target[2])
        return None

    def returns_at(self, path: str, line: int, name: str) -> list[str] | None:
        """What the function the call by ``name`` on ``line`` of ``path`` calls hands back, by
        what made each returned value (``returns`` of its summary: a qualified maker,
        ``"generator"``, ``"function"``, ``""``); None when the call does not resolve to a
        function whose source was read."""
        for _at, called, summary, site in self._sites_on(path, line, line):
            if called == name and site[2].startswith(("q:", "m:")):
                target = self._ref_target(summary, site[2])
                if target is not None and target[0] == "func":
                    returned: list[str] = target[1]["functions"][target[2]]["returns"]
                    return returned
        return None

    def made_by(self, path: str, callee: str) -> tuple[str, tuple[str, ...]] | None:
        """What calling ``callee`` makes, where ``callee`` is a name as the converted file
        ``path`` spells it at module level (``Adam``, ``optim.Adam``,
        ``chainer.optimizers.Adam``), resolved through the file's imports and definitions the
        way its calls are: the qualified name it resolves to, and the fixed table's classes that
        is (``("chainer.optimizers.Adam", ("chainer.optimizers.Adam",))``) or, for a class of
        the project or of a package, derives from (its bases followed, depth first:
        ``("optim.Adam", ("chainer.optimizers.Adam",))``); none for anything else that resolves
        (a function). None when the name does not resolve (a local, a parameter, a module that
        cannot be read)."""
        key = (path, callee)
        if key in self._made:
            return self._made[key]
        made: tuple[str, tuple[str, ...]] | None = None
        summary = self._by_path.get(self._given.get(path, os.path.abspath(path)))
        head, _, rest = callee.partition(".")
        qualified = summary["names"].get(head) if summary is not None else None
        if qualified is None and summary is not None and head in _BUILTIN_NAMES:
            qualified = f"builtins.{head}"
        if qualified is not None:
            target = self._resolve(qualified + ("." + rest if rest else ""), 0)
            if target is not None:
                kind, where, name = target
                if kind == "table" and name:  # a method a class inherits from the table's
                    made = (f"{where}.{name}", ())
                elif kind == "table":
                    made = (str(where), (str(where),))
                elif kind == "class":
                    bases = self._table_bases(where, str(name), 0)
                    made = (f"{where['module']}.{name}", tuple(dict.fromkeys(bases)))
                elif kind == "func":
                    made = (f"{where['module']}.{name}", ())
        self._made[key] = made
        return made

    def _table_bases(self, module: Summary, cls: str, depth: int) -> list[str]:
        """The fixed table's classes ``cls`` derives from, depth first, in base order."""
        if depth > 12:
            return []
        found: list[str] = []
        for base in module["classes"].get(cls, []):
            if table_root(base):
                found.append(base.lstrip("."))
                continue
            target = self._resolve(base, depth + 1)
            if target is not None and target[0] == "class":
                found.extend(self._table_bases(target[1], str(target[2]), depth + 1))
            elif target is not None and target[0] == "table":
                found.append(str(target[1]))
        return found

    def reached_from(self, roots: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """The functions of the converted files that the ``(path, key)`` roots call, through
        any number of calls (the roots included), as ``(absolute path, key)``: the training
        flow, when the roots are the entry points. A nested function counts as part of the
        function or method around it; a class called counts its ``__init__``."""
        seen: set[tuple[str, str]] = set()
        todo: list[tuple[Summary, str]] = []
        for path, key in roots:
            summary = self._by_path.get(self._given.get(path, os.path.abspath(path)))
            if summary is not None and key in summary["functions"]:
                todo.append((summary, key))
        while todo:
            summary, key = todo.pop()
            where = self._paths.get(summary["module"], "")
            if (where, key) in seen or where not in self._by_path:
                continue
            seen.add((where, key))
            for site in summary["functions"][key]["sites"]:
                target = self._ref_target(summary, site[2]) if site[2] else None
                if target is not None and target[0] == "class":
                    target = self._method(target[1], target[2], "__init__", 0)
                if target is not None and target[0] == "func":
                    todo.append((target[1], str(target[2])))
        return seen

    @property
    def modules_read(self) -> list[str]:
        """The modules read from disk (not converted), by name, in the order first reached."""
        return [
            m
            for m, s in self._modules.items()
            if s is not None and self._paths.get(m) not in self._by_path
        ]

    # sites ----------------------------------------------------------------------------
    def _sites_of(self, path: str) -> list[tuple[int, str, Summary, list[Any]]]:
        absolute = self._given.get(path, os.path.abspath(path))
        cached = self._sites.get(absolute)
        if cached is None:
            summary = self._by_path.get(absolute)
            cached = []
            if summary is not None:
                for function in summary["functions"].values():
                    for site in function["sites"]:
                        cached.append((site[0], site[1], summary, site))
            cached.sort(key=lambda s: s[0])
            self._sites[absolute] = cached
        return cached

    def _sites_on(
        self, path: str, first: int, last: int
    ) -> list[tuple[int, str, Summary, list[Any]]]:
        """The sites of ``path`` that start on lines ``first..last`` (sorted by line)."""
        sites = self._sites_of(path)
        lines = self._site_lines.get(path)
        if lines is None:
            lines = self._site_lines[path] = [s[0] for s in sites]
        return sites[bisect.bisect_left(lines, first) : bisect.bisect_right(lines, last)]

    def _site(self, summary: Summary, site: list[Any]) -> dict[str, Effect]:
        line, _name, ref, direct, what = site
        path = self._paths.get(summary["module"], "")
        found: dict[str, Effect] = {}
        for kind in direct:
            found.setdefault(kind, Effect(kind, what, path, line))
        if ref:
            label = ref[2:].replace(":", ".")
            for kind, effect in self._ref(summary, ref).items():
                found.setdefault(
                    kind, Effect(kind, effect.what, effect.path, effect.line, (label, *effect.via))
                )
        return found

    def _function(self, summary: Summary, key: str) -> dict[str, Effect]:
        memo_key = (summary["module"], key)
        known = self._memo.get(memo_key)
        if known is not None:
            return known
        if memo_key in self._busy:
            return {}
        self._busy.add(memo_key)
        found: dict[str, Effect] = {}
        for site in summary["functions"][key]["sites"]:
            for kind, effect in self._site(summary, site).items():
                found.setdefault(kind, effect)
        self._busy.discard(memo_key)
        self._memo[memo_key] = found
        return found

    # resolution ---------------------------------------------------------------------------
    def _ref(self, summary: Summary, ref: str) -> dict[str, Effect]:
        target = self._ref_target(summary, ref)
        if target is None:
            return {}
        kind, where, name = target
        if kind == "func":
            return self._function(where, name)
        if kind == "class":
            init = self._method(where, name, "__init__", 0)
            return self._ref_of(init) if init is not None else {}
        return self._ref_of(target)

    def _ref_of(self, target: _Target) -> dict[str, Effect]:
        kind, where, name = target
        if kind == "func":
            return self._function(where, name)
        if kind == "opaque":
            return {"opaque": Effect("opaque", f"{where}, not defined by its class", "", 0)}
        kinds = vocab.effect_of_method(where, name) if name else vocab.effect_of_named(where)
        what = f"{where}.{name}" if name else str(where)
        return {k: Effect(k, what, "", 0) for k in kinds}

    def _ref_target(self, summary: Summary, ref: str) -> _Target | None:
        if ref.startswith("q:"):
            return self._resolve(ref[2:], 0)
        if ref.startswith("m:"):
            cls_name, method = ref[2:].rsplit(":", 1)
            cls = self._resolve(cls_name, 0)
            if cls is None:
                return None
            if cls[0] == "class":
                found = self._method(cls[1], cls[2], method, 0)
                if found is None and not self._inherits_from_table(cls[1], cls[2], 0):
                    return ("opaque", f"{cls_name}.{method}", "")
                return found
            if cls[0] == "table":
                return ("table", cls[1], method)
            return None
        if ref.startswith("?:"):
            found = self._methods.get(ref[2:])
            return found
        return None

    def _resolve(self, qname: str, depth: int) -> _Target | None:
        qname = qname.lstrip(".")
        if depth > 12 or not qname:
            return None
        if table_root(qname):
            return ("table", qname, "")
        parts = qname.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = self._find(".".join(parts[:cut]))
            if module is not None:
                return self._member(module, parts[cut:], depth)
        return None

    def _member(self, module: Summary, rest: list[str], depth: int) -> _Target | None:
        head = rest[0]
        if len(rest) == 1 and head in module["functions"] and head != MODULE_CODE:
            return ("func", module, head)
        if head in module["classes"]:
            if len(rest) == 1:
                return ("class", module, head)
            if len(rest) == 2:
                return self._method(module, head, rest[1], depth)
            return None
        alias = module["names"].get(head)
        if alias and alias != f"{module['module']}.{head}":
            return self._resolve(".".join([alias, *rest[1:]]), depth + 1)
        return None

    def _method(self, module: Summary, cls: str, method: str, depth: int) -> _Target | None:
        """``cls.method`` looked up through the class's bases (depth first, in order)."""
        if depth > 12:
            return None
        key = f"{cls}.{method}"
        if key in module["functions"]:
            return ("func", module, key)
        for base in module["classes"].get(cls, []):
            if table_root(base):
                if vocab.effect_of_method(base, method):
                    return ("table", base, method)
                continue
            found = self._resolve(base, depth + 1)
            if found is not None and found[0] == "class":
                inherited = self._method(found[1], found[2], method, depth + 1)
                if inherited is not None:
                    return inherited
        return None

    def _inherits_from_table(self, module: Summary, cls: str, depth: int) -> bool:
        """Whether ``cls`` has a base from the fixed table (``chainer.Chain``): the method may
        be one of its own (``to_gpu``, ``namedparams``), whose effects the table gives."""
        if depth > 12:
            return False
        for base in module["classes"].get(cls, []):
            if table_root(base):
                return True
            found = self._resolve(base, depth + 1)
            if found is not None and found[0] == "class":
                if self._inherits_from_table(found[1], found[2], depth + 1):
                    return True
            elif found is None:
                return True  # a base that cannot be read: it may define the method
        return False

    def _find(self, dotted: str) -> Summary | None:
        """The module ``dotted``: a converted file, or a file found on the search path (never
        imported)."""
        if dotted in self._modules:
            return self._modules[dotted]
        found: Summary | None = None
        relative = dotted.replace(".", os.sep)
        for root in self._roots:
            for candidate, package in (
                (os.path.join(root, relative + ".py"), False),
                (os.path.join(root, relative, "__init__.py"), True),
            ):
                if not os.path.isfile(candidate):
                    continue
                absolute = os.path.abspath(candidate)
                found = self._by_path.get(absolute)
                if found is None:
                    found = self.cache.summary(absolute, dotted, package)
                    if found is not None:
                        self._paths[dotted] = absolute
                break
            if found is not None:
                break
        self._modules[dotted] = found
        return found

    def _project_methods(self) -> dict[str, _Target]:
        """Method names exactly one class of the converted files defines (and that are not
        everyone's), for calls on objects of unknown class."""
        seen: dict[str, list[_Target]] = {}
        for absolute in sorted(self._by_path):
            summary = self._by_path[absolute]
            for key in summary["functions"]:
                cls, _, method = key.partition(".")
                if method and cls in summary["classes"]:
                    seen.setdefault(method, []).append(("func", summary, key))
        return {
            m: found[0]
            for m, found in seen.items()
            if len(found) == 1 and m not in vocab.COMMON_METHOD_NAMES and not m.startswith("__")
        }


def any_of(effects: Iterable[Effects], kind: str) -> Effect | None:
    """The first effect of ``kind`` among several sets."""
    for found in effects:
        if kind in found:
            return found[kind]
    return None
