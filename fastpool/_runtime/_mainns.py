"""Worker side: one ``__main__`` namespace for the functions and classes sent by value.

Functions defined in ``__main__`` (a script, a notebook cell, the REPL) travel by value with
cloudpickle, each with its own copy of the globals it reads.  ProcessPoolExecutor's workers
instead run them against one module namespace, and code relies on that:

- an ``initializer`` that sets a global (``global model; model = load()``) must be seen by the
  task functions;
- a class defined in ``__main__`` (a dataclass returned, an exception raised) must pickle back
  by reference as ``__main__.Name``, so that the parent gets its own class
  (``except CalibrationError`` catches it).

The initializer runs in this process's ``__main__`` module dict; the names it binds there are
remembered, and ``adopt`` gives each by-value ``__main__`` function that reads one of them the
initializer's value instead of the copy it brought (its value in the parent).  Every other
global stays the function's own copy, so a global rebound in the parent still reaches the
workers.  A class among a function's globals is registered in ``__main__`` under its name.
"""

from __future__ import annotations

import sys
import types
from typing import Any

_INITIALIZED: set[str] = set()  # names the initializer bound: the worker's values win


def _namespace() -> dict[str, Any]:
    return sys.modules["__main__"].__dict__


def adopt(fn: Any) -> Any:
    """Prepares a function just unpickled in a worker.  One from ``__main__``, sent by
    value, reads the initializer's value of each global the initializer set, and the
    classes among its globals are registered in ``__main__``.  Returns ``fn``."""
    if not isinstance(fn, types.FunctionType) or fn.__module__ != "__main__":
        return fn
    main = _namespace()
    g = fn.__globals__
    if g is main:
        return fn
    for name in _INITIALIZED.intersection(g):
        g[name] = main[name]
    for name, value in g.items():
        if (
            isinstance(value, type)
            and value.__module__ == "__main__"
            and value.__qualname__ == name
        ):
            # findable as __main__.<name>: its instances and exceptions pickle by reference,
            # and the parent gets its own class back
            main[name] = value
    return fn


def _rebind(fn: types.FunctionType, main: dict[str, Any]) -> Any:
    """``fn`` running in ``main`` itself (the initializer: the globals it binds land
    there), its own globals merged in first."""
    new = types.FunctionType(fn.__code__, main, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    new.__dict__.update(fn.__dict__)
    for name, value in fn.__globals__.items():
        if not name.startswith("__"):
            main[name] = value
    return new


def run_initializer(fn: Any, args: tuple, call: Any) -> None:
    """Runs the initializer through ``call(fn, args, {})``; the globals it binds in
    ``__main__`` are kept from then on (see the module docstring)."""
    main = _namespace()
    if isinstance(fn, types.FunctionType) and fn.__module__ == "__main__":
        fn = _rebind(adopt(fn), main)
    before = dict(main)
    call(fn, args, {})
    _INITIALIZED.update(
        name for name, value in main.items() if before.get(name, _UNSET) is not value
    )


_UNSET = object()
