"""The template: a pre-warmed, single-threaded process that forks workers.

    parent process                         template (one per parent, numpy imported)
    --------------                         -------------------------------------------
    Template.connect() --ctl socket-------> accepts one SEQPACKET connection per pool
    pool conn: ("spawn", req, slot, env) + board fd, arena fd
                                           -> fork(); child runs _worker.main(board, slot, req)
              <- ("pid", req, pid) + pidfd
              <- ("spawn-failed", req, errno, text)   fork/pidfd_open failed (EAGAIN, ENOMEM,
                                                      EMFILE): one failed start of that slot
              <- ("exit", pid, exitcode)     SIGCHLD -> waitpid -> report

Why: forking the parent is unsafe while it runs threads (the pool itself runs
threads), and spawning a fresh interpreter costs ~100 ms of imports per
worker.  The template is made once per parent process and forks a ready worker
in about a millisecond.  It is forked from the parent when the parent runs one
thread once OpenBLAS's idle pool is stopped (see _forksafe: NumPy and __main__ are
then in place and the first result comes in tens of milliseconds), and started
with subprocess otherwise (a new interpreter that imports numpy and re-imports
the main script as ``__mp_main__``).

Leftovers cannot outlive the parent: the template runs in its own process group,
watches a pidfd of the parent process (its socket alone is not enough: another
child of the parent may hold a copy), kills every worker when the parent exits or
its socket reaches EOF, and each worker has PR_SET_PDEATHSIG=SIGKILL on the
template.  The template lives as long as its parent process (like
multiprocessing's forkserver); ``shutdown_template()`` ends it early.  A pool made
inside a task (a nested pool) gets a template of its worker's own, which ends with the
last pool that uses it (Template.per_pool) or with the worker, whichever comes first.
"""

from __future__ import annotations

# _socket, the C module, not socket.py: importing that (~2 ms of enum building) would
# delay a first pool's template fork, and nothing here needs more than these calls.
import _socket
import atexit
import errno
import gc
import os
import pickle
import signal
import sys
import threading
import time
from array import array
from typing import TYPE_CHECKING, Any

from fastpool._runtime import _forksafe

if TYPE_CHECKING:
    import subprocess
    from socket import socket as Socket
else:
    from fastpool._runtime._lazy import LazyModule

    Socket = _socket.socket
    subprocess = LazyModule(
        "subprocess"
    )  # a spawned template, or a close that timed out (5 ms at exit)

_MAX_MSG = 1 << 16
_MAX_FDS = 8
_PR_SET_PDEATHSIG = 1
ENV_FLAG = "FASTPOOL_TEMPLATE"
BOOTING = False  # True while the template runs the parent's main script


def _pair() -> tuple[Socket, Socket]:
    """A connected pair of SOCK_SEQPACKET sockets (message boundaries kept), close-on-exec."""
    return _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC)


def _send(sock: Socket, msg: Any, fds: list[int] = ()) -> None:  # type: ignore[assignment]
    data = pickle.dumps(msg, 5)
    if fds:
        rights = array("i", fds).tobytes()
        sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, rights)])
    else:
        sock.send(data)


def _recv_fds(sock: Socket) -> tuple[bytes, list[int], int]:
    """One message: (bytes, the descriptors it carried, flags), as socket.recv_fds."""
    data, ancdata, flags, _addr = sock.recvmsg(_MAX_MSG, _socket.CMSG_SPACE(_MAX_FDS * 4))
    fds = array("i")
    for level, kind, payload in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds), flags


def _recv(sock: Socket) -> tuple[Any, list[int]]:
    """(message, fds); (None, []) at EOF."""
    data, fds, _flags = _recv_fds(sock)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    return pickle.loads(data), fds


# ---- parent side -------------------------------------------------------------------


FORCED_FORK = "FASTPOOL_TEMPLATE_START=fork"


def start_plan(libs: list[str] | None = None) -> tuple[str, str]:
    """("fork" or "spawn", why): how the template would start if this process made
    its first pool now.  A planned fork is still checked at the fork itself (see
    _forksafe.fork_checked) and falls back to spawn.  ``libs``: this process's
    _forksafe.mapped_libraries(), if read already."""
    method = os.environ.get("FASTPOOL_TEMPLATE_START", "")
    if method == "fork" and threading.active_count() == 1:
        return "fork", FORCED_FORK
    if method == "spawn":
        return "spawn", "FASTPOOL_TEMPLATE_START=spawn"
    rss = _forksafe.rss_bytes()
    if rss >= FORK_MAX_RSS_BYTES:
        return "spawn", (
            f"the process is {rss >> 20} MiB resident, over {FORK_MAX_RSS_BYTES >> 20} MiB: "
            "a forked template would keep all of it alive"
        )
    if not _forksafe.fork_candidate(libs):
        return "spawn", (
            "other threads run in this process (beyond idle OpenBLAS workers): forking "
            "with them running is unsafe"
        )
    return "fork", f"no thread but idle OpenBLAS workers, and {rss >> 20} MiB resident"


class Template:
    """The parent's handle on its template process.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: Socket | None = None
        self._owner_pid = -1
        # begun (see begin) and not yet ready: (process, control socket, config or None)
        self._booting: tuple[Any, Socket, dict | None] | None = None
        self._pools = 0  # connections handed out and not yet released
        # In a worker the template serves the pools it makes and ends with the last of
        # them: an idle interpreter per worker would outlive every nested pool.
        self.per_pool = False
        # how the last template started, and why: ("fork" or "spawn", reason)
        self.how: tuple[str, str] | None = None

    def forget_after_fork(self) -> None:
        """In a forked child.  The template is forked inside connect(), with ``_lock``
        held, and a worker forked from it inherits the lock held too: a pool made in a
        task would wait on it for ever.  A fresh lock; the parent's template, if any, is
        dropped at the child's first connect() (``_owner_pid``)."""
        self._lock = threading.Lock()
        self._booting = None
        self._pools = 0

    @property
    def pid(self) -> int | None:
        """The template process's pid, ready or still starting (begun); None if none."""
        proc = self._proc or (self._booting[0] if self._booting else None)
        return proc.pid if proc else None

    def begin(self) -> None:
        """Starts the template, if this process has none, without waiting for it to be
        ready: the first pool's constructor calls it before its own imports and set-up,
        which then overlap the template's start.  connect() waits for it (and raises
        there if it failed).  Thread-safe."""
        with self._lock:
            self._forget_if_inherited()
            if self._proc is None and self._booting is None:
                self._booting = self._launch()

    def _forget_if_inherited(self) -> None:
        if self._owner_pid != os.getpid():  # inherited across a fork: not ours
            self._proc, self._ctl, self._booting = None, None, None

    def _start(self) -> None:
        booting, self._booting = self._booting, None
        self._await_ready(*(booting or self._launch()))

    def _launch(self) -> tuple[Any, Socket, dict | None]:
        """A template process on its way up: (process, control socket, the config to send
        it or None); _await_ready finishes the start."""
        # Read once for the plan and the fork: /proc/self/maps took 0.2 ms with NumPy
        # loaded and 1.3 ms with scikit-learn (measured), on a first pool's start.
        libs = _forksafe.mapped_libraries()
        method, why = start_plan(libs)
        started = None
        if method == "fork" and why == FORCED_FORK:
            # the user's choice, even beside threads
            started = self._start_forked(checked=False, libs=libs)
        elif method == "fork":
            for _ in range(FORK_TRIES):
                started = self._start_forked(checked=True, libs=libs)
                if started is not None:
                    break
            if started is None:
                method = "spawn"
                why = f"another thread ran at each of {FORK_TRIES} forks (found after the fork)"
        if started is None:
            started = self._start_spawned()
        self.how = (method, why)
        self._owner_pid = os.getpid()
        return started

    def _start_forked(self, checked: bool, libs: list[str]) -> tuple[Any, Socket, None] | None:
        """Forks the template from this process: NumPy and ``__main__`` are loaded
        already, so it is ready in milliseconds.  With ``checked``, only if this process
        ran one thread at the fork (see _forksafe); otherwise the child is killed before
        it does anything and None is returned."""
        # The worker's modules, imported here before the fork: the template would import
        # them first thing, at ~1.5x the cost once every page it writes is copied (COW),
        # and on the way to a first pool's first result.
        from fastpool._runtime import _serve, _worker  # noqa: F401

        parent = os.getpid()
        parent_end, child_end = _pair()
        _forksafe.flush_std_streams()
        in_child, restore = (
            ((lambda: None), (lambda: None))
            if _forksafe.blas_threads_chosen()
            else _forksafe.pin_openblas(1, libs)
        )
        try:
            if checked:
                pid, alone = _forksafe.fork_checked()
            else:
                pid, alone = os.fork(), True
        finally:
            if os.getpid() == parent:
                restore()
        if pid == 0:
            try:
                in_child()
                # First the parent's pidfd: from here on its death is seen even when
                # another child of it keeps our socket open.
                watch = _watch_parent(parent, parent)
                # The parent's objects stay in this process but are never collected
                # here (a finalizer could act on a descriptor it no longer owns), and
                # its descriptors now point at /dev/null.
                gc.freeze()
                _forksafe.neutralise_inherited({child_end.fileno(), watch})
                # after it: a proxy's new connection must not be pointed at /dev/null
                _forksafe.run_multiprocessing_after_fork()
                # Its own process group, so Ctrl-C in the terminal is the parent's to
                # handle.  Not its own session: setsid() makes a new scheduler autogroup,
                # ~2 ms on a first pool's critical path (measured), and would leave the
                # workers competing with their parent as a separate group.
                os.setpgid(0, 0)
                devnull = os.open(os.devnull, os.O_RDONLY)
                os.dup2(devnull, 0)
                os.close(devnull)
                os.environ[ENV_FLAG] = "1"
                _forksafe.limit_blas_threads(libs)
                serve(child_end.fileno(), forked=True, parent_pidfd=watch)
            finally:
                os._exit(0)
        child_end.close()
        proc = _ForkedProcess(pid)
        if not alone:  # born beside another thread: it may be stuck on a lock; never used
            proc.kill()
            proc.wait()
            parent_end.close()
            return None
        return proc, parent_end, None

    def _start_spawned(self) -> tuple[Any, Socket, dict]:
        import subprocess

        from fastpool._runtime import _codec

        _codec.alias_main()  # its workers name __main__'s classes __mp_main__.X

        parent_end, child_end = _pair()
        env = dict(os.environ)
        env[ENV_FLAG] = "1"
        # The template imports numpy before any pool exists, so BLAS pools are
        # sized here: one thread per worker unless the user said otherwise;
        # workers raise it with threadpoolctl when a pool has spare cores.
        for var in _forksafe.BLAS_VARS:
            env.setdefault(var, "1")
        code = f"from fastpool._runtime._template import serve; serve({child_end.fileno()})"
        try:
            proc = subprocess.Popen(
                # -P: the cwd is not put first on sys.path, so a source checkout in the
                # cwd never shadows the installed package (it lacks the compiled core)
                [sys.executable, "-P", "-c", code],
                pass_fds=[child_end.fileno()],
                stdin=subprocess.DEVNULL,
                env=env,
                process_group=0,  # Ctrl-C in the terminal is the parent's to handle
            )
        finally:
            child_end.close()
        config = {
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "main": _main_path(),
            "parent": os.getpid(),
        }
        return proc, parent_end, config

    def _await_ready(self, proc: Any, parent_end: Socket, config: dict | None) -> None:
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

    def connect(self) -> Socket:
        """A new connection to the template, for one pool.  Starts it if needed."""
        with self._lock:
            self._forget_if_inherited()
            if self._proc is not None and self._proc.poll() is not None:
                self._close_locked()
            for attempt in (1, 2):
                if self._proc is None:
                    self._start()
                mine, theirs = _pair()
                try:
                    assert self._ctl is not None
                    _send(self._ctl, ("pool",), [theirs.fileno()])
                    self._pools += 1
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

    def release(self, conn: Socket) -> None:
        """Closes a connection connect() returned (the template then ends that pool's
        workers); a per-pool template (see ``per_pool``) ends with the last one."""
        conn.close()
        with self._lock:
            if self._owner_pid != os.getpid():
                return
            self._pools = max(0, self._pools - 1)
            if self.per_pool and self._pools == 0:
                self._close_locked()

    def _close_locked(self, timeout: float = 5.0) -> None:
        if self._booting is not None:  # begun, never awaited: it exits at its socket's EOF
            self._proc, self._ctl, _config = self._booting
            self._booting = None
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

# A fork found beside another thread is tried once more before spawning: the thread may
# be an OpenBLAS worker its fork handler had just joined, which the kernel still counts
# for a moment (a thread group's count drops when the thread is released, after the
# futex wake that ends the join), and killing and reaping the first child gives it time.
FORK_TRIES = 2


_TEMPLATE = Template()
os.register_at_fork(after_in_child=_TEMPLATE.forget_after_fork)


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
                import subprocess

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


_PRCTL: list[Any] = []  # libc's prctl, resolved once in the template: every fork inherits it


def _prctl_pdeathsig(sig: int) -> None:
    try:
        if not _PRCTL:
            import ctypes

            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        _PRCTL[0](_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_parent(parent: int, expected_ppid: int | None) -> int:
    """A pidfd of the parent process, readable once it exits; -1 where pidfds are missing
    (then the control socket's end of file is the only sign).  Exits at once if the parent
    is gone already (we were reparented), since the pidfd could then name another process."""
    try:
        pidfd = os.pidfd_open(parent)
    except OSError:  # ESRCH: gone; ENOSYS (kernel < 5.3), EMFILE: the socket will do
        pidfd = -1
    if expected_ppid is not None and os.getppid() != expected_ppid:
        os._exit(0)
    return pidfd


def _recv_request(sock: Socket) -> tuple[Any, list[int], bool]:
    """_recv plus whether descriptors were dropped for want of room (MSG_CTRUNC): a full fd
    table must cost one start, not the template."""
    data, fds, flags = _recv_fds(sock)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, [], False
    return pickle.loads(data), fds, bool(flags & _socket.MSG_CTRUNC)


def serve(fd: int, forked: bool = False, parent_pidfd: int = -1) -> None:
    """The template's main loop.  Returns only to exit.

    A forked template already has the parent's sys.path, cwd and main module, and
    watches the parent through ``parent_pidfd``; a spawned one reads them from the
    config message and opens the pidfd itself."""
    import selectors

    ppid = os.getppid()  # before anything: the pool's process started us
    ctl = Socket(fileno=fd)
    config = {"main": None}
    if not forked:
        msg, _ = _recv(ctl)
        if not msg or msg[0] != "config":
            os._exit(2)
        config = msg[1]
        parent = config.get("parent", ppid)
        parent_pidfd = _watch_parent(parent, ppid if parent == ppid else None)
        sys.path[:] = config["sys_path"]
        try:
            os.chdir(config["cwd"])
        except OSError:
            pass
    # No PR_SET_PDEATHSIG here: the kernel ties it to the parent *thread* that
    # started us, and a pool may be created from a short-lived thread.  The parent's
    # pidfd (and EOF on the control socket) tells us the parent process is gone.
    if not forked:
        # Preloaded: every worker forks with it.  A forked template has the parent's
        # modules: numpy if the parent imported it (nothing to do), and none if the parent
        # never did, whose tasks then rarely need it; importing it here anyway put
        # 0.2-0.3 s on such a script's first pool (a Manager-proxy batch: measured, the
        # constructor waits for the template), and a task that imports numpy gets its
        # worker's arena hook at its first array result (_arrays._install_hook).
        import numpy  # noqa: F401

    # _worker.main imports the compiled loop: once here, not in every new worker
    from fastpool._runtime import _serve, _worker  # noqa: F401

    if config["main"]:
        _load_main(config["main"])
    _send(ctl, ("ready", os.getpid()))
    _prctl_pdeathsig(0)  # resolves libc's prctl here once (0: no signal, the default)

    sel = selectors.DefaultSelector()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # A background process group that writes to its terminal is stopped by SIGTTOU
    # under `stty tostop`; ignored, the write goes through (workers inherit this).
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    sel.register(ctl, selectors.EVENT_READ, "ctl")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    if parent_pidfd >= 0:
        sel.register(parent_pidfd, selectors.EVENT_READ, "parent")
    conns: dict[int, Socket] = {}
    owner: dict[int, Socket] = {}  # worker pid -> the pool connection that asked

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

    def kill_workers(of: Socket | None) -> None:
        for pid, conn in list(owner.items()):
            if of is None or conn is of:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def end() -> None:  # the parent is gone: nothing may outlive it
        kill_workers(None)
        for _ in range(200):
            reap()
            if not owner:
                break
            signal.sigtimedwait([signal.SIGCHLD], 0.01)
        os._exit(0)

    while True:
        for key, _ev in sel.select():
            if key.data == "wake":
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                reap()
            elif key.data == "parent":
                end()
            elif key.data == "ctl":
                try:
                    msg, fds = _recv(ctl)
                except OSError:
                    msg, fds = None, []
                if msg is None:
                    end()
                if msg[0] == "pool" and fds:
                    conn = Socket(fileno=fds[0])
                    conns[conn.fileno()] = conn
                    sel.register(conn, selectors.EVENT_READ, "pool")
                else:
                    for fd in fds:
                        os.close(fd)
            else:
                conn = key.fileobj
                assert isinstance(conn, Socket)
                try:
                    msg, fds, truncated = _recv_request(conn)
                except OSError:
                    msg, fds, truncated = None, [], False
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
                    keep_out = [sel, ctl, wake_r, wake_w, parent_pidfd, *conns.values()]
                    _spawn(conn, msg, fds, truncated, owner, keep_out)
                else:
                    for fd in fds:
                        os.close(fd)


def _reply(conn: Socket, msg: tuple, fds: list[int] = ()) -> None:  # type: ignore[assignment]
    try:
        _send(conn, msg, fds)
    except OSError:  # that pool is gone; its EOF is handled in the loop
        pass


def _spawn(
    conn: Socket,
    msg: tuple,
    fds: list[int],
    truncated: bool,
    owner: dict,
    close_in_child: list,
) -> None:
    """Forks one worker for ``conn``'s pool.  Replies ("pid", req, pid) with the worker's
    pidfd, or ("spawn-failed", req, errno, text) when fork() or pidfd_open() fails (EAGAIN
    under a process limit, ENOMEM) or the request's descriptors did not arrive: a
    failed start of that one slot, never the end of the template."""
    _, req, slot, env = msg
    if truncated or not fds:
        for fd in fds:
            os.close(fd)
        _reply(
            conn,
            (
                "spawn-failed",
                req,
                errno.EMFILE,
                "the worker template could not receive the pool's shared memory "
                "(its descriptor table is full)",
            ),
        )
        return
    board_fd = fds[0]
    arena_fd = fds[1] if len(fds) > 1 else -1  # the pool's shared-array arena
    failure: OSError | None = None
    pid = pidfd = -1
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
    try:
        try:
            pid = os.fork()
        except OSError as exc:
            failure = exc
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
                _TEMPLATE.per_pool = True  # a pool made by a task: see Template.per_pool
                from fastpool._runtime import _worker

                code = _worker.main(board_fd, slot, env, arena_fd, req)
            except BaseException:  # the child must never return into the template's loop
                import traceback

                traceback.print_exc()
            finally:
                os._exit(code)
        if pid > 0:
            try:
                pidfd = os.pidfd_open(pid)
            except OSError as exc:  # EMFILE, ENOMEM: without a pidfd the pool cannot watch it
                failure = exc
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)  # no pool owns it: reap it here, SIGCHLD is blocked
            else:
                owner[pid] = conn
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        os.close(board_fd)
        if arena_fd >= 0:
            os.close(arena_fd)
    if failure is not None:
        _reply(conn, ("spawn-failed", req, failure.errno or 0, failure.strerror or str(failure)))
        return
    _reply(conn, ("pid", req, pid), [pidfd])
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
        print(
            f"fastpool: could not import {path} in the worker template ({exc!r}); "
            "functions from it are sent by value instead",
            file=sys.stderr,
        )
    finally:
        BOOTING = False
