"""Shared by the MN2xx fork rules: the multiprocessing start method a call sets."""

from __future__ import annotations

import libcst as cst

from mnify import vocabulary as N
from mnify.program.context import LintContext
from mnify.syntax import argument, string_value


def start_method(ctx: LintContext, call: cst.Call) -> str | None:
    """The method string of ``multiprocessing.set_start_method(...)``/``get_context(...)``."""
    names = ctx.callee_names(call)
    if N.any_in(names, N.START_METHOD_SETTERS | N.START_METHOD_CONTEXTS):
        return string_value(argument(call, 0, "method"))
    return None
