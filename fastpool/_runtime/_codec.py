"""What crosses the rings: record kinds, and how functions, results and exceptions are encoded.

Functions are pickled once per function object (cached) by reference when
they are importable, and by value with cloudpickle when they live in
``__main__`` or are lambdas/closures, so scripts and notebooks work without the
``if __name__ == "__main__"`` re-import that spawn needs for every call.

Arrays (issue 3).  With an arena (the pool's shared memory), a custom pickler
sends an ndarray as a descriptor -- arena token, block offset and generation,
byte offset, dtype, shape, strides, read-only, handoff -- instead of its bytes:

    arena-backed array or any view of it -> descriptor, zero bytes copied
    a worker's result NumPy made in its   -> descriptor, zero bytes copied, when only the
    region (fastpool/_native/_alloc.pyx)             result holds it (else copied: the worker may
                                            change what it kept)
    plain array >= OOB_THRESHOLD_BYTES   -> one copy into a fresh block of the
                                            sender's region, then a descriptor
    object dtype, small, subclasses      -> pickled as before (inline in the ring)
    array of another (or a closed) pool  -> treated as a plain array: one copy

The receiver maps each descriptor from its own mapping (its own counter).  The
block must outlive the trip: the parent keeps a call's blocks in ``keep`` (the
future holds them until it settles); a worker adds one reference per result
descriptor (``handoff``) that the parent drops once it holds its own.
"""

from __future__ import annotations

import io
import linecache
import os
import pickle
import re
import struct
import sys
import traceback
import types
import weakref
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from numpy.typing import NDArray

from fastpool import errors

A = TypeVar("A", bound="NDArray[Any]")  # transfer() hands back the array it was given

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

PROTOCOL = 5
OOB_THRESHOLD_BYTES = 64 << 10  # smaller plain arrays travel inline: a block costs a page

TRANSFERRED = "transferred"  # marker in a call's keep list: the task holds detached buffers
_transfer_marks: dict[int, Any] = {}  # id(array) -> weakref, set by transfer()
_PROCESS_ARENA: list[Any] = [None]  # a worker's own arena (results are encoded into it)
_ndarray: Any = None
_ATOMIC = frozenset((int, float, str, bytes, bool, type(None), complex))

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


def _np_ndarray() -> Any:
    global _ndarray
    if _ndarray is None and "numpy" in sys.modules:
        _ndarray = sys.modules["numpy"].ndarray
    return _ndarray


def transfer(arr: A) -> A:
    """Marks a shared array as handed to the next task (or result) it is sent with.

    Once that call is submitted (or that result returned), this handle is detached:
    indexing, ufuncs and NumPy functions, repr, len, iteration, copy/astype/tolist/
    tobytes, and sending it again raise ``DetachedBufferError``; any other path sees
    a zero-length read-only array, never the task's bytes.  A task holding
    transferred buffers is never retried automatically.  Views taken from ``arr``
    before the transfer are separate handles and stay valid.  Returns ``arr``.
    Raises TypeError for an array that is not a view of a pool's shared memory, or a 0-d one."""
    nd = _np_ndarray()
    if nd is not None and type(arr) is __getattr__("DetachedArray"):
        raise errors.DetachedBufferError("this array was already transferred to a task")
    if nd is None or not isinstance(arr, nd) or _block_of(arr) is None:
        raise TypeError(
            "fastpool.transfer() takes an array from pool.empty/zeros/share (or a view "
            f"of one), not {type(arr).__name__}; plain arrays are copied anyway"
        )
    if arr.ndim == 0:
        raise TypeError("fastpool.transfer() needs an array with at least one dimension")
    _transfer_marks[id(arr)] = weakref.ref(arr, lambda _r, k=id(arr): _transfer_marks.pop(k, None))
    return arr


def _block_of(arr: Any) -> Any:
    from fastpool._native._arena import Block

    nd = _np_ndarray()
    b = arr.base
    while isinstance(b, nd):
        b = b.base
    return b if isinstance(b, Block) else None


def _detached(*_a: Any, **_k: Any) -> Any:
    raise errors.DetachedBufferError(
        "this array was transferred to a task with fastpool.transfer(); use the array the task "
        "returns (or a copy taken before the transfer)"
    )


def _make_detached_type() -> type:
    import numpy as np

    ns: dict[str, Any] = {"__slots__": ()}
    for name in (
        "__getitem__",
        "__setitem__",
        "__array_ufunc__",
        "__array_function__",
        "__repr__",
        "__str__",
        "__len__",
        "__iter__",
        "__array__",
        "__reduce__",
        "__reduce_ex__",
        "__copy__",
        "__deepcopy__",
        "copy",
        "astype",
        "tolist",
        "tobytes",
        "item",
        "view",
        "reshape",
        "fill",
        "__format__",
    ):
        ns[name] = _detached
    from fastpool._native import _arena

    cls = type("DetachedArray", (np.ndarray,), ns)
    _arena.plain_instances(cls)  # same layout as ndarray, so detach() may swap the type in
    return cls


class _LazyDetached:
    cls: Any = None


def __getattr__(name: str) -> Any:
    if name == "DetachedArray":
        if _LazyDetached.cls is None:
            _LazyDetached.cls = _make_detached_type()
        return _LazyDetached.cls
    raise AttributeError(name)


class _ArrayPickler(pickle.Pickler):
    """Pickles ndarrays as arena descriptors (see the module docstring)."""

    def __init__(
        self, file: Any, arena: Any, keep: list | None, handoff: bool, owned: Any = None
    ) -> None:
        super().__init__(file, PROTOCOL)
        self.arena = arena
        self.keep = keep
        self.handoff = handoff
        self.owned = owned  # ids of NumPy-hook arrays only the result holds: sent without a copy
        self.handed: list = []  # blocks this worker added a reference to (undone on failure)
        self.detach: list = []

    def reducer_override(self, obj: Any) -> Any:
        nd = _np_ndarray()
        if nd is None or not isinstance(obj, nd):
            return NotImplemented
        det = __getattr__("DetachedArray")
        if type(obj) is det:
            _detached()
        if type(obj) is not nd:
            return NotImplemented
        from fastpool._native import _arena

        arena = self.arena
        root = obj
        while isinstance(root.base, nd):
            root = root.base
        blk = root.base if isinstance(root.base, _arena.Block) else None
        # (object arrays: NumPy zero-fills them through calloc, which the hook leaves to
        # malloc; the dtype check keeps this process's pointers from crossing regardless)
        if (
            blk is None
            and self.owned is not None
            and id(root) in self.owned
            and not root.dtype.hasobject
        ):
            from fastpool._native import _alloc

            blk = _alloc.adopt(root)  # made in this worker's region by NumPy: no copy
        transferring = id(obj) in _transfer_marks
        if blk is None or blk.owner is not arena:
            if transferring and blk is not None:
                raise errors.SerializationError(
                    "a transferred array",
                    "it belongs to another pool (or one that was shut down); "
                    "transfer only arrays of the pool you submit to",
                )
            if obj.dtype.hasobject or obj.nbytes < OOB_THRESHOLD_BYTES:
                return NotImplemented
            dst = _arena.copy_in(arena, obj)  # the one copy: straight into shared memory
            blk = dst.base
            byte_off = _arena.address_of(dst) - blk.address
            strides, readonly = dst.strides, not obj.flags.writeable
        else:
            byte_off = _arena.address_of(obj) - blk.address
            strides, readonly = obj.strides, (not obj.flags.writeable) or blk.readonly
            if transferring:
                self.detach.append(obj)
        if self.handoff:
            arena.handoff(blk)
            self.handed.append(blk)
            src = arena.proc
        else:
            if self.keep is not None:
                self.keep.append(blk)
            src = -1
        return (
            _arena.rebuild,
            (arena.token, blk.off, blk.gen, byte_off, obj.dtype, obj.shape, strides, readonly, src),
        )


def encode(
    obj: Any, arena: Any, keep: list | None = None, handoff: bool = False, owned: Any = None
) -> bytes:
    """Pickles obj with arrays as descriptors into arena (plain dumps when arena is None).

    ``keep`` collects the blocks that must live until the receiver has mapped them,
    plus TRANSFERRED when obj carried transferred arrays; those are detached here,
    after the pickle succeeded.  Raises what pickling raises; nothing is detached then."""
    if arena is None:
        return dumps(obj)
    buf = io.BytesIO()
    p = _ArrayPickler(buf, arena, keep, handoff, owned)
    try:
        p.dump(obj)
    except BaseException:
        for blk in p.handed:
            arena.unref_for(arena.proc, blk.off)
        raise
    if handoff:
        _LAST_HANDED[0] = (
            arena,
            [blk.off for blk in p.handed],
        )  # offsets: a Block would pin its block
    if p.detach:
        from fastpool._native import _arena

        det = __getattr__("DetachedArray")
        for arr in p.detach:
            _transfer_marks.pop(id(arr), None)
            _arena.detach(arr, det)
        if keep is not None:
            keep.append(TRANSFERRED)
    return buf.getvalue()


_LAST_HANDED: list[Any] = [None]  # a worker's last result: (arena, blocks it handed to the parent)


def release_handoff(payload: bytes | None) -> None:
    """Takes back the references a worker handed over with its last result,
    which will never reach the parent (it did not fit the ring)."""
    last, _LAST_HANDED[0] = _LAST_HANDED[0], None
    if last is not None and payload is not None:
        arena, handed = last
        for off in handed:
            arena.unref_for(arena.proc, off)


NUMPY_HOOK_ENV = "FASTPOOL_NUMPY_HOOK"  # "0": a worker's NumPy allocates with malloc only
_HOOK_PENDING = [False]  # a worker whose hook waits for numpy to be imported


def set_process_arena(arena: Any) -> None:
    """A worker's own arena: results are encoded into it, and NumPy allocates large
    arrays in it (fastpool/_native/_alloc.pyx) once numpy is imported."""
    _PROCESS_ARENA[0] = arena
    _HOOK_PENDING[0] = (
        arena is not None and arena.proc != 0 and os.environ.get(NUMPY_HOOK_ENV, "1") != "0"
    )
    _install_hook()


def _install_hook() -> None:
    # Importing numpy here would cost every worker its import; a task that imports
    # it gets the hook from its first array result on (encode_result calls this).
    if _HOOK_PENDING[0] and "numpy" in sys.modules:
        _HOOK_PENDING[0] = False
        from fastpool._native import _alloc

        try:
            _alloc.install(_PROCESS_ARENA[0])
        except (
            RuntimeError,
            MemoryError,
        ) as exc:  # another NEP 49 handler: it stays, results are copied
            import logging

            logging.getLogger("fastpool").warning(
                "fastpool: NumPy arrays are not made in shared memory: %s", exc
            )


def encode_result(result: Any, owned: Any = None) -> bytes:
    """A worker's result: large arrays into its own region, handed off to the parent.

    ``owned``: ids of the NumPy-hook arrays only ``result`` holds (_alloc.owned_roots);
    they are sent as they are, every other array is copied.  The blocks handed
    over are remembered for ``with_handoffs``."""
    if _HOOK_PENDING[0]:
        _install_hook()
    _LAST_HANDED[0] = None
    return encode(result, None if type(result) in _ATOMIC else _PROCESS_ARENA[0], None, True, owned)


_HANDOFFS = struct.Struct("<II")  # trailer end: how many offsets, and a magic
_HANDOFFS_MAGIC = 0x46504844  # "FPHD"


def with_handoffs(payload: bytes) -> bytes | None:
    """The last encoded result with the offsets of the blocks it handed over
    appended (so the parent can take them back even if it cannot decode the
    result); None when it handed over none."""
    last = _LAST_HANDED[0]
    if last is None or not last[1]:
        return None
    offs = last[1]
    return (
        payload + struct.pack(f"<{len(offs)}Q", *offs) + _HANDOFFS.pack(len(offs), _HANDOFFS_MAGIC)
    )


def decode_result(payload: bytes, arena: Any, src: int) -> Any:
    """The parent's decoding of a result whose payload carries its handoffs (see
    with_handoffs), from worker process ``src`` of ``arena``.  If decoding fails part-way, the
    handoffs not yet taken back are dropped here, so no block stays pinned; the
    error is then raised.  Raises SegmentCorrupt for a trailer that does not hold."""
    from fastpool._native import _arena

    end = len(payload) - _HANDOFFS.size
    n, magic = _HANDOFFS.unpack_from(payload, end) if end >= 0 else (0, 0)
    start = end - 8 * n
    if magic != _HANDOFFS_MAGIC or start < 0:
        raise errors.SegmentCorrupt("a result's list of handed-over blocks is damaged")
    offs = struct.unpack_from(f"<{n}Q", payload, start)
    taken: list[int] = []
    _arena.log_handoffs(taken)
    try:
        return loads(memoryview(payload)[:start])
    except BaseException:
        for off in offs:
            if off in taken:
                taken.remove(off)
            else:
                arena.unref_for(src, off)
        raise
    finally:
        _arena.log_handoffs(None)


def encode_args(
    obj: Any, args: Any, kwargs: dict, arena: Any = None, keep: list | None = None
) -> bytes:
    """Pickles a call's arguments (obj: args, (args, kwargs) or a map chunk's items).

    With ``arena``, arrays travel as descriptors (see ``encode``).  Raises
    SerializationError naming the argument that cannot be pickled."""
    try:
        return encode(obj, arena, keep)
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


_FRAME = re.compile(r'^  File "(.+)", line (\d+), in ')


def with_source(tb: str) -> str:
    """A worker's traceback text with the source lines it lacked filled in from this
    process's linecache: code from a notebook cell or the REPL has no file the worker could
    read, but the parent's linecache holds it (IPython registers every cell there)."""
    lines = tb.splitlines(keepends=True)
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        m = _FRAME.match(line)
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
        return encode(init_call, arena, keep)
    except errors.FastPoolError:
        raise
    except Exception as exc:
        raise errors.SerializationError("initargs", f"{type(exc).__name__}: {exc}") from exc
