"""What crosses the rings: record kinds, and how functions, results and exceptions are encoded.

Functions are pickled once per function object (cached) by reference when
they are importable, and by value with cloudpickle when they live in
``__main__`` or are lambdas/closures, so scripts and notebooks work without the
``if __name__ == "__main__"`` re-import that spawn needs for every call.
"""

from __future__ import annotations

import pickle
import traceback
import types
from typing import Any, Callable

from fastpool import errors

# Task-ring kinds below 16 are tasks: the worker records them in slot.current.
K_CALL = 1
K_STOP = 16
K_INIT = 17

# Result-ring kinds.
R_OK = 1
R_ERR = 2
R_BAD_RESULT = 3
R_READY = 16
R_INIT_FAILED = 17

PROTOCOL = 5

_FN_CACHE: dict[Any, bytes] = {}
_FN_CACHE_MAX = 1024


def dumps(obj: Any) -> bytes:
    return pickle.dumps(obj, PROTOCOL)


loads = pickle.loads


def _by_value(fn: Any) -> bool:
    mod = getattr(fn, "__module__", None)
    qual = getattr(fn, "__qualname__", "")
    return mod == "__main__" or mod is None or "<lambda>" in qual or "<locals>" in qual


def function_bytes(fn: Callable[..., Any]) -> bytes:
    """The pickle of fn, cached for plain functions (their pickle never changes).

    Raises SerializationError if fn cannot be pickled at all."""
    cacheable = isinstance(fn, (types.FunctionType, types.BuiltinFunctionType))
    if cacheable:
        try:
            return _FN_CACHE[fn]
        except (KeyError, TypeError):
            pass
    try:
        if _by_value(fn):
            import cloudpickle

            data = cloudpickle.dumps(fn, PROTOCOL)
        else:
            data = dumps(fn)
    except Exception as exc:
        try:
            import cloudpickle

            data = cloudpickle.dumps(fn, PROTOCOL)
        except Exception:
            raise errors.SerializationError(
                f"the function {getattr(fn, '__qualname__', fn)!r}", f"{type(exc).__name__}: {exc}"
            ) from exc
    if cacheable:
        if len(_FN_CACHE) >= _FN_CACHE_MAX:
            _FN_CACHE.clear()
        _FN_CACHE[fn] = data
    return data


def encode_call(fn_bytes: bytes, args: tuple, kwargs: dict) -> bytes:
    """Pickles a call; raises SerializationError naming the bad argument."""
    try:
        return dumps((fn_bytes, args, kwargs))
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
            what, f"{type(exc).__name__}: {exc}. Nothing was submitted; pass something picklable "
            "(or a shared array) instead"
        ) from exc


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
    exc.__cause__ = RemoteTraceback(tb)
    return exc


def encode_bad_result(task_id: int, exc: BaseException, result: Any) -> bytes:
    return dumps((f"the result of task {task_id} ({type(result).__name__})", f"{type(exc).__name__}: {exc}"))


def decode_bad_result(payload: bytes) -> errors.SerializationError:
    what, reason = loads(payload)
    return errors.SerializationError(what, reason + "; the worker is fine and was not restarted")
