"""Watching optimizer updates at run time, and stopping every rank cleanly after the same one.

``mnify run --verify`` checks the first K updates and ``mnify scale`` measures a few; both need
to see each update begin and end, whatever the script looks like (a Trainer, a hand-written
loop, a GAN's two optimizers), and then to end the script on every rank at once.

:func:`watch_updates` registers an observer that is told ``before_update(optimizer, index)``
and ``after_update(optimizer, index)`` around every ``update()`` of a Chainer optimizer or of
mnify's multi-node wrapper; ``index`` counts that optimizer's updates from 1. A wrapper's inner
call to the optimizer it wraps (and a subclass's ``super().update()``) is part of the same
update and is not reported again.

:func:`stop_after_updates` ends the script after the n-th update, counted per optimizer: the
stop comes once every optimizer that has updated so far has made ``n`` updates (a GAN stops after
its second optimizer's n-th update). Data-parallel ranks update in lock-step, so every rank
stops after the same update. The stop is :class:`UpdateLimitReached`, a ``SystemExit``: a
Trainer's ``finally`` blocks and the script's own ``try/finally`` run, ``atexit`` handlers run
and MPI finalizes normally. Under ``mnify run`` the bootstrap prints
``[mnify] rank R (host H) stopped after update N (status S): REASON`` for the launcher, which
reports the job as stopped, not failed.

Nothing is installed until one of the two functions is called: the optimizers' ``update``
methods are then wrapped, at class level, and restored when the last observer unsubscribes and
no stop is pending.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

STOP_REPORT_PREFIX = "[mnify] rank "


class UpdateLimitReached(SystemExit):
    """Raised on every rank after the update :func:`stop_after_updates` asked for.

    ``code`` is the script's exit status (0 unless an ``on_stop`` callback asked for another,
    e.g. 1 when ``--verify`` found something); ``updates`` the count reached; ``reason`` who
    asked ("verify", "scale").
    """

    def __init__(self, updates: int, reason: str, code: int = 0) -> None:
        super().__init__(code)
        self.updates = updates
        self.reason = reason


StopCallback = Callable[[int], "int | None"]


class _Limit:
    def __init__(self, updates: int, reason: str) -> None:
        self.updates = updates
        self.reason = reason
        self.on_stop: list[StopCallback] = []


_lock = threading.RLock()
_observers: list[Any] = []
_limit: _Limit | None = None
_counts: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
# class -> its own ``update`` before we wrapped it
_originals: dict[type, Callable[..., Any]] = {}
_subclass_hooks: dict[type, Any] = {}  # base -> its __dict__'s __init_subclass__ (or _MISSING)
_MISSING = object()
_active = threading.local()  # .stack: the optimizers whose update() is running on this thread


def _running() -> list[Any]:
    stack: list[Any] | None = getattr(_active, "stack", None)
    if stack is None:
        stack = _active.stack = []
    return stack


def _is_inner_call(optimizer: Any, stack: list[Any]) -> bool:
    """The same update seen again: ``super().update()`` or a wrapper calling its optimizer."""
    for outer in stack:
        if outer is optimizer:
            return True
        inner = outer.__dict__.get("actual_optimizer") if hasattr(outer, "__dict__") else None
        if inner is optimizer:
            return True
    return False


def _observed_update(
    original: Callable[..., Any], optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    stack = _running()
    if _is_inner_call(optimizer, stack):
        return original(optimizer, *args, **kwargs)
    with _lock:
        index = _counts.get(optimizer, 0) + 1
        _counts[optimizer] = index
        observers = list(_observers)
    for observer in observers:
        hook = getattr(observer, "before_update", None)
        if hook is not None:
            hook(optimizer, index)
    stack.append(optimizer)
    try:
        result = original(optimizer, *args, **kwargs)
    finally:
        stack.pop()
    for observer in observers:
        hook = getattr(observer, "after_update", None)
        if hook is not None:
            hook(optimizer, index)
    if not stack:
        _stop_if_due()
    return result


def _stop_if_due() -> None:
    limit = _limit
    if limit is None:
        return
    with _lock:
        counts = list(_counts.values())
    if not counts or min(counts) < limit.updates:
        return
    code = 0
    for callback in limit.on_stop:
        asked = callback(limit.updates)
        if asked:
            code = max(code, int(asked))
    raise UpdateLimitReached(limit.updates, limit.reason, code)


def _wrap_class(cls: type) -> None:
    original = cls.__dict__.get("update")
    if original is None or cls in _originals or getattr(original, "_mnify_watched", False):
        return

    @functools.wraps(original)
    def update(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _observed_update(original, self, args, kwargs)

    update._mnify_watched = True  # type: ignore[attr-defined]
    _originals[cls] = original
    type.__setattr__(cls, "update", update)


def _subclasses(base: type) -> list[type]:
    found, todo = [], [base]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def _watch_new_subclasses(base: type) -> None:
    """Classes defined after installation (a custom optimizer) get wrapped as they are made."""
    if base in _subclass_hooks:
        return
    own = base.__dict__.get("__init_subclass__", _MISSING)
    _subclass_hooks[base] = own

    def init_subclass(cls: type, **kwargs: Any) -> None:
        if own is _MISSING:
            super(base, cls).__init_subclass__(**kwargs)  # type: ignore[misc,arg-type]
        else:
            own.__get__(None, cls)(**kwargs)
        with _lock:
            if _installed():
                _wrap_class(cls)

    type.__setattr__(base, "__init_subclass__", classmethod(init_subclass))


def _bases() -> list[type]:
    import chainer

    from mnify.runtime.optimizers import _WrapperBase

    return [chainer.Optimizer, _WrapperBase]


def _installed() -> bool:
    return bool(_originals) or bool(_subclass_hooks)


def _install() -> None:
    for base in _bases():
        for cls in _subclasses(base):
            _wrap_class(cls)
        _watch_new_subclasses(base)


def _uninstall_if_idle() -> None:
    if _observers or _limit is not None:
        return
    for cls, original in _originals.items():
        type.__setattr__(cls, "update", original)
    _originals.clear()
    for base, own in _subclass_hooks.items():
        if own is _MISSING:
            type.__delattr__(base, "__init_subclass__")
        else:
            type.__setattr__(base, "__init_subclass__", own)
    _subclass_hooks.clear()
    _counts.clear()


def is_installed() -> bool:
    """Whether any optimizer class is being watched now (False until a call below)."""
    return _installed()


def watch_updates(observer: Any) -> Callable[[], None]:
    """Tell ``observer`` about every optimizer update from now on; returns the unsubscribe.

    ``observer.before_update(optimizer, index)`` runs before the update, ``after_update`` after
    it returned (not when it raised). ``optimizer`` is the object whose ``update()`` the script
    called: the multi-node wrapper, or a plain Chainer optimizer.
    """
    with _lock:
        _install()
        _observers.append(observer)

    def unsubscribe() -> None:
        with _lock:
            if observer in _observers:
                _observers.remove(observer)
            _uninstall_if_idle()

    return unsubscribe


def stop_after_updates(n: int, reason: str, on_stop: StopCallback | None = None) -> None:
    """End the script on every rank right after the n-th update (see the module docstring).

    ``on_stop(n)`` runs on every rank at that point, before the stop is raised (collectives are
    safe there: every rank is at the same update); a non-zero int it returns becomes the exit
    status. A second call keeps the smaller limit and adds its callback.
    """
    global _limit
    if n < 1:
        raise ValueError(f"stop_after_updates: n must be >= 1, got {n}")
    with _lock:
        _install()
        if _limit is None or n < _limit.updates:
            previous = _limit
            _limit = _Limit(n, reason)
            if previous is not None:
                _limit.on_stop.extend(previous.on_stop)
        if on_stop is not None:
            _limit.on_stop.append(on_stop)


def cancel_stop() -> None:
    """Forget a pending stop (tests; a tool that changed its mind)."""
    global _limit
    with _lock:
        _limit = None
        _uninstall_if_idle()


def stop_report_line(rank: int, host: str, stop: UpdateLimitReached) -> str:
    """The line the bootstrap prints for a rank that stopped (parsed by ``mnify run``)."""
    return (
        f"{STOP_REPORT_PREFIX}{rank} (host {host}) stopped after update {stop.updates} "
        f"(status {stop.code}): {stop.reason}"
    )
