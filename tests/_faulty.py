"""Worker-side functions that damage, kill or hang their own worker, for the fault tests.

Each is a real failure, really provoked: a signal, a segfault, an exit, a hang, memory
taken, a bad word written into shared memory.  Ordinary tasks are in _tasks.py.
"""

import ctypes
import os
import signal
import sys
import time

from _tasks import LIMIT_S, announce_then_gate, append_id, open_gate


def segfault():
    ctypes.string_at(0)


def sigkill_self(*_args):
    """SIGKILLs its own worker; arguments are ignored (for map, or an array to hold)."""
    os.kill(os.getpid(), signal.SIGKILL)


def hard_exit(code=7):
    os._exit(code)


def sigstop_self():
    os.kill(os.getpid(), signal.SIGSTOP)
    return "resumed"


def spin_forever():
    while True:
        pass


def maybe_die(i, every):
    """Kills its own worker when i % every == 0, else returns i * i."""
    if i % every == 0:
        sigkill_self()
    return i * i


def sigkill_at(x, at=2):
    """x, except that the worker SIGKILLs itself at item ``at``."""
    if x == at:
        sigkill_self()
    return x


def die_once(marker_path):
    """Kills its worker the first time (no marker yet), succeeds the second time."""
    if not os.path.exists(marker_path):
        with open(marker_path, "w"):
            pass
        sigkill_self()
    return "second try"


_HELD: list = []


def hold_then_die(arr) -> None:
    """Keeps a view of ``arr`` (this worker's reference stays until it dies), then dies."""
    _HELD.append(arr[1:])
    sigkill_self()


def append_id_then_die(path, i, pad=None):
    """Records its run like ``_tasks.append_id``, then SIGKILLs its own worker.  ``pad``
    is ignored: it only makes the call's record as large as the caller wants."""
    append_id(path, i)
    sigkill_self()


def announce_then_gate_then_die(started, path, limit_s=LIMIT_S):
    """``_tasks.announce_then_gate``, then SIGKILLs its own worker once the gate opens."""
    announce_then_gate(started, path, 0, limit_s)
    sigkill_self()


# ---- initializers that never give a working worker ------------------------------------


def bad_initializer():
    raise RuntimeError("initializer is broken")


def exiting_initializer():
    sys.exit(3)


def counting_initializer(path):
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    raise RuntimeError("initializer is broken")


def gated_initializer(starts, path, limit_s=LIMIT_S):
    """An initializer that records each start (its pid, one O_APPEND line in
    ``starts``), then waits for ``path`` (at most limit_s): one that never returns
    unless the test opens the gate."""
    append_id(starts, os.getpid())
    open_gate(path, limit_s)


# ---- memory ---------------------------------------------------------------------------


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


# ---- replies for tasks this worker never got ------------------------------------------


def send_stale_reply(task_id):
    """Publishes, from inside a task, a reply for a task id this worker never got
    (what a worker confused by a bug, or a late reply, looks like to the parent)."""
    from fastpool._runtime import _call, _codec

    board, slot = _call.CURRENT["board"], _call.CURRENT["slot"]
    return board.push_result(slot, _codec.R_OK, task_id, 0, _codec.dumps("stale"))


def unknown_array_reply(task_id, nbytes):
    """Publishes, from inside a task, an OK reply with an arena array for a task id
    this worker never got (the parent drops it as unknown, unread)."""
    import numpy as np

    from fastpool._runtime import _arrays, _call, _codec

    board, slot = _call.CURRENT["board"], _call.CURRENT["slot"]
    payload, handed = _arrays.encode_result(np.ones(nbytes // 8))
    aux_handoffs = 1 << 62  # FP_AUX_HANDOFFS (csrc/fp_proto.h): the payload ends with its trailer
    return board.push_result(slot, _codec.R_OK, task_id, aux_handoffs, payload)


# ---- a task that damages shared memory: the parent must not trust it ------------------


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


def scribble_arena_top():
    """Overwrites this worker's arena region top with a wrapping value (as a stray
    write from a C extension could), then returns an array that needs that region."""
    import numpy as np

    from fastpool._runtime import _arrays

    arena = _arrays.process_arena()
    ctypes.c_uint64.from_address(arena.base_address + 128 + 8 * arena.proc).value = 2**64 - 4096
    return np.ones(1 << 18)


def append_id_scribble_current_then_die(path, i, value):
    """Records its run like ``append_id``, overwrites its slot's ``current`` word with
    ``value`` (so the word no longer names this task), then SIGKILLs its own worker."""
    append_id(path, i)
    scribble("slot_current", value)
    os.kill(os.getpid(), signal.SIGKILL)
