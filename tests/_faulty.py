"""Worker-side functions that damage their own worker, for tests/faults."""

import ctypes
import os
import signal
import sys
import time


def segfault():
    ctypes.string_at(0)


def sigkill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def hard_exit(code=7):
    os._exit(code)


def sigstop_self():
    os.kill(os.getpid(), signal.SIGSTOP)
    return "resumed"


def spin_forever():
    while True:
        pass


def sleep_then(x, s):
    time.sleep(s)
    return x


def double(x):
    return 2 * x


def pid():
    return os.getpid()


def maybe_die(i, every):
    """Kills its own worker when i % every == 0, else returns i * i."""
    if i % every == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    return i * i


def die_once(marker_path):
    """Kills its worker the first time (no marker yet), succeeds the second time."""
    if not os.path.exists(marker_path):
        with open(marker_path, "w"):
            pass
        os.kill(os.getpid(), signal.SIGKILL)
    return "second try"


def cooperative(seconds):
    import fastpool

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if fastpool.cancelled():
            return "stopped early"
        time.sleep(0.01)
    return "ran to the end"


def bad_initializer():
    raise RuntimeError("initializer is broken")


def exiting_initializer():
    sys.exit(3)


def counting_initializer(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    raise RuntimeError("initializer is broken")


async def async_task(x):
    import asyncio

    await asyncio.sleep(0.01)
    return x + 1


async def async_failing_child():
    import asyncio

    async def child():
        raise KeyError("from a child task")

    await asyncio.gather(asyncio.create_task(child()))


def allocate_mib(mib, hold_s=5.0):
    """Allocates and touches mib MiB step by step (so a sampler sees it grow), then holds it."""
    import numpy as np

    blocks = []
    for _ in range(mib // 16):
        blocks.append(np.ones(16 * 2**20, dtype=np.uint8))
        time.sleep(0.005)
    time.sleep(hold_s)
    return len(blocks)


_LEAK = []


def leak_mib(mib):
    import numpy as np

    _LEAK.append(np.ones(mib * 2**20, dtype=np.uint8))
    return os.getpid()


def pid_and(x):
    return (os.getpid(), x)


def send_stale_reply(task_id):
    """Publishes, from inside a task, a reply for a task id this worker never got
    (what a worker confused by a bug, or a late reply, looks like to the parent)."""
    from fastpool._runtime import _call, _codec

    board, slot = _call.CURRENT["board"], _call.CURRENT["slot"]
    return board.push_result(slot, _codec.R_OK, task_id, 0, _codec.dumps("stale"))


def touch(path):
    """A side effect a test can see: the file exists only if this task ran."""
    with open(path, "w") as f:
        f.write("ran")
    return path


# ---- a task that damages the shared board: the parent must not trust it -------------

_U64 = (0, 1, 7, 4096, (1 << 32) - 1, 1 << 32, (1 << 63), (1 << 64) - 1, (1 << 64) - 4096)


def scribble(target, value, hold_s=0.0):
    """Overwrites, from inside a task, one word of shared memory this worker can write:

    "result_tail", "result_head", "task_head", "task_tail": a position of its rings;
    "result_record": a bogus record header published on its result ring (value is
    the length; kind is random garbage); "slot_current", "slot_served",
    "slot_skips": its slot words (skip words: value, in all of them);
    "board_nslots", "board_capacity": the board header's geometry; "board_want": the
    header word that once counted the parent's driving threads.
    value is a 64-bit pattern.  hold_s: then wait that long (the parent should kill
    this worker first), so the worker's own next publication cannot repair the damage
    before the parent reads it.  Returns the target's name."""
    import ctypes

    from fastpool._runtime import _call

    board, slot = _call.CURRENT["board"], _call.CURRENT["slot"]
    lay = board.layout()
    base = lay["base"]
    res, task, words = lay["result_rings"][slot], lay["task_rings"][slot], lay["slots"][slot]

    def put64(off, v):
        ctypes.c_uint64.from_address(base + off).value = v & ((1 << 64) - 1)

    def put32(off, v):
        ctypes.c_uint32.from_address(base + off).value = v & 0xFFFFFFFF

    if target == "result_tail":
        put64(res + 64, value)
    elif target == "result_head":
        put64(res, value)
    elif target == "task_head":
        put64(task, value)
    elif target == "task_tail":
        put64(task + 64, value)
    elif target == "result_record":
        tail = ctypes.c_uint64.from_address(base + res + 64).value
        off = res + 256 + tail % lay["ring_capacity"]
        put32(off, value)  # len
        put32(off + 4, (value * 2654435761) | 5)  # kind: not one the protocol knows
        put64(off + 8, value)  # task id
        put64(res + 64, tail + 24 + ((value + 7) & ~7 & ((1 << 64) - 1)))  # publish it
    elif target == "slot_current":
        put64(words + 16, value)
    elif target == "slot_served":
        put64(words + 32, value)
    elif target == "slot_skips":
        put64(words + 48, value | 1)  # skip_seq
        for i in range(32):
            put64(words + 56 + 8 * i, value + i)  # skip words
    elif target == "board_nslots":
        put32(12, value)
    elif target == "board_capacity":
        put64(16, value)
    elif target == "board_want":
        put32(76, value)  # fp_board_t: after the parent's eventcount (64) and attention (72)
    else:
        raise ValueError(target)
    board.kick() if hasattr(board, "kick") else None
    deadline = time.monotonic() + hold_s
    while time.monotonic() < deadline:
        time.sleep(0.01)
    return target


# ---- side effects a test can count (issue 9: no task runs twice) ---------------------


def append_id(path, i):
    """Appends ``i`` and a newline to ``path`` in one O_APPEND write (atomic between
    processes for a line this short), then returns i: each run of the task leaves one
    line, so a task run twice shows up twice."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{i}\n".encode())
    finally:
        os.close(fd)
    return i


def append_id_scribble_current_then_die(path, i, value):
    """Records its run like ``append_id``, overwrites its slot's ``current`` word with
    ``value`` (so the word no longer names this task), then SIGKILLs its own worker."""
    append_id(path, i)
    scribble("slot_current", value)
    os.kill(os.getpid(), signal.SIGKILL)


def append_id_then_die(path, i, pad=None):
    """Records its run like ``append_id``, then SIGKILLs its own worker.  ``pad``
    is ignored: it only makes the call's record as large as the caller wants."""
    append_id(path, i)
    os.kill(os.getpid(), signal.SIGKILL)


def appended_ids(path):
    """The ids ``append_id`` wrote to ``path``, in write order ([] before the first)."""
    try:
        with open(path) as f:
            return [int(line) for line in f.read().split()]
    except FileNotFoundError:
        return []


def append_id_padded(path, i, pad):
    """``append_id``, returning [i, pad]: records as large as the caller wants on
    both rings (see test_deaths_under_load: a ring that emptied at a small offset
    holds one record until its reader catches up)."""
    append_id(path, i)
    return [i, pad]


def announce_then_gate(started, path, nbytes=0, limit_s=30.0):
    """Creates ``started`` (the task is running: its record has left the task ring),
    then holds its worker until ``path`` exists (at most limit_s); returns
    ``"p" * nbytes``, a result as large as asked for from a small call."""
    with open(started, "w"):
        pass
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.002)
    return "p" * nbytes


def announce_then_gate_then_die(started, path, limit_s=30.0):
    """``announce_then_gate``, then SIGKILLs its own worker once the gate opens."""
    announce_then_gate(started, path, 0, limit_s)
    os.kill(os.getpid(), signal.SIGKILL)


def gated_initializer(starts, path, limit_s=30.0):
    """An initializer that records each start (its pid, one O_APPEND line in
    ``starts``), then waits for ``path`` (at most limit_s): one that never returns
    unless the test opens the gate."""
    append_id(starts, os.getpid())
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.002)


# ---- results nobody decodes: their shared blocks must still be released ---------------


def cooperative_array(started, nbytes, limit_s=30.0):
    """Creates ``started``, waits until fastpool.cancelled() (at most limit_s), then
    returns an array of nbytes: large enough to travel in the worker's arena region
    with a handoff reference, for a future that is cancelled and never reads it."""
    import numpy as np

    import fastpool

    with open(started, "w"):
        pass
    deadline = time.monotonic() + limit_s
    while not fastpool.cancelled() and time.monotonic() < deadline:
        time.sleep(0.002)
    return np.ones(nbytes // 8)


def array_with_a_big_pickle(nbytes, nitems):
    """An array that travels by descriptor (a block handed to the parent) beside a
    list whose pickle is too big for a small ring: the result never fits."""
    import numpy as np

    return np.ones(nbytes // 8), list(range(nitems))


def unknown_array_reply(task_id, nbytes):
    """Publishes, from inside a task, an OK reply with an arena array for a task id
    this worker never got (the parent drops it as unknown, unread)."""
    import numpy as np

    from fastpool._runtime import _arrays, _call, _codec

    board, slot = _call.CURRENT["board"], _call.CURRENT["slot"]
    payload, handed = _arrays.encode_result(np.ones(nbytes // 8))
    aux_handoffs = 1 << 62  # FP_AUX_HANDOFFS (csrc/fp_proto.h): the payload ends with its trailer
    return board.push_result(slot, _codec.R_OK, task_id, aux_handoffs, payload)


def unrebuildable_then_array(nbytes):
    """A result that pickles in the worker but fails to unpickle in the parent
    (TwoArgError cannot be rebuilt) before it reaches the array after it."""
    import numpy as np
    from _tasks import TwoArgError

    return TwoArgError("cannot come back", 7), np.ones(nbytes // 8)


def gate_or_expire(path, expired, limit_s):
    """Holds its worker until ``path`` exists; after limit_s it creates ``expired``
    and returns: the file says a task ran to its end rather than being stopped."""
    deadline = time.monotonic() + limit_s
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            with open(expired, "w"):
                pass
            return "expired"
        time.sleep(0.005)
    return "opened"


def nbytes_of(data):
    """len(data), and a bytes result of that length back: a record of that size each way."""
    return bytes(len(data))
