"""Arrays across processes: the descriptor, both of its ends, transfer(), the handoff
trailer and the worker's NumPy hook glue, beside the arena (fastpool/_native/_arena.pyx).

With an arena (the pool's shared memory), ``ArrayPickler`` sends an ndarray as a
``Descriptor`` instead of its bytes, and ``rebuild`` turns the same ``Descriptor`` back
into a view of the block in the receiver's own mapping:

    arena-backed array or any view of it -> descriptor, zero bytes copied
    a worker's result NumPy made in its   -> descriptor, zero bytes copied, when only the
    region (fastpool/_native/_alloc.pyx)     result holds it (else copied: the worker may
                                             change what it kept)
    an array NumPy made in the parent     -> descriptor, zero bytes copied, as pool.empty's
    within ``with pool.arrays()``            (ArraysContext; the task sees the same bytes)
    plain array >= OOB_THRESHOLD_BYTES   -> one copy into a fresh block of the
                                            sender's region, then a descriptor
    a subclass NumPy pickles as an array -> as a plain array, rebuilt as its class
    (np.matrix, np.recarray, np.memmap)     (what its pickle would rebuild: the same class
                                            over the same bytes)
    object dtype, small, other subclasses -> pickled as before (inline in the ring): a
    (np.ma.MaskedArray: its own __reduce__)  MaskedArray keeps its mask
    array of another (or a closed) pool  -> treated as a plain array: one copy
    the same array in a map's chunks     -> one copy for all of them (CopyMemo)

A pickle too large for a ring record (a call's, a result's) crosses the same way: its
bytes in a block, a ``Spilled`` stub in the ring (``spill``, ``unspill``).

The block must outlive the trip.  Parent to worker: the parent keeps a call's blocks
in ``keep`` (the future holds them until it settles).  Worker to parent: the worker
adds one reference per descriptor (a handoff) and appends their offsets to the result
(the trailer, ``Handed``); the parent drops them all once it holds its own
references, whether or not the result could be decoded (``decode_result``).

    worker: encode_result(r) -> (payload + trailer, Handed) ---ring---> parent:
            Handed.release() if the ring refused it                     decode_result(payload)
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import weakref
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, TypeVar

from fastpool import errors

if TYPE_CHECKING:
    from numpy.typing import NDArray

A = TypeVar("A", bound="NDArray[Any]")  # transfer() hands back the array it was given

PROTOCOL = 5
OOB_THRESHOLD_BYTES = 64 << 10  # smaller plain arrays travel inline: a block costs a page
TRANSFERRED = "transferred"  # marker in a call's keep list: the task holds detached buffers
NUMPY_HOOK_ENV = "FASTPOOL_NUMPY_HOOK"  # "0": a worker's NumPy allocates with malloc only

_ATOMIC = frozenset((int, float, str, bytes, bool, type(None), complex))
_transfer_marks: dict[int, Any] = {}  # id(array) -> weakref, set by transfer()
_PROCESS_ARENA: list[Any] = [None]  # a worker's own arena (results are encoded into it)
_HOOK_PENDING = [False]  # a worker whose hook waits for numpy to be imported
_ndarray_type: Any = None


def _np_ndarray() -> Any:
    global _ndarray_type
    if _ndarray_type is None and "numpy" in sys.modules:
        _ndarray_type = sys.modules["numpy"].ndarray
    return _ndarray_type


def is_ndarray(x: Any) -> bool:
    """True for a plain ndarray with at least one dimension, without importing NumPy."""
    nd = _np_ndarray()
    return nd is not None and type(x) is nd and x.ndim >= 1


def array_bytes(chunk: Any) -> int:
    """The bytes of the ndarrays in a map's chunk: the chunk itself, its items, or
    the items' arguments (a chunk of a map over several iterables holds tuples).
    0 for packed numbers, and for a chunk whose first item carries no ndarray: a
    chunk of many small items is not walked (what it costs is its pickle's size).  The
    items after the first may be anything a map takes (None, a number, a tuple)."""
    nd = _np_ndarray()
    if nd is None:
        return 0
    if type(chunk) is nd:
        return int(chunk.nbytes)
    if (type(chunk) is not list and type(chunk) is not tuple) or not chunk:
        return 0
    first = chunk[0]
    if type(first) is tuple:
        if not any(type(x) is nd for x in first):
            return 0
        return sum(x.nbytes for item in chunk if type(item) is tuple for x in item if type(x) is nd)
    if type(first) is not nd:
        return 0
    return sum(x.nbytes for x in chunk if type(x) is nd)


# ---------------------------------------------------------------------------------
# The descriptor: what the sender writes and the receiver reads, one type.


class Descriptor(NamedTuple):
    """An array in a pool's arena, named so that any process of that pool can map it."""

    token: int  # the arena's token: which pool's shared memory
    off: int  # the block's header offset in the arena
    gen: int  # the block's generation: a reused block is refused, not mapped
    byte_off: int  # where the array's first element sits in the block's data
    dtype: Any
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    readonly: bool
    subtype: Any = None  # an ndarray subclass to rebuild (see exact_subclass); None: ndarray

    def wire(self) -> tuple[Any, tuple[Any, ...]]:
        """The pickle reduction: the receiver calls ``rebuild(*self)``."""
        return rebuild, tuple(self)


def rebuild(*fields: Any) -> NDArray[Any]:
    """Unpickles a Descriptor: a view of its block from this process's own mapping,
    holding this process's own reference.

    Raises SharedMemoryError when this process has no open arena of that token (a
    pool that is shut down, or another pool), and SegmentCorrupt (or RegionCorrupt)
    when the block's header does not check out."""
    from fastpool._native import _arena

    d = Descriptor(*fields)
    arena = _arena.lookup(d.token)
    if arena is None:
        raise errors.SharedMemoryError(
            "this array lives in the shared memory of a pool that is shut down, or of another "
            "pool than the one this process serves; pass it by value (np.array(arr)) instead"
        )
    blk = arena.ref(d.off, d.gen, d.readonly)
    import numpy

    cls = numpy.ndarray if d.subtype is None else d.subtype
    arr = numpy.ndarray.__new__(
        cls, d.shape, d.dtype, buffer=blk, offset=d.byte_off, strides=d.strides
    )
    if d.readonly:
        arr.flags.writeable = False
    return arr


def exact_subclass(cls: type) -> bool:
    """True for an ndarray subclass that pickles as NumPy pickles an array (np.matrix,
    np.recarray, np.memmap): unpickling rebuilds the class over the bytes alone, so a
    view of shared memory rebuilt as that class is exactly what its pickle would give.
    A class with its own pickling (np.ma.MaskedArray: the mask, the fill value) is not."""
    nd = _np_ndarray()
    return (
        cls.__reduce_ex__ is nd.__reduce_ex__
        and cls.__reduce__ is nd.__reduce__
        and cls.__setstate__ is nd.__setstate__
    )


def block_of(arr: Any) -> Any:
    """The arena block under ``arr`` (or under the array it views), or None."""
    return _block_of(arr)


def _block_of(arr: Any) -> Any:
    from fastpool._native._arena import Block

    nd = _np_ndarray()
    b = arr.base
    while isinstance(b, nd):
        b = b.base
    return b if isinstance(b, Block) else None


# ---------------------------------------------------------------------------------
# transfer(): a sender's handle given up with the call or result it travels in.


def transfer(arr: A) -> A:
    """Marks a shared array as handed to the next task (or result) it is sent with.

    Once that call is submitted (or that result returned), this handle is detached:
    indexing, ufuncs and NumPy functions, repr, len, iteration, copy/astype/tolist/
    tobytes, and sending it again raise ``DetachedBufferError``; any other path sees
    a zero-length read-only array, never the task's bytes.  A task holding
    transferred buffers is never retried automatically.  Views and buffer exports
    (``arr[2:]``, ``memoryview(arr)``, ``np.frombuffer(arr)``) taken before the
    transfer are separate handles: they stay valid memory and keep the block from
    being reused while they live, and they see what the task writes.  Returns ``arr``.
    An array made within ``pool.arrays()`` counts as shared memory (its root is turned
    into a view of its block first).  Raises TypeError for an array that is not a
    view of a pool's shared memory, or a 0-d one.  Thread-safe for distinct arrays."""
    nd = _np_ndarray()
    if nd is not None and type(arr) is __getattr__("DetachedArray"):
        raise errors.DetachedBufferError("this array was already transferred to a task")
    if nd is not None and isinstance(arr, nd) and _block_of(arr) is None:
        _rebase_root(arr, nd)
    if nd is None or not isinstance(arr, nd) or _block_of(arr) is None:
        raise TypeError(
            "fastpool.transfer() takes an array from pool.empty/zeros/share (or a view "
            f"of one), not {type(arr).__name__}; plain arrays are copied anyway"
        )
    if arr.ndim == 0:
        raise TypeError("fastpool.transfer() needs an array with at least one dimension")
    _transfer_marks[id(arr)] = weakref.ref(arr, lambda _r, k=id(arr): _transfer_marks.pop(k, None))
    return arr


def _rebase_root(arr: Any, nd: Any) -> None:
    # An array NumPy made in the arena (pool.arrays()) owns its bytes; detaching needs
    # a Block under it, like pool.empty's arrays have.
    _alloc = sys.modules.get("fastpool._native._alloc")
    root = arr
    while isinstance(root.base, nd):
        root = root.base
    if _alloc is not None and root.base is None:
        _alloc.rebase(root)


def _detached(*_a: Any, **_k: Any) -> Any:
    raise errors.DetachedBufferError(
        "this array was transferred to a task with fastpool.transfer(); use the array the task "
        "returns (or a copy taken before the transfer)"
    )


_DETACHED_METHODS = (
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
)


def _make_detached_type() -> type:
    import numpy as np

    from fastpool._native import _ndarray

    ns: dict[str, Any] = {"__slots__": ()}
    for name in _DETACHED_METHODS:
        ns[name] = _detached
    cls = type("DetachedArray", (np.ndarray,), ns)
    _ndarray.plain_instances(cls)  # same layout as ndarray, so detach() may swap the type in
    return cls


class _LazyDetached:
    cls: Any = None


def __getattr__(name: str) -> Any:
    if name == "DetachedArray":
        if _LazyDetached.cls is None:
            _LazyDetached.cls = _make_detached_type()
        return _LazyDetached.cls
    raise AttributeError(name)


# ---------------------------------------------------------------------------------
# The sender's end.


class CopyMemo(dict):
    """id(array) -> (array, its copy in the arena), shared by the calls that pass it to
    ``encode`` (a map's chunks: one copy of an array bound into every task of a map).
    One map owns one (``_mapper.MapRun.memo``) while it still submits chunks, never a
    later map: an array changed between two maps of the same function is copied again.
    Each call that used it holds it in its keep list, so the copies live until the last
    of them settles.  It keeps only the copies the last call used (``encode`` prunes
    the rest): ``used`` collects them over that call's pickles, nested ones included
    (a function pickled by value inside the call's arguments), ``depth`` tells the
    outermost."""

    __slots__ = ("used", "depth")

    def __init__(self) -> None:
        super().__init__()
        self.used: set[int] = set()
        self.depth = 0


class CarriesArrays(Exception):
    """A probing pickler (``ArrayPickler.probe``) met an array that would cross
    through shared memory: what it pickles must travel with an arena (a call's
    function that holds one rides in the call, see ``_codec.function_bytes``)."""


class ArrayPickler(pickle.Pickler):
    """Pickles ndarrays as Descriptors into ``arena`` (see the module docstring); with
    no arena, as NumPy pickles them, or, with ``probe``, raises CarriesArrays at the
    first array that an arena would have taken.  The codec's call pickler builds on
    ``reduce_array``."""

    probe = False

    def __init__(
        self,
        file: Any,
        arena: Any,
        keep: list | None,
        handoff: bool,
        owned: Any = None,
        memo: CopyMemo | None = None,
    ) -> None:
        super().__init__(file, PROTOCOL)
        self.arena = arena
        self.keep = keep
        self.handoff = handoff
        self.owned = owned  # ids of NumPy-hook arrays only the result holds: sent without a copy
        # id(array) -> (array, its copy in the arena): one copy per array for every call
        # that shares the memo (the chunks of one map: see CopyMemo)
        self.copies = memo
        self.handed: list[int] = []  # offsets of blocks this worker added a reference to
        self.detach: list = []

    def reducer_override(self, obj: Any) -> Any:
        return self.reduce_array(obj)

    def reduce_array(self, obj: Any) -> Any:
        """An ndarray's reduction to a Descriptor; NotImplemented for anything else
        (and for an array pickled as it is: no arena, small, object dtype)."""
        nd = _np_ndarray()
        if nd is None or not isinstance(obj, nd):
            return NotImplemented
        cls = type(obj)
        if cls is __getattr__("DetachedArray"):
            _detached()
        if cls is not nd and not (exact_subclass(cls) and id(obj) not in _transfer_marks):
            return NotImplemented
        arena = self.arena
        if arena is None:
            if self.probe and not obj.dtype.hasobject and obj.nbytes >= OOB_THRESHOLD_BYTES:
                raise CarriesArrays()
            return NotImplemented
        from fastpool._native import _arena, _ndarray

        root = obj
        while isinstance(root.base, nd):
            root = root.base
        blk = root.base if isinstance(root.base, _arena.Block) else None
        # (object arrays: NumPy zero-fills them through calloc, which the hook leaves to
        # malloc; the dtype check keeps this process's pointers from crossing regardless)
        if blk is None and not root.dtype.hasobject:
            blk = _adopt(root, arena, self.owned)
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
            memo = self.copies
            hit = memo.get(id(obj)) if memo is not None else None
            if hit is not None and hit[0] is obj:
                dst = hit[1]
            else:
                dst = _ndarray.copy_in(arena, obj)  # the one copy: straight into shared memory
                if memo is not None:
                    memo[id(obj)] = (obj, dst)
            if memo is not None:
                memo.used.add(id(obj))
            blk = dst.base
            byte_off = _ndarray.address_of(dst) - blk.address
            strides, readonly = dst.strides, not obj.flags.writeable
        else:
            byte_off = _ndarray.address_of(obj) - blk.address
            strides, readonly = obj.strides, (not obj.flags.writeable) or blk.readonly
            if transferring:
                self.detach.append(obj)
        if self.handoff:
            arena.handoff(blk)
            self.handed.append(blk.off)  # an offset: a Block would pin its block
        elif self.keep is not None:
            self.keep.append(blk)
        desc = Descriptor(
            arena.token,
            blk.off,
            blk.gen,
            byte_off,
            obj.dtype,
            obj.shape,
            strides,
            readonly,
            None if cls is nd else cls,
        )
        return desc.wire()


def _adopt(root: Any, arena: Any, owned: Any) -> Any:
    # A Block on the arena block NumPy's hook made root in (no copy), or None.  The
    # parent's (pool.arrays()) are sent like pool.empty's; a worker's only when the
    # result alone holds them (owned), since the worker may change what it keeps.
    _alloc = sys.modules.get("fastpool._native._alloc")  # never loaded: no hook arrays
    if _alloc is None or not root.flags.owndata:
        return None
    if arena.proc == 0:
        return _alloc.adopt(root, arena)
    if owned is not None and id(root) in owned:
        return _alloc.adopt(root)
    return None


def encode(
    obj: Any,
    arena: Any,
    keep: list | None = None,
    handoff: bool = False,
    owned: Any = None,
    pickler: Callable[..., ArrayPickler] | None = None,
    memo: CopyMemo | None = None,
) -> tuple[bytes, list[int]]:
    """Pickles obj with arrays as Descriptors into arena (plain pickle when arena is None
    and no ``pickler`` class is given: the codec passes its call pickler).

    Returns the pickle and the offsets of the blocks handed off (``handoff``: one
    reference each, added for the receiver).  ``keep`` collects the blocks that must
    live until the receiver has mapped them, plus TRANSFERRED when obj carried
    transferred arrays; those are detached here, after the pickle succeeded.
    Raises what pickling raises; nothing is detached nor handed off then."""
    if arena is None and pickler is None:
        return pickle.dumps(obj, PROTOCOL), []
    buf = io.BytesIO()
    p = (pickler or ArrayPickler)(buf, arena, keep, handoff, owned, memo)
    kept = len(keep) if keep is not None else 0
    if memo is not None:
        memo.depth += 1
    try:
        p.dump(obj)
    except BaseException:
        for off in p.handed:
            arena.unref_for(arena.proc, off)
        if keep is not None:
            del keep[kept:]  # the blocks copied for a pickle that failed: freed now
        raise
    finally:
        if memo is not None:
            memo.depth -= 1
    if memo is not None and memo.depth == 0:
        # The memo keeps only what this call used: an array in every chunk of a map (in its
        # function, or repeated in its items) stays one copy, while a map of distinct arrays
        # (slices of one big array) holds no more copies than the chunks in flight do.
        # Keeping every copy until the map ended held the whole batch in shared memory: the
        # 2 GiB batch of 32 slices peaked at +2,755 MiB, against +834 with none kept.
        for key in [k for k in memo if k not in memo.used]:
            del memo[key]
        memo.used.clear()
    if p.detach:
        from fastpool._native import _ndarray

        det = __getattr__("DetachedArray")
        for arr in p.detach:
            _transfer_marks.pop(id(arr), None)
            _ndarray.detach(arr, det)
        if keep is not None:
            keep.append(TRANSFERRED)
    return buf.getvalue(), p.handed


# ---------------------------------------------------------------------------------
# A pickle too large for one ring record travels in a block of the arena.


class Spilled:
    """A pickle that did not fit a ring record, in an arena block: what crosses the ring
    is this, a few dozen bytes, and unpickling it unpickles the pickle from the block."""

    __slots__ = ("token", "off", "gen", "nbytes")

    def __init__(self, token: int, off: int, gen: int, nbytes: int) -> None:
        self.token, self.off, self.gen, self.nbytes = token, off, gen, nbytes

    def __reduce__(self) -> Any:
        return unspill, (self.token, self.off, self.gen, self.nbytes)


def spill(payload: bytes, arena: Any, keep: list | None, handed: list[int] | None) -> bytes:
    """payload copied into a fresh block of arena; returns the small pickle that stands
    for it.  The block is kept alive in ``keep`` (a call: until it settles), or handed
    off (a result: one reference for the parent, its offset appended to ``handed``).
    Raises SharedMemoryError when the arena cannot hold it."""
    blk = arena.alloc(len(payload))
    memoryview(blk)[: len(payload)] = payload
    if handed is not None:
        arena.handoff(blk)
        handed.append(blk.off)
    elif keep is not None:
        keep.append(blk)
    return pickle.dumps(Spilled(arena.token, blk.off, blk.gen, len(payload)), PROTOCOL)


def unspill(token: int, off: int, gen: int, nbytes: int) -> Any:
    """Unpickles a Spilled pickle from its block, through this process's own reference.
    The length it names is checked against the block's, as this process read it once
    (Arena.ref), so a forged one fails here: SegmentCorrupt; SharedMemoryError as
    ``rebuild`` raises it."""
    from fastpool._native import _arena

    arena = _arena.lookup(token)
    if arena is None:
        raise errors.SharedMemoryError(
            "a spilled pickle names the shared memory of a pool this process does not serve"
        )
    blk = arena.ref(off, gen, True)
    if not 0 <= nbytes <= blk.nbytes:
        raise errors.SegmentCorrupt(
            f"a spilled pickle of {nbytes} bytes does not fit its block of {blk.nbytes}"
        )
    with memoryview(blk) as view:
        return pickle.loads(view[:nbytes])


# ---------------------------------------------------------------------------------
# The handoff trailer: a worker's result, and the blocks it handed the parent.

_HANDOFFS = struct.Struct("<II")  # trailer end: how many offsets, and a magic
_HANDOFFS_MAGIC = 0x46504844  # "FPHD"


class Handed:
    """The references a worker handed over with one result, until the parent has them."""

    __slots__ = ("arena", "offsets")

    def __init__(self, arena: Any, offsets: list[int]) -> None:
        self.arena, self.offsets = arena, offsets

    def release(self) -> None:
        """Takes them back: the result will never reach the parent (it did not fit the ring)."""
        offsets, self.offsets = self.offsets, []
        for off in offsets:
            self.arena.unref_for(self.arena.proc, off)


def encode_result(result: Any, owned: Any = None, spill_at: int = 0) -> tuple[bytes, Handed | None]:
    """A worker's result: large arrays into its own region, handed off to the parent.

    ``owned``: ids of the NumPy-hook arrays only ``result`` holds (_alloc.owned_roots);
    they are sent as they are, every other array is copied.  A payload over
    ``spill_at`` bytes (the ring's record limit; 0: none) goes into a block of the
    region too (``spill``).  Returns the payload and, when it handed blocks over, a
    Handed: the payload then ends with the trailer (their offsets, so the parent can
    take them back even if it cannot decode the result)."""
    if _HOOK_PENDING[0]:
        _install_hook()
    arena = None if type(result) in _ATOMIC else _PROCESS_ARENA[0]
    payload, offs = encode(result, arena, None, True, owned)
    return _with_trailer(payload, offs, spill_at)


def spill_result(payload: bytes, spill_at: int) -> tuple[bytes, Handed | None]:
    """A worker's pickled result as ``encode_result`` returns it, spilled when it is
    over ``spill_at`` bytes (a plain value the serving loop pickled itself)."""
    return _with_trailer(payload, [], spill_at)


def _with_trailer(payload: bytes, offs: list[int], spill_at: int) -> tuple[bytes, Handed | None]:
    arena = _PROCESS_ARENA[0]
    if spill_at and arena is not None and len(payload) + 8 * len(offs) + 16 > spill_at:
        payload = spill(payload, arena, None, offs)
    if not offs:
        return payload, None
    trailer = struct.pack(f"<{len(offs)}Q", *offs) + _HANDOFFS.pack(len(offs), _HANDOFFS_MAGIC)
    return payload + trailer, Handed(arena, offs)


def decode_result(payload: bytes, arena: Any, src: int) -> Any:
    """The parent's decoding of a result that carries a handoff trailer, from worker
    process ``src`` of ``arena``.  The worker's handoff references are dropped once
    decoding ends, however it ends, so no block stays pinned: the arrays rebuilt hold
    this process's own references by then.  Raises what unpickling raises, and
    SegmentCorrupt for a trailer that does not hold."""
    end = len(payload) - _HANDOFFS.size
    n, magic = _HANDOFFS.unpack_from(payload, end) if end >= 0 else (0, 0)
    start = end - 8 * n
    if magic != _HANDOFFS_MAGIC or start < 0:
        raise errors.SegmentCorrupt("a result's list of handed-over blocks is damaged")
    offs = struct.unpack_from(f"<{n}Q", payload, start)
    try:
        return pickle.loads(memoryview(payload)[:start])
    finally:
        for off in offs:
            arena.unref_for(src, off)


# ---------------------------------------------------------------------------------
# The parent's NumPy hook: pool.arrays().


class ArraysContext:
    """``with pool.arrays():`` NumPy arrays of at least 1 MiB made in this thread's
    context are born in the pool's shared memory (fastpool/_native/_alloc.pyx).

    Re-entrant and reusable; each ``with`` gives the context back the handler it found.
    """

    __slots__ = ("_arena", "_hook", "_saved")

    def __init__(self, arena: Any) -> None:
        self._arena = arena
        self._hook: Any = None  # the arena's hook, kept while this context may enter it
        self._saved: list[Any] = []

    def __enter__(self) -> ArraysContext:
        from fastpool._native import _alloc

        try:
            self._hook, previous = _alloc.enter(self._arena)
        except ValueError:  # closed between the pool's check and here
            raise errors.PoolClosed(
                "this pool was shut down: its shared memory takes no new arrays"
            ) from None
        self._saved.append(previous)
        return self

    def __exit__(self, *_exc: Any) -> None:
        from fastpool._native import _alloc

        _alloc.leave(self._saved.pop())

    def stats(self) -> dict[str, int]:
        """``live``: arrays of this pool made by the hook in this process and alive now;
        ``served``: arrays it ever made; ``fallbacks``: large arrays it left to NumPy
        (the arena full or closed, a thread without the GIL, a forked child)."""
        if self._hook is None:
            return {"live": 0, "served": 0, "fallbacks": 0}
        s = self._hook.stats()
        return {k: s[k] for k in ("live", "served", "fallbacks")}


# ---------------------------------------------------------------------------------
# The worker's arena and NumPy hook.


def process_arena() -> Any:
    """This worker's own arena (None in the parent or before attach)."""
    return _PROCESS_ARENA[0]


def trim_process_arena(warm_bytes: int = 0) -> bool:
    """Gives back the pages of this process's freed arena blocks beyond its warm
    reserve plus ``warm_bytes`` (Arena.trim).  True while blocks of its region are
    still live, which a later trim may give back once they are freed; False with no
    arena."""
    arena = process_arena()
    if arena is None:
        return False
    from fastpool._native._arena import TRIM_RESERVE_BYTES

    return bool(arena.trim(TRIM_RESERVE_BYTES + warm_bytes)[1])


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
        except (RuntimeError, MemoryError) as exc:  # another NEP 49 handler: results are copied
            import logging

            logging.getLogger("fastpool").warning(
                "fastpool: NumPy arrays are not made in shared memory: %s", exc
            )
