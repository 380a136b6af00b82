"""The template: a pre-warmed, single-threaded process that forks workers.

    parent process                         template (one per parent, numpy imported)
    --------------                         -------------------------------------------
    Template.connect() --ctl socket-------> accepts one SEQPACKET connection per pool
    pool conn: ("spawn", req, slot) + fd -> fork(); child runs _worker.main(board, slot)
              <- ("pid", req, pid) + pidfd
              <- ("exit", pid, exitcode)     SIGCHLD -> waitpid -> report

Why: forking the parent is unsafe while it runs threads (the pool itself runs
threads), and spawning a fresh interpreter costs ~100 ms of imports per
worker.  The template is started once with subprocess (safe with threads),
imports numpy once, and forks a ready worker in about a millisecond.

Leftovers cannot outlive the parent: the template runs in its own session,
kills every worker when the parent's socket reaches EOF, and each worker has
PR_SET_PDEATHSIG=SIGKILL on the template.  The template lives as long as its
parent process (like multiprocessing's forkserver); ``shutdown_template()``
ends it early.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import os
import pickle
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

_MAX_MSG = 1 << 16
_PR_SET_PDEATHSIG = 1
ENV_FLAG = "FASTPOOL_TEMPLATE"
BOOTING = False  # True while the template runs the parent's main script


def _send(sock: socket.socket, msg: Any, fds: list[int] = ()) -> None:  # type: ignore[assignment]
    data = pickle.dumps(msg, 5)
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def _recv(sock: socket.socket) -> tuple[Any, list[int]]:
    """(message, fds); (None, []) at EOF."""
    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MSG, 8)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return pickle.loads(data), fds


# ---- parent side -------------------------------------------------------------------


class Template:
    """The parent's handle on its template process.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._owner_pid = -1

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def _start(self) -> None:
        method = os.environ.get("FASTPOOL_TEMPLATE_START", "")
        if method == "fork" and threading.active_count() == 1:
            self._start_forked()  # the user's choice, even with native threads running
        elif method != "spawn" and _os_threads() == 1 and _rss_bytes() < FORK_MAX_RSS_BYTES:
            self._start_forked()
        else:
            self._start_spawned()

    def _start_forked(self) -> None:
        """Forks the template from this process: ~3x faster than a new interpreter
        (NumPy is imported already).  Only while this process runs no other thread,
        Python or native, so no lock can be inherited held."""
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:
            try:
                # The parent's objects stay in this process but are never collected
                # here (a finalizer could close an fd number we reuse), and its fds are
                # closed (a socket the parent closes later must not stay open here).
                gc.freeze()
                keep = child_end.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 1 << 20)
                os.setsid()  # Ctrl-C in the terminal is the parent's to handle
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.close(devnull)
                os.environ[ENV_FLAG] = "1"
                _limit_blas_threads()
                serve(child_end.fileno(), forked=True)
            finally:
                os._exit(0)
        child_end.close()
        self._await_ready(_ForkedProcess(pid), parent_end, None)

    def _start_spawned(self) -> None:
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        env[ENV_FLAG] = "1"
        # The template imports numpy before any pool exists, so BLAS pools are
        # sized here: one thread per worker unless the user said otherwise;
        # workers raise it with threadpoolctl when a pool has spare cores.
        for var in _BLAS_VARS:
            env.setdefault(var, "1")
        code = f"from fastpool._template import serve; serve({child_end.fileno()})"
        try:
            proc = subprocess.Popen(
                # -P: the cwd is not put first on sys.path, so a source checkout in the
                # cwd never shadows the installed package (it lacks the compiled core)
                [sys.executable, "-P", "-c", code],
                pass_fds=[child_end.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,  # Ctrl-C in the terminal is the parent's to handle
            )
        finally:
            child_end.close()
        config = {
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "main": _main_path(),
            "parent": os.getpid(),
        }
        self._await_ready(proc, parent_end, config)

    def _await_ready(self, proc: Any, parent_end: socket.socket, config: dict | None) -> None:
        try:
            if config is not None:
                _send(parent_end, ("config", config))
            parent_end.settimeout(60)
            msg, _ = _recv(parent_end)
            parent_end.settimeout(None)
        except OSError as exc:
            msg = None
            err: Any = exc
        else:
            err = msg
        if not msg or msg[0] != "ready":
            proc.kill()
            proc.wait()
            parent_end.close()
            raise RuntimeError(f"fastpool's worker template failed to start: {err!r}")
        self._proc, self._ctl, self._owner_pid = proc, parent_end, os.getpid()

    def connect(self) -> socket.socket:
        """A new connection to the template, for one pool.  Starts it if needed."""
        with self._lock:
            if self._owner_pid != os.getpid():  # inherited across a fork: not ours
                self._proc, self._ctl = None, None
            if self._proc is not None and self._proc.poll() is not None:
                self._close_locked()
            for attempt in (1, 2):
                if self._proc is None:
                    self._start()
                mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                try:
                    assert self._ctl is not None
                    _send(self._ctl, ("pool",), [theirs.fileno()])
                    return mine
                except OSError:  # it died and is not reaped yet: a new one
                    mine.close()
                    self._proc.kill()  # type: ignore[union-attr]
                    self._close_locked()
                    if attempt == 2:
                        raise
                finally:
                    theirs.close()
            raise AssertionError("unreachable")

    def _close_locked(self, timeout: float = 5.0) -> None:
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def close(self) -> None:
        with self._lock:
            if self._owner_pid == os.getpid():
                self._close_locked()


# A forked template keeps what the parent held at that moment alive for the life of
# the process (a dataset the parent frees later stays in the template), so only a
# small parent is forked; a big one pays ~150 ms for a fresh interpreter instead.
FORK_MAX_RSS_BYTES = 256 << 20


def _os_threads() -> int:
    """Threads of this process, native ones included (an OpenBLAS pool, say): forking
    with any of them running is what CPython 3.12+ warns about, so we only fork alone."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 1 << 62


_TEMPLATE = Template()


def template() -> Template:
    return _TEMPLATE


def shutdown_template() -> None:
    """Stops this process's template (and any worker it still has).  Safe to call twice."""
    _TEMPLATE.close()


atexit.register(shutdown_template)


class _ForkedProcess:
    """The slice of subprocess.Popen that Template uses, for a template made by fork."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.002)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


_BLAS_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS")


def _limit_blas_threads() -> None:
    """One BLAS/OpenMP thread per worker unless the user set a count: so workers x BLAS
    threads never oversubscribe the CPUs.  Env vars cover libraries not loaded yet;
    threadpoolctl the ones a forked template inherited already loaded."""
    user_set = any(v in os.environ for v in _BLAS_VARS)
    for var in _BLAS_VARS:
        os.environ.setdefault(var, "1")
    if not user_set and "numpy" in sys.modules:
        try:
            from threadpoolctl import threadpool_limits

            threadpool_limits(1)
        except Exception:  # noqa: BLE001 - optional: without it, the env vars still apply
            pass


def _main_path() -> str | None:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or getattr(sys, "ps1", None) or not path.endswith(".py"):
        return None
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name and not spec.name.startswith("__"):
        return None  # run with -m: the module is importable by name
    return os.path.abspath(path)


# ---- template side -----------------------------------------------------------------


def _prctl_pdeathsig(sig: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def serve(fd: int, forked: bool = False) -> None:
    """The template's main loop.  Returns only to exit.

    A forked template already has the parent's sys.path, cwd and main module."""
    ctl = socket.socket(fileno=fd)
    config = {"main": None}
    if not forked:
        msg, _ = _recv(ctl)
        if not msg or msg[0] != "config":
            os._exit(2)
        config = msg[1]
        sys.path[:] = config["sys_path"]
        try:
            os.chdir(config["cwd"])
        except OSError:
            pass
    # No PR_SET_PDEATHSIG here: the kernel ties it to the parent *thread* that
    # started us, and a pool may be created from a short-lived thread.  EOF on
    # the control socket is what tells us the parent process is gone.
    import numpy  # noqa: F401  (preloaded: every worker forks with it)

    from fastpool import _worker  # noqa: F401

    if config["main"]:
        _load_main(config["main"])
    _send(ctl, ("ready", os.getpid()))

    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    conns: dict[int, socket.socket] = {}
    owner: dict[int, socket.socket] = {}  # worker pid -> the pool connection that asked

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = owner.pop(pid, None)
            if conn is not None and conn.fileno() >= 0:
                try:
                    _send(conn, ("exit", pid, os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass

    def kill_workers(of: socket.socket | None) -> None:
        for pid, conn in list(owner.items()):
            if of is None or conn is of:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    while True:
        for key, _ev in sel.select():
            if key.data == "wake":
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
            elif key.data == "ctl":
                msg, fds = _recv(ctl)
                if msg is None:  # the parent is gone: nothing may outlive it
                    kill_workers(None)
                    for _ in range(200):
                        reap()
                        if not owner:
                            break
                        signal.sigtimedwait([signal.SIGCHLD], 0.01)
                    os._exit(0)
                if msg[0] == "pool" and fds:
                    conn = socket.socket(fileno=fds[0])
                    conns[conn.fileno()] = conn
                    sel.register(conn, selectors.EVENT_READ, "pool")
            else:
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    msg, fds = _recv(conn)
                except OSError:
                    msg, fds = None, []
                if msg is None:
                    kill_workers(conn)
                    sel.unregister(conn)
                    conns.pop(conn.fileno(), None)
                    for pid, c in list(owner.items()):
                        if c is conn:
                            owner[pid] = None  # type: ignore[assignment]
                    conn.close()
                    continue
                if msg[0] == "spawn":
                    _spawn(conn, msg, fds, owner, [ctl, wake_r, wake_w, *conns.values()])


def _spawn(conn: socket.socket, msg: tuple, fds: list[int], owner: dict, close_in_child: list) -> None:
    _, req, slot, env = msg
    board_fd = fds[0]
    arena_fd = fds[1] if len(fds) > 1 else -1  # the pool's shared-array arena
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    try:
        pid = os.fork()
        if pid == 0:
            code = 70
            try:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
                for obj in close_in_child:
                    try:
                        obj.close() if hasattr(obj, "close") else os.close(obj)
                    except OSError:
                        pass
                template_pid = os.getppid()
                _prctl_pdeathsig(signal.SIGKILL)
                if os.getppid() != template_pid:
                    os._exit(0)
                os.environ.update(env)
                from fastpool import _worker

                code = _worker.main(board_fd, slot, env, arena_fd)
            except BaseException:  # the child must never return into the template's loop
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        pidfd = os.pidfd_open(pid)
        owner[pid] = conn
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    os.close(board_fd)
    if arena_fd >= 0:
        os.close(arena_fd)
    try:
        _send(conn, ("pid", req, pid), [pidfd])
    except OSError:
        pass
    os.close(pidfd)


def _load_main(path: str) -> None:
    """Runs the parent's main script as ``__mp_main__`` (multiprocessing's rule), so
    classes defined there unpickle in workers.  A script without the
    ``if __name__ == "__main__":`` guard would start pools here: that fails and is ignored."""
    import runpy
    import types

    global BOOTING
    BOOTING = True
    try:
        mod = types.ModuleType("__mp_main__")
        sys.modules["__mp_main__"] = mod
        namespace = runpy.run_path(path, run_name="__mp_main__")
        mod.__dict__.update(namespace)
        sys.modules["__main__"] = mod
    except BaseException as exc:  # noqa: BLE001 - never let user code kill the template
        sys.modules.pop("__mp_main__", None)
        print(f"fastpool: could not import {path} in the worker template ({exc!r}); "
              "functions from it are sent by value instead", file=sys.stderr)
    finally:
        BOOTING = False
