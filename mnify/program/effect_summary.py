"""One module's calls, as the effect analysis needs them: a summary read from its syntax tree.

For each function, method and the module's own code, the calls it makes, in source order, each
as a *site*: its line, the name it is called by, what it resolves to where this module alone can
tell (``q:pkg.mod.f`` a function or class by qualified name, ``m:pkg.mod.C:save`` a method of an
instance of a known class) and the effects the fixed table (``mnify.vocabulary``) gives it
outright (``open(p, "w")`` writes, ``trainer.run()`` trains). Nested functions and lambdas count
as part of the function that defines them (what it defines, it is taken to call). A site is
``[line, name, ref, direct effects, what]`` (``what``: the qualified name the report shows).

A summary is plain JSON data (dicts, lists, strings, ints), so a cached one reads back to
exactly what a fresh one is (mnify/program/effect_cache.py); docs/design.md §1 "Effects".
"""

from __future__ import annotations

import ast
import builtins
import sys
from typing import Any

from mnify import vocabulary as vocab

Summary = dict[str, Any]
MODULE_CODE = "<module>"  # the key of a module's own top-level code
_BUILTINS = frozenset(dir(builtins))


def table_root(qname: str) -> bool:
    """A name whose effects come from the fixed table: the standard library, builtins and the
    libraries ``vocabulary.EFFECT_TABLE_ROOTS`` names; never read from source."""
    top = qname.lstrip(".").split(".", 1)[0]
    return top in vocab.EFFECT_TABLE_ROOTS or top in sys.stdlib_module_names or top == "builtins"


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _writes_mode(call: ast.Call) -> bool:
    mode: ast.expr | None = call.args[1] if len(call.args) > 1 else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    return (
        isinstance(mode, ast.Constant)
        and isinstance(mode.value, str)
        and any(flag in mode.value for flag in vocab.WRITE_MODES)
    )


def summarise(tree: ast.Module, module: str, is_package: bool) -> Summary:
    """The summary of ``tree``, the module named ``module`` (see the module docstring)."""
    return _Summariser(module, is_package).run(tree)


class _Summariser:
    def __init__(self, module: str, is_package: bool) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.names: dict[str, str] = {}  # module-level name -> qualified name
        self.globals: dict[str, str] = {}  # module-level variable -> the type it holds
        self.functions: dict[str, dict[str, Any]] = {}
        self.classes: dict[str, list[str]] = {}

    # module level ---------------------------------------------------------------------
    def run(self, tree: ast.Module) -> Summary:
        top = list(_top_level(tree.body))
        for stmt in top:
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._import(stmt, self.names)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.names[stmt.name] = f"{self.module}.{stmt.name}"
        for stmt in top:
            if isinstance(stmt, ast.ClassDef):
                self.classes[stmt.name] = [
                    q for q in (self._qualify_static(b) for b in stmt.bases) if q
                ]
        module_code = [
            s
            for s in top
            if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        ]
        self.functions[MODULE_CODE] = self._function(module_code, {}, None, 1, module=True)
        for stmt in top:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[stmt.name] = self._function(
                    [stmt], dict(self.globals), None, stmt.lineno
                )
            elif isinstance(stmt, ast.ClassDef):
                self._class(stmt)
        return {
            "module": self.module,
            "package": self.package,
            "names": dict(sorted(self.names.items())),
            "classes": self.classes,
            "functions": self.functions,
        }

    def _import(self, stmt: ast.Import | ast.ImportFrom, into: dict[str, str]) -> None:
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    into[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    into[top] = top
            return
        base = stmt.module or ""
        if stmt.level:
            parts = self.package.split(".") if self.package else []
            if stmt.level > 1:
                parts = parts[: len(parts) - (stmt.level - 1)]
            base = ".".join([*parts, base] if base else parts)
        for alias in stmt.names:
            if alias.name != "*":
                into[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name

    def _qualify_static(self, node: ast.expr) -> str | None:
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.names:
            return self.names[head] + ("." + rest if rest else "")
        if head in _BUILTINS:
            return f"builtins.{dotted}"
        return None

    def _class(self, node: ast.ClassDef) -> None:
        qualified = f"{self.module}.{node.name}"
        methods = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
        # what ``self.<attr> = Made(...)`` holds, from every method, before any is summarised
        attributes: dict[str, str] = {}
        for method in methods:
            scratch = _Function(self, dict(self.globals), qualified)
            for sub in ast.walk(method):
                if isinstance(sub, ast.Assign) and isinstance(sub.value, ast.Call):
                    made = scratch.target(sub.value.func)
                    for t in sub.targets:
                        text = _dotted(t)
                        if made.startswith("q:") and text and text.startswith("self."):
                            attributes[text] = made[2:]
        for method in methods:
            types = {**self.globals, **attributes, "self": qualified, "cls": qualified}
            self.functions[f"{node.name}.{method.name}"] = self._function(
                [method], types, qualified, method.lineno
            )

    def _function(
        self,
        body: list[ast.stmt],
        types: dict[str, str],
        cls: str | None,
        line: int,
        *,
        module: bool = False,
    ) -> dict[str, Any]:
        walker = _Function(self, types, cls, module=module)
        for stmt in body:
            walker.visit(stmt)
        return {"line": line, "sites": walker.sites, "returns": walker.returns}


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Module-level statements, looking into ``if``/``try``/``with`` blocks (conditional
    imports and definitions) but not into functions or classes."""
    found: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.Try, ast.With)) and not _is_main_guard(stmt):
            found.append(stmt)
            for part in ("body", "orelse", "finalbody"):
                found.extend(_top_level(getattr(stmt, part, [])))
            for handler in getattr(stmt, "handlers", []):
                found.extend(_top_level(handler.body))
        else:
            found.append(stmt)
    return found


def _is_main_guard(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and "__main__" in ast.unparse(stmt.test)


class _Function(ast.NodeVisitor):
    """The sites of one function's body (or the module's own code), in source order."""

    def __init__(
        self, owner: _Summariser, types: dict[str, str], cls: str | None, *, module: bool = False
    ) -> None:
        self.owner = owner
        self.types = types  # dotted local -> the qualified class or factory that made it
        self.cls = cls
        self.module = module
        self.locals: set[str] = set()
        self.sites: list[list[Any]] = []
        # what the function hands back, by what made it: a qualified maker, "generator" (it
        # yields), "function" (a nested function or lambda), "" (anything else)
        self.returns: list[str] = []
        self._depth = 0  # nested functions: their returns are not this one's

    # bindings ---------------------------------------------------------------------------
    def _bind(self, target: ast.expr, made: str | None) -> None:
        text = _dotted(target)
        if text is None:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Name):
                    self.locals.add(sub.id)
                    self.types.pop(sub.id, None)
            return
        if "." not in text:
            self.locals.add(text)
        if made:
            self.types[text] = made
        else:
            self.types.pop(text, None)

    def _made_by(self, value: ast.expr | None) -> str | None:
        if isinstance(value, ast.Call):
            target = self.target(value.func)
            return target[2:] if target.startswith("q:") else None
        text = _dotted(value) if value is not None else None
        return self.types.get(text) if text else None

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        made = self._made_by(node.value)
        for target in node.targets:
            self._bind(target, made if not isinstance(target, (ast.Tuple, ast.List)) else None)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
        self._bind(node.target, self._made_by(node.value))

    def visit_For(self, node: ast.For) -> None:
        self.visit(node.iter)
        self._bind(node.target, None)
        for stmt in node.body + node.orelse:
            self.visit(stmt)

    def visit_With(self, node: ast.With) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self._bind(item.optional_vars, self._made_by(item.context_expr))
        for stmt in node.body:
            self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            if arg.arg not in ("self", "cls") or self.cls is None:
                self.locals.add(arg.arg)
                self.types.pop(arg.arg, None)
        for extra in (node.args.vararg, node.args.kwarg):
            if extra is not None:
                self.locals.add(extra.arg)
        if not self.module:  # a def inside a function: part of it; its own name is local
            self.locals.add(node.name)
            self.types[node.name] = "<function>"
        self._depth += 1
        for stmt in [*node.decorator_list, *node.args.defaults, *node.body]:
            self.visit(stmt)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None:
            self.visit(node.value)
            if self._depth <= 1:
                if isinstance(node.value, ast.Lambda):
                    self.returns.append("function")
                else:
                    made = self._made_by(node.value) or ""
                    self.returns.append("function" if made == "<function>" else made)

    def visit_Yield(self, node: ast.Yield) -> None:
        self.generic_visit(node)
        if self._depth <= 1:
            self.returns.append("generator")

    visit_YieldFrom = visit_Yield  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for arg in node.args.args:
            self.locals.add(arg.arg)
        self.visit(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for stmt in node.body:
            self.visit(stmt)

    # calls --------------------------------------------------------------------------------
    def target(self, func: ast.expr) -> str:
        """``q:<qualified>``, ``m:<class>:<method>``, ``?:<receiver>:<method>`` or ``""``."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call):
            made = self.target(func.value.func)
            return f"m:{made[2:]}:{func.attr}" if made.startswith("q:") else ""
        dotted = _dotted(func)
        if dotted is None:
            if isinstance(func, ast.Attribute):
                return f"?:{type(func.value).__name__}:{func.attr}"
            return ""
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):  # the longest typed prefix: self.trainer.run
            held = self.types.get(".".join(parts[:cut]))
            if held is not None:
                if cut == len(parts) - 1:
                    return f"m:{held}:{parts[-1]}"
                return f"?:{parts[-2]}:{parts[-1]}"
        head = parts[0]
        if self.types.get(head) == "<function>":
            return ""  # a nested function: part of this one already
        if len(parts) == 1 and head in self.locals and head not in self.types:
            return "opaque"  # a value called: a parameter or variable holding any callable
        if head in self.types and len(parts) == 1:
            return f"m:{self.types[head]}:__call__"
        if head in self.locals or (head in ("self", "cls") and self.cls is None):
            return f"?:{parts[-2]}:{parts[-1]}" if len(parts) > 1 else ""
        if head in self.owner.names:
            return "q:" + ".".join([self.owner.names[head], *parts[1:]])
        if head in _BUILTINS:
            return f"q:builtins.{dotted}"
        return f"?:{parts[-2]}:{parts[-1]}" if len(parts) > 1 else ""

    def visit_Import(self, node: ast.Import) -> None:
        if not self.module:
            scratch: dict[str, str] = {}
            self.owner._import(node, scratch)
            self.owner.names.update({k: v for k, v in scratch.items() if k not in self.locals})

    visit_ImportFrom = visit_Import  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        target = self.target(node.func)
        name = node.func.attr if isinstance(node.func, ast.Attribute) else _dotted(node.func) or ""
        direct: list[str] = []
        ref = ""
        what = name
        if target.startswith("q:"):
            qname = what = target[2:]
            if table_root(qname):
                direct = list(vocab.effect_of_named(qname))
                if qname in vocab.OPEN_FUNCTIONS | {"codecs.open"} and _writes_mode(node):
                    direct.append("writes")
            else:
                ref = target
        elif target.startswith("m:"):
            cls, method = target[2:].rsplit(":", 1)
            what = f"{cls}.{method}"
            if table_root(cls):
                direct = list(vocab.effect_of_method(cls, method))
            else:
                ref = target
        elif target == "opaque":
            direct = ["opaque"]
            what = f"{name}(...), a value whose function is not known"
        elif target.startswith("?:"):
            receiver, method = target[2:].rsplit(":", 1)
            direct = list(vocab.effect_of_unknown_method(receiver, method))
            ref = f"?:{method}"
        if direct or ref:
            self.sites.append([node.lineno, name.rsplit(".", 1)[-1], ref, direct, what])
