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
    from fastpool import _call, _codec

    board, slot = _call.CURRENT["board"], _call.CURRENT["slot"]
    return board.push_result(slot, _codec.R_OK, task_id, 0, _codec.dumps("stale"))
