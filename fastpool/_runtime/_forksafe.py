"""Whether this process may fork the worker template, and what a forked child cleans up.

Forking is safe when the process runs one thread at the instant of ``fork()``: no
other thread can then hold a lock (malloc's, the import lock, a logging handler's)
that the child would inherit held. CPython 3.12+ checks the kernel's thread count
right after ``fork()`` and warns when it is above one.

NumPy's OpenBLAS (its pthreads build, what the wheels ship) starts ``ncpu - 1`` pool
threads at import, so a parent that imported NumPy is never single-threaded before a
fork. OpenBLAS handles fork itself: at load it registers
``pthread_atfork(blas_thread_shutdown_, NULL, blas_memory_init)`` (OpenBLAS
``driver/others/memory.c``, ``openblas_fork_handler``), so every ``fork()`` first joins
those threads, and the next BLAS call that wants them starts them again
(``blas_thread_init`` when ``blas_server_avail == 0``, ``driver/others/blas_server.c``).
What we assume is only that: a pthreads OpenBLAS (``openblas_get_parallel() == 1``)
stops its pool in its prepare handler. What we check, rather than assume, is the
result: ``fork_checked`` forks, then asks the kernel how many threads the parent has
left, and records CPython's warning instead of showing it. One thread means the child
was born alone; anything else (an OpenMP or MKL pool, faulthandler's watchdog, any
native thread) and the caller kills the child before it does anything and spawns a
template instead.

A forked template holds the parent's Python objects, and some of them wrap file
descriptors (a logging FileHandler's stream, a socket). ``neutralise_inherited``
points every inherited descriptor number at /dev/null rather than closing it: a stale
object then writes nowhere, and the number is never handed out again, so a worker's
shared-memory mappings can never receive a stale handler's text.
It also drops the logging handlers and std streams that wrote to those descriptors.

Linux only (/proc); every reader degrades to "do not fork". Not thread-safe: called
from the one thread a forking process has.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable

from fastpool._runtime._blas import BLAS_THREAD_VARS

_OPENBLAS_PREFIXES = ("openblas", "scipy_openblas")
_OPENBLAS_SUFFIXES = ("", "64_", "_64", "_64_")
# The thread-pool libraries besides OpenBLAS, by file-name prefix, each with the call that
# sets its thread count: threadpoolctl's controllers name the same files and calls. The
# template calls them itself, through ctypes: importing threadpoolctl and letting it probe
# every mapped library took 8-16 ms of a forked template's start with scikit-learn's
# libgomp loaded (measured), and the first pool's constructor waits for that start.
_POOL_SETTERS = (
    (("libgomp", "libiomp", "libomp"), "omp_set_num_threads"),
    (("libmkl_rt", "mkl_rt"), "MKL_Set_Num_Threads"),
    (("libblis",), "bli_thread_set_num_threads"),
    (("libflexiblas",), "flexiblas_set_num_threads"),
)
BLAS_VARS = BLAS_THREAD_VARS


def os_threads() -> int:
    """Threads of this process as the kernel counts them, native ones included: field 20
    of /proc/self/stat, what CPython 3.12+ reads after fork (about 50 us)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[17])  # fields from the 3rd on
    except (OSError, ValueError, IndexError):
        return 1 << 30


def rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 1 << 62


def mapped_libraries() -> list[str]:
    """Paths of the shared libraries mapped into this process, in map order."""
    seen: dict[str, None] = {}
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                i = line.find("/")
                if i >= 0 and ".so" in line:
                    seen.setdefault(line[i:].rstrip("\n"), None)
    except OSError:
        return []
    return list(seen)


def _openblas_call(lib: Any, name: str) -> Any:
    for prefix in _OPENBLAS_PREFIXES:
        for suffix in _OPENBLAS_SUFFIXES:
            fn = getattr(lib, f"{prefix}_{name}{suffix}", None)
            if fn is not None:
                return fn
    return None


def openblas_pools(libs: list[str] | None = None) -> list[Any]:
    """ctypes handles on the loaded OpenBLAS builds that run their own pthreads pool
    (``openblas_get_parallel() == 1``, the ones that stop it at fork); never loads one."""
    if libs is None:
        libs = mapped_libraries()
    paths = [p for p in libs if "openblas" in os.path.basename(p).lower()]
    if not paths:
        return []
    import ctypes  # NumPy has imported it already

    out = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        except OSError:
            continue
        parallel = _openblas_call(lib, "get_parallel")
        if parallel is not None and parallel() == 1:
            out.append(lib)  # 0: sequential, no threads; 2: OpenMP, threads it does not stop
    return out


def fork_candidate(libs: list[str] | None = None) -> bool:
    """Whether a fork now may leave the child alone: no Python thread besides this one
    (any of them may hold any lock at any moment), and either no other thread at all or
    a pthreads OpenBLAS whose fork handler may account for the others.  ``libs``: this
    process's mapped_libraries() if the caller has read them already."""
    import threading

    if threading.active_count() != 1:
        return False
    return os_threads() == 1 or bool(openblas_pools(libs))


def fork_checked() -> tuple[int, bool]:
    """``os.fork()``; in the parent, also whether this process ran one thread at the
    fork (CPython 3.12+'s warning recorded, not shown, and the kernel's count read again:
    OpenBLAS's pool is still stopped here, since its fork handler restarts nothing in
    the parent). In the child: ``(0, True)``."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        return 0, True
    alone = os_threads() == 1
    for w in caught:
        if issubclass(w.category, DeprecationWarning) and "fork" in str(w.message):
            alone = False
        else:  # not ours to swallow
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return pid, alone


def blas_threads_chosen() -> bool:
    """Whether the user set a thread count for some BLAS or OpenMP library."""
    return any(v in os.environ for v in BLAS_VARS)


def exported_count(lib: Any) -> Any:
    """The C int in which ``lib`` (an OpenBLAS) keeps its thread count
    (``blas_cpu_number``, a ctypes ``c_int``), where the build exports it and it agrees
    with ``openblas_get_num_threads``; None otherwise (NumPy 2.5's OpenBLAS 0.3.34 hides
    it)."""
    import ctypes

    get = _openblas_call(lib, "get_num_threads")
    if get is None:
        return None
    try:
        cell = ctypes.c_int.in_dll(lib, "blas_cpu_number")
    except ValueError:  # not exported by this build
        return None
    return cell if cell.value == get() else None


def pin_openblas(
    n: int, libs: list[str] | None = None
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Around the template's fork: every pthreads OpenBLAS runs ``n`` threads in the
    child, and keeps its count in the parent.  Returns ``(in_child, restore)``: the
    child calls the first at once after the fork, the parent the second.

    The template must fork its workers single-threaded, so it never starts an OpenBLAS
    pool: ``openblas_set_num_threads`` there would start one.  Where a build exports
    its count (``blas_cpu_number``, read back through ``openblas_get_num_threads``
    before it is trusted), the child writes ``n`` there and the parent is left alone:
    the fork stopped its pool, and its next BLAS call starts it again, as after any
    fork.  Otherwise the parent sets ``n`` before the fork and its count back after,
    which restarts its pool at once, and each new OpenBLAS thread then spins about
    0.1 s waiting for work (measured: 100 ms of CPU per thread, taken from the first
    pool's starting workers on a small machine)."""

    cells, saved = [], []
    for lib in openblas_pools(libs):
        get, set_ = _openblas_call(lib, "get_num_threads"), _openblas_call(lib, "set_num_threads")
        if get is None or set_ is None:
            continue
        cell = exported_count(lib)
        if cell is not None:
            cells.append(cell)
        else:
            saved.append((set_, get()))
            set_(n)

    def in_child() -> None:
        for cell in cells:
            cell.value = n

    def restore() -> None:
        for setter, count in saved:
            setter(count)

    return in_child, restore


def flush_std_streams() -> None:
    """Before fork: text buffered in sys.stdout would otherwise be written twice."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass


def limit_blas_threads(libs: list[str] | None = None) -> None:
    """In the template: one BLAS/OpenMP thread per worker unless the user set a count, so
    workers x BLAS threads never oversubscribe the CPUs. The environment covers
    libraries not loaded yet; a forked template sets the loaded OpenMP, MKL, BLIS and
    FlexiBLAS pools to one thread (OpenBLAS was set around the fork: see pin_openblas).
    A library without its call, or one that refuses it, keeps its count: the
    environment variables still apply to what it starts later."""
    user_set = blas_threads_chosen()
    for var in BLAS_VARS:
        os.environ.setdefault(var, "1")
    if user_set:
        return
    if libs is None:  # a forked template passes the list its parent read just before the fork
        libs = mapped_libraries()
    for path in libs:
        name = os.path.basename(path).lower()
        call = next((c for prefixes, c in _POOL_SETTERS if name.startswith(prefixes)), None)
        if call is not None:
            _call_loaded(path, call, 1)


def _call_loaded(path: str, name: str, arg: int) -> None:
    """Calls ``name(arg)`` in the shared library at ``path`` if this process has it
    loaded and it exports that name; never loads a library (RTLD_NOLOAD)."""
    import ctypes

    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD)
        fn = getattr(lib, name)
    except (OSError, AttributeError):  # unloaded since the maps were read, or no such call
        return
    fn.argtypes, fn.restype = [ctypes.c_int], None
    fn(arg)


def neutralise_inherited(keep: set[int]) -> set[int]:
    """In a freshly forked child: every inherited fd from 3 up, except ``keep``, now
    refers to /dev/null (closing the parent's sockets and pipes as far as this process is
    concerned), and the std streams and logging handlers that wrote to one are dropped.
    Returns the descriptor numbers it replaced."""
    try:
        fds = sorted(int(name) for name in os.listdir("/proc/self/fd"))
    except OSError:
        fds = list(range(3, 1024))  # no /proc: the common range
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    replaced = set()
    for fd in fds:
        if fd < 3 or fd in keep or fd == null:
            continue
        try:
            os.dup2(null, fd, inheritable=False)
        except OSError:
            continue
        replaced.add(fd)
    os.close(null)
    _drop_stale_streams(replaced)
    return replaced


def run_multiprocessing_after_fork() -> None:
    """In a freshly forked child, after ``neutralise_inherited``: what multiprocessing runs
    in every child it starts (``BaseProcess._after_fork``), for the objects this process
    inherited from a parent that used multiprocessing. A manager proxy's cached
    connection is dropped (the next call opens its own, with the shared authkey), a
    ``ForkAwareLocal`` is emptied, a ``SemLock``'s recursion count reset; the parent's
    finalizers are forgotten (they would not run here anyway: each checks its pid).

    Each live proxy also takes a reference on its manager here, as a forked
    multiprocessing child's does; a template never exits through Python's atexit, so
    that reference is given back when the manager shuts down, not before. Nothing to do
    when the parent never imported multiprocessing."""
    util = sys.modules.get("multiprocessing.util")
    if util is None:
        return
    util._finalizer_registry.clear()
    util._run_after_forkers()


def _uses(obj: Any, fds: set[int]) -> bool:
    try:
        return obj is not None and obj.fileno() in fds
    except (AttributeError, OSError, ValueError):  # closed, or not backed by a descriptor
        return False


def _drop_stale_streams(fds: set[int]) -> None:
    for name in ("stdout", "stderr"):
        if _uses(getattr(sys, name, None), fds):
            setattr(sys, name, getattr(sys, f"__{name}__"))
    logging = sys.modules.get("logging")
    if logging is not None:
        loggers = [logging.getLogger()]
        loggers += [
            lg
            for lg in list(logging.Logger.manager.loggerDict.values())
            if isinstance(lg, logging.Logger)
        ]
        for logger in loggers:
            for handler in list(logger.handlers):
                if any(
                    _uses(getattr(handler, attr, None), fds)
                    for attr in ("stream", "sock", "socket")
                ):
                    logger.removeHandler(
                        handler
                    )  # not closed: that would close a /dev/null fd we hold
    import faulthandler

    if faulthandler.is_enabled():  # it may have written to one of them (pytest's does)
        try:
            faulthandler.enable(file=sys.__stderr__, all_threads=True)
        except (AttributeError, OSError, ValueError, RuntimeError):
            faulthandler.disable()
