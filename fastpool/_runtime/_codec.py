"""What crosses the rings: record kinds, and how calls, results and exceptions are encoded.

The one room that ships a call.  ``Pool.submit`` and ``map``, every ``fastpool.mp``
method, the joblib batches and the Dask executor all hand it their function and
arguments as objects; none pickles a call itself.

    the task's function  -> function_bytes: by reference when importable; by value
                            (cloudpickle) from __main__, a lambda or a closure; cached;
                            sent to each worker once.  One that holds arrays (a
                            partial's, a closure's, a bound method's object) or a
                            pickle over half a ring record rides in each call
                            instead: _call.ride(fn, *args), fn among the arguments
    its arguments        -> encode_args, with the call pickler (CallPickler):
                            a function anywhere in them that goes by value (a lambda
                            in args, functools.partial(lambda), a joblib batch's
                            functions, FunctionTransformer(lambda) deep in a
                            scikit-learn pipeline) -> its function_bytes, rebuilt in
                            the worker by ``function_from`` (cached there)
                            an ndarray -> a descriptor of shared memory (_arrays)
                            anything else the plain pickler refuses -> the whole
                            call again with cloudpickle underneath (as loky ships)
    a map's chunks       -> one copy of each array for all of them (_arrays.CopyMemo)
    over a ring record   -> the pickle in an arena block, a stub in the ring (spill)
    in the worker        -> load_function: every function sent by value is adopted
                            by ``_mainns`` (initializer globals, __main__ classes)
    results, exceptions  -> plain pickle (arrays as descriptors); a spawned template
                            names __main__ classes __mp_main__.X, which the parent
                            resolves through ``alias_main`` (multiprocessing's alias)

Sending ``__main__`` functions by value lets scripts and notebooks work without the
``if __name__ == "__main__"`` re-import that spawn needs for every call.
"""

from __future__ import annotations

import linecache
import pickle
import re
import sys
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


def function_bytes(fn: Callable[..., Any], rides: int | None = None) -> bytes | None:
    """The pickle of fn: by reference when importable, else by value (cloudpickle).

    Cached per function.  A function sent by value (``__main__``, lambdas,
    closures) is pickled again when a global it reads, a closure cell or its
    defaults were rebound since, so a notebook that redefines a global reaches
    the workers.  With ``rides`` (a size in bytes), None instead when fn must ride
    in each call rather than be sent once per worker: it holds an array that
    crosses through shared memory (a ``partial``'s argument, a closure cell, a
    bound method's object), or its pickle is ``rides`` bytes or more.  Raises
    SerializationError if fn cannot be pickled at all."""
    cache: Any = (
        _FN_CACHE
        if isinstance(fn, types.FunctionType)
        else (_BUILTIN_CACHE if isinstance(fn, types.BuiltinFunctionType) else None)
    )
    by_value = _by_value(fn)
    mark = None
    hit = cache.get(fn) if cache is not None else None
    data: bytes | None
    if by_value and isinstance(fn, types.FunctionType):
        mark = _captured(fn)
        if hit is not None and _same(hit[0], mark):
            data = hit[1]
            if data is None and rides is None:  # it holds arrays: by value, arrays inline
                return _pickle_function(fn, True, False)
            return None if data is None or (rides is not None and len(data) >= rides) else data
    elif hit is not None:
        return hit
    # a function sent by value is always probed: its pickle is cached either way
    data = _pickle_function(fn, by_value, rides is not None or mark is not None)
    if cache is not None:
        if len(cache) >= _FN_CACHE_MAX:
            cache.clear()
        cache[fn] = (mark, data) if mark is not None else data
    if data is None:
        return None if rides is not None else _pickle_function(fn, by_value, False)
    return None if rides is not None and len(data) >= rides else data


def _pickle_function(fn: Any, by_value: bool, probe: bool) -> bytes | None:
    # fn's pickle; with probe, None when it holds an array that crosses through shared
    # memory (the caller sends it in the call instead, with the arena)
    try:
        if by_value:
            return _encode_by_value(fn, None, None, probe)
        if isinstance(fn, (types.FunctionType, types.BuiltinFunctionType)):
            return dumps(fn)
        # a callable object (functools.partial, mp's _Star): what it holds, as a call's
        return _pickle_call(fn, None, None, probe=probe)
    except _arrays.CarriesArrays:
        return None
    except errors.FastPoolError:
        raise
    except Exception as exc:
        try:
            return _encode_by_value(fn, None, None, probe)
        except _arrays.CarriesArrays:
            return None
        except Exception:
            raise errors.SerializationError(
                f"the function {getattr(fn, '__qualname__', fn)!r}", f"{type(exc).__name__}: {exc}"
            ) from exc


def _encode_by_value(
    fn: Any, arena: Any, keep: list | None, probe: bool, memo: _arrays.CopyMemo | None = None
) -> bytes:
    """fn pickled by value (cloudpickle), its arrays inline, or with ``probe``
    CarriesArrays at the first one an arena would take.  With ``arena``, its arrays
    as descriptors, and the functions it reads that go by value as their own
    ``function_bytes`` (``CallPickler``): what it brings is then fn's alone, and a
    global function does not tie its globals to fn's in a cycle, which would keep
    the arrays mapped in the worker until its garbage collector ran."""
    if arena is None:
        return _arrays.encode(_Sourced(fn), None, None, pickler=_cloud_array_pickler(probe))[0]
    _ENCODING.add(id(fn))
    try:
        cls = _cloud_pickler()

        def pickler(*args: Any) -> Any:
            p = cls(*args)
            p.top = fn
            return p

        return _arrays.encode(_Sourced(fn), arena, keep, pickler=pickler, memo=memo)[0]
    finally:
        _ENCODING.discard(id(fn))


_ENCODING: set[int] = set()  # by-value functions being pickled with an arena: pickled inline


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
    obj: Any,
    args: Any,
    kwargs: dict,
    arena: Any = None,
    keep: list | None = None,
    memo: _arrays.CopyMemo | None = None,
) -> bytes:
    """Pickles a call's arguments (obj: args, (args, kwargs) or a map chunk's items).

    A chunk of numbers travels as one buffer (``_numbers``).  With
    ``arena``, arrays travel as descriptors (see ``encode``); ``memo`` shares
    their copies between the calls that pass the same one (a map's chunks).
    Raises SerializationError naming the argument that cannot be pickled."""
    if type(obj) is _numbers.Numbers:  # a map chunk the engine packed: no arrays in it
        return dumps(obj)
    if type(obj) is list and (packed := _numbers.pack(obj)) is not None:
        return dumps(packed)
    try:
        return _pickle_call(obj, arena, keep, memo=memo)
    except errors.FastPoolError:
        raise
    except Exception as exc:
        what = "an argument"
        for i, a in enumerate(args):
            try:
                _pickle_call(a, None, None)
            except Exception:
                what = f"argument {i} ({type(a).__name__})"
                break
        else:
            for k, v in kwargs.items():
                try:
                    _pickle_call(v, None, None)
                except Exception:
                    what = f"keyword argument {k!r} ({type(v).__name__})"
                    break
        raise errors.SerializationError(
            what,
            f"{type(exc).__name__}: {exc}. Nothing was submitted; pass something picklable "
            "(or a shared array) instead",
        ) from exc


class CallPickler(_arrays.ArrayPickler):
    """The pickler of a call's arguments: a function that goes by value, wherever it
    sits, travels as its ``function_bytes``, or, when it holds arrays, by value in
    this pickle with its arrays as descriptors; arrays as descriptors (``_arrays``)."""

    top: Any = None  # the function being pickled by value, which no rule may send again

    def reducer_override(self, obj: Any) -> Any:
        if (
            type(obj) is types.FunctionType
            and obj is not self.top
            and _by_value(obj)
            and id(obj) not in _ENCODING
        ):
            if self.arena is None and not self.probe:
                return function_from, (function_bytes(obj),)
            data = function_bytes(obj, _NEVER_RIDES)
            if data is not None:
                return function_from, (data,)
            if self.probe:
                raise _arrays.CarriesArrays()
            # not cached in the worker (load_function): its views go with the call
            return load_function, (
                _encode_by_value(obj, self.arena, self.keep, False, self.copies),
            )
        return self.reduce_array(obj)


class _ProbeCallPickler(CallPickler):
    probe = True


_NEVER_RIDES = 1 << 62  # function_bytes(rides=...): only for the arrays it holds
_CLOUD: dict[Any, Any] = {}  # the cloudpickle-based picklers, made on first need


def _cloud_pickler(probe: bool = False) -> Any:
    key = ("call", probe)
    if key not in _CLOUD:
        import cloudpickle

        class CloudCallPickler(_ProbeCallPickler if probe else CallPickler, cloudpickle.Pickler):
            """CallPickler over cloudpickle: what the plain pickler refuses (a class
            defined in a function, an object holding one) is pickled by value."""

            def reducer_override(self, obj: Any) -> Any:
                out = CallPickler.reducer_override(self, obj)
                if out is NotImplemented:
                    out = cloudpickle.Pickler.reducer_override(self, obj)
                return out

        _CLOUD[key] = CloudCallPickler
    return _CLOUD[key]


def _cloud_array_pickler(probe: bool) -> Any:
    key = ("function", probe)
    if key not in _CLOUD:
        import cloudpickle

        class CloudArrayPickler(_arrays.ArrayPickler, cloudpickle.Pickler):
            """A function by value (cloudpickle), with the arrays it holds as
            descriptors (or, probing, CarriesArrays at the first)."""

            def reducer_override(self, obj: Any) -> Any:
                out = self.reduce_array(obj)
                if out is NotImplemented:
                    out = cloudpickle.Pickler.reducer_override(self, obj)
                return out

        CloudArrayPickler.probe = probe
        _CLOUD[key] = CloudArrayPickler
    return _CLOUD[key]


def _pickle_call(
    obj: Any,
    arena: Any,
    keep: list | None,
    probe: bool = False,
    memo: _arrays.CopyMemo | None = None,
) -> bytes:
    """obj with CallPickler; if the plain pickler refuses something in it, all of it
    again over cloudpickle (the first try's copies into shared memory are dropped).
    ``probe``: CarriesArrays at the first array an arena would take (no arena)."""
    try:
        return _arrays.encode(
            obj, arena, keep, pickler=_ProbeCallPickler if probe else CallPickler, memo=memo
        )[0]
    except (errors.FastPoolError, _arrays.CarriesArrays):
        raise
    except Exception:  # noqa: BLE001 - cloudpickle's turn; its own error is the one reported
        return _arrays.encode(obj, arena, keep, pickler=_cloud_pickler(probe), memo=memo)[0]


def spill(payload: bytes, arena: Any, keep: list) -> bytes:
    """A call's pickle too large for a ring record, moved into an arena block that
    ``keep`` holds until the call settles; returns what crosses the ring instead
    (``_arrays.spill``).  Raises SharedMemoryError when the arena cannot hold it."""
    return _arrays.spill(payload, arena, keep, None)


_LOADED: dict[bytes, Any] = {}  # a worker's functions that arrived inside calls, by pickle
_LOADED_MAX = 256


def load_function(data: bytes) -> Any:
    """A function sent by ``function_bytes``, as the worker runs it: one from
    ``__main__`` sees the globals the initializer set and brings its classes into
    ``__main__`` (see _mainns).  Raises what unpickling raises."""
    from fastpool._runtime import _mainns

    return _mainns.adopt(loads(data))


def function_from(data: bytes) -> Any:
    """Unpickles a function that ``CallPickler`` sent inside a call: ``load_function``,
    once per distinct pickle in this process (a joblib batch sends its functions with
    every batch)."""
    fn = _LOADED.get(data)
    if fn is None:
        fn = load_function(data)
        if len(_LOADED) >= _LOADED_MAX:
            _LOADED.clear()
        _LOADED[data] = fn
    return fn


def alias_main() -> None:
    """Lets this process unpickle what a spawned template sends back: that template
    runs the main script as ``__mp_main__``, so the classes defined there pickle as
    ``__mp_main__.X``.  multiprocessing sets the same alias when it is imported."""
    main = sys.modules.get("__main__")
    if main is not None:
        sys.modules.setdefault("__mp_main__", main)


def encode_result(result: Any, owned: Any = None, spill_at: int = 0) -> tuple[bytes, Any]:
    """A worker's result (see ``_arrays.encode_result``, and ``spill_at``); a chunk's
    results that ``run_chunk`` packed travel as one buffer (``_numbers``).  A list is
    pickled as a list: the caller of a task that returned one gets a list."""
    if type(result) is _numbers.Numbers:
        return _arrays.spill_result(dumps(result), spill_at)
    return _arrays.encode_result(result, owned, spill_at)


class RemoteTraceback(Exception):
    """The worker-side traceback, attached as ``__cause__`` of a task's exception."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return f'\n"""\n{self.tb}"""'


def _crossing(exc: BaseException) -> bytes | None:
    """exc's pickle, or None if it does not pickle or cannot be rebuilt (a bad __init__).
    Plain pickle leaves out the traceback and the chain; a reducer registered for
    exceptions may not (tblib's, which importing Dask installs, pickles both, and a
    RecursionError's traceback is deeper than the pickler may recurse): one more try
    without them, whose text travels beside the pickle anyway."""
    try:
        out = dumps(exc)
        loads(out)
        return out
    except Exception:
        pass
    saved = exc.__traceback__, exc.__cause__, exc.__context__, exc.__suppress_context__
    try:
        exc.__traceback__ = exc.__cause__ = exc.__context__ = None
        out = dumps(exc)
        loads(out)
        return out
    except Exception:
        return None
    finally:
        exc.__traceback__, exc.__cause__, exc.__context__, exc.__suppress_context__ = saved


def encode_exception(exc: BaseException) -> bytes:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    exc_bytes = _crossing(exc)
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
        return _pickle_call(init_call, arena, keep)
    except errors.FastPoolError:
        raise
    except Exception as exc:
        raise errors.SerializationError("initargs", f"{type(exc).__name__}: {exc}") from exc
