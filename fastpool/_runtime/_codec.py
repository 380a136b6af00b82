"""What crosses the rings: record kinds, and how functions, results and exceptions are encoded.

Functions are pickled once per function object (cached) by reference when
they are importable, and by value with cloudpickle when they live in
``__main__`` or are lambdas/closures, so scripts and notebooks work without the
``if __name__ == "__main__"`` re-import that spawn needs for every call.

Arrays travel as descriptors of the pool's shared memory: that is
``fastpool/_runtime/_arrays.py``, which this module calls for every payload.
"""

from __future__ import annotations

import linecache
import pickle
import re
import traceback
import types
import weakref
from typing import Any, Callable

from fastpool import errors

# The record kinds live in csrc/fp_proto.h; _core exports them.
from fastpool._native._core import (  # noqa: E402,F401
    K_CALL,
    K_CALLKW,
    K_CHUNK,
    K_INIT,
    K_STARCHUNK,
    K_STOP,
    R_BAD_RESULT,
    R_ERR,
    R_INIT_FAILED,
    R_OK,
    R_READY,
    R_SKIPPED,
)
from fastpool._runtime import _arrays, _numbers
from fastpool._runtime._arrays import (  # noqa: E402,F401 - the result's two ends
    PROTOCOL,
    TRANSFERRED,
    decode_result,
    encode,
)

# fn -> its pickle, or (the objects it was pickled with, pickle) for one sent by value.
# Weak keys: a dropped lambda (and whatever its closure holds) is not kept alive here.
_FN_CACHE: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_BUILTIN_CACHE: dict[Any, bytes] = {}  # builtins cannot be weakly referenced; there are few
_FN_CACHE_MAX = 1024
_GLOBAL_NAMES: dict[
    Any, tuple[str, ...]
] = {}  # code object -> the global names it (or a nested def) reads
_MISSING = object()


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, PROTOCOL)


loads = pickle.loads


def _by_value(fn: Any) -> bool:
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", "")
    return mod == "__main__" or mod is None or "<lambda>" in qual or "<locals>" in qual


def stable_function(fn: Any) -> bool:
    """True if fn's pickle can never change: a plain function pickled by reference."""
    return isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)) and not _by_value(fn)


def _global_names(code: types.CodeType) -> tuple[str, ...]:
    names = _GLOBAL_NAMES.get(code)
    if names is None:
        found = set(code.co_names)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                found.update(_global_names(const))
        names = _GLOBAL_NAMES[code] = tuple(sorted(found))
    return names


def _captured(fn: types.FunctionType, seen: set[int] | None = None) -> list[Any]:
    """What a by-value pickle of fn captures, as the objects themselves: its code,
    the globals it reads (and, for each of those that is itself a function sent by
    value, what that one captures), its closure cells and its defaults.  Compared
    by identity: rebinding any of them is noticed; mutating a referenced object in
    place is not (docs/quickstart.md, "Functions and arguments").  Holding the objects, not
    their id(), is what makes the identity test sound (an id is reused once its object dies)."""
    if seen is None:
        seen = set()
    seen.add(id(fn))
    g = fn.__globals__
    out: list[Any] = [fn.__code__, fn.__defaults__, fn.__kwdefaults__]
    for name in _global_names(fn.__code__):
        value = g.get(name, _MISSING)
        out.append(value)
        if isinstance(value, types.FunctionType) and _by_value(value) and id(value) not in seen:
            out.extend(_captured(value, seen))
    for cell in fn.__closure__ or ():
        out.append(cell.cell_contents if _cell_set(cell) else _MISSING)
    return out


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _cell_set(cell: Any) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def function_bytes(fn: Callable[..., Any]) -> bytes:
    """The pickle of fn: by reference when importable, else by value (cloudpickle).

    Cached per function.  A function sent by value (``__main__``, lambdas,
    closures) is pickled again when a global it reads, a closure cell or its
    defaults were rebound since, so a notebook that redefines a global reaches
    the workers.  Raises SerializationError if fn cannot be pickled at all."""
    cache: Any = (
        _FN_CACHE
        if isinstance(fn, types.FunctionType)
        else (_BUILTIN_CACHE if isinstance(fn, types.BuiltinFunctionType) else None)
    )
    by_value = _by_value(fn)
    mark = None
    hit = cache.get(fn) if cache is not None else None
    if by_value and isinstance(fn, types.FunctionType):
        mark = _captured(fn)
        if hit is not None and _same(hit[0], mark):
            return hit[1]
    elif hit is not None:
        return hit
    try:
        if by_value:
            import cloudpickle

            data = cloudpickle.dumps(_Sourced(fn), PROTOCOL)
        else:
            data = dumps(fn)
    except Exception as exc:
        try:
            import cloudpickle

            data = cloudpickle.dumps(_Sourced(fn), PROTOCOL)
        except Exception:
            raise errors.SerializationError(
                f"the function {getattr(fn, '__qualname__', fn)!r}", f"{type(exc).__name__}: {exc}"
            ) from exc
    if cache is not None:
        if len(cache) >= _FN_CACHE_MAX:
            cache.clear()
        cache[fn] = (mark, data) if mark is not None else data
    return data


class _Sourced:
    """A function sent by value, with its file name: cloudpickle replaces every code
    object's file name with ``<dynamic-code>``, so a worker's traceback would show neither
    the file nor the source line.  Unpickles as the function itself."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __reduce__(self) -> Any:
        code = getattr(self.fn, "__code__", None)
        if code is None:
            return _as_is, (self.fn,)
        return _with_filename, (self.fn, code.co_filename)


def _as_is(fn: Any) -> Any:
    return fn


def _with_filename(fn: Any, filename: str) -> Any:
    def fix(code: types.CodeType) -> types.CodeType:
        consts = tuple(fix(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        return code.replace(co_filename=filename, co_consts=consts)

    try:
        fn.__code__ = fix(fn.__code__)
    except (AttributeError, TypeError, ValueError):
        pass  # a traceback without its file name is still a traceback
    return fn


def encode_args(
    obj: Any, args: Any, kwargs: dict, arena: Any = None, keep: list | None = None
) -> bytes:
    """Pickles a call's arguments (obj: args, (args, kwargs) or a map chunk's items).

    A chunk of numbers travels as one buffer (``_numbers``).  With
    ``arena``, arrays travel as descriptors (see ``encode``).  Raises
    SerializationError naming the argument that cannot be pickled."""
    if type(obj) is _numbers.Numbers:  # a map chunk the engine packed: no arrays in it
        return dumps(obj)
    if type(obj) is list and (packed := _numbers.pack(obj)) is not None:
        return dumps(packed)
    try:
        return encode(obj, arena, keep)[0]
    except errors.FastPoolError:
        raise
    except Exception as exc:
        what = "an argument"
        for i, a in enumerate(args):
            try:
                dumps(a)
            except Exception:
                what = f"argument {i} ({type(a).__name__})"
                break
        else:
            for k, v in kwargs.items():
                try:
                    dumps(v)
                except Exception:
                    what = f"keyword argument {k!r} ({type(v).__name__})"
                    break
        raise errors.SerializationError(
            what,
            f"{type(exc).__name__}: {exc}. Nothing was submitted; pass something picklable "
            "(or a shared array) instead",
        ) from exc


def encode_result(result: Any, owned: Any = None) -> tuple[bytes, Any]:
    """A worker's result (see ``_arrays.encode_result``); a chunk's results that
    ``run_chunk`` packed travel as one buffer (``_numbers``), with no handoffs.  A
    list is pickled as a list: the caller of a task that returned one gets a list."""
    if type(result) is _numbers.Numbers:
        return dumps(result), None
    return _arrays.encode_result(result, owned)


class RemoteTraceback(Exception):
    """The worker-side traceback, attached as ``__cause__`` of a task's exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def encode_exception(exc: BaseException) -> bytes:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        exc_bytes: bytes | None = dumps(exc)
        loads(exc_bytes)  # some exceptions pickle but cannot be rebuilt (bad __init__)
    except Exception:
        exc_bytes = None
    try:
        message = str(exc)
    except Exception:
        message = "<str() failed>"
    return dumps((exc_bytes, f"{type(exc).__module__}.{type(exc).__qualname__}", message, tb))


def decode_exception(payload: bytes) -> BaseException:
    exc_bytes, type_name, message, tb = loads(payload)
    exc: BaseException | None = None
    if exc_bytes is not None:
        try:
            exc = loads(exc_bytes)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = errors.RemoteError(type_name, message, tb)
    exc.__cause__ = RemoteTraceback(with_source(tb))
    return exc


_FRAME = r'^  File "(.+)", line (\d+), in '  # compiled at the first remote error (re caches it)


def with_source(tb: str) -> str:
    """A worker's traceback text with the source lines it lacked filled in from this
    process's linecache: code from a notebook cell or the REPL has no file the worker could
    read, but the parent's linecache holds it (IPython registers every cell there)."""
    lines = tb.splitlines(keepends=True)
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        m = re.match(_FRAME, line)
        if m is None or (i + 1 < len(lines) and lines[i + 1].startswith("    ")):
            continue
        source = linecache.getline(m.group(1), int(m.group(2))).strip()
        if source:
            out.append(f"    {source}\n")
    return "".join(out)


def encode_bad_result(task_id: int, exc: BaseException, result: Any) -> bytes:
    return dumps(
        (f"the result of task {task_id} ({type(result).__name__})", f"{type(exc).__name__}: {exc}")
    )


def decode_bad_result(payload: bytes) -> errors.SerializationError:
    what, reason = loads(payload)
    return errors.SerializationError(what, reason + "; the worker is fine and was not restarted")


def encode_init(init_call: tuple, arena: Any, keep: list) -> bytes:
    """The K_INIT payload: shared arrays in initargs travel as descriptors, so every
    replacement worker maps them instead of receiving their bytes again."""
    try:
        return encode(init_call, arena, keep)[0]
    except errors.FastPoolError:
        raise
    except Exception as exc:
        raise errors.SerializationError("initargs", f"{type(exc).__name__}: {exc}") from exc
