"""The demo's pieces that are not the story: worker functions, built-in data, checks.

Worker functions live at module level so both pools unpickle them by name.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from concurrent.futures import Future
from typing import Any, TextIO

import numpy as np

SEED = 2024
ROWS = 384
COLS = 512
TOP_EIGENVALUES = 4
HEAL_WAIT_S = 15.0
RESULT_WAIT_S = 60.0
SPIN_LIMIT_S = 30.0  # spin() gives up by itself, so a broken timeout cannot strand a worker


# ---- worker side -------------------------------------------------------------------


def process_batch(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row statistics, the dominant frequency of each row, and the batch's Gram spectrum.

    Returns ``(features, top)``: ``features`` is ``(rows, 7)`` float64 (mean, std, min,
    max, peak frequency bin, spectral power, Gram row sum), ``top`` the largest
    ``TOP_EIGENVALUES`` eigenvalues of ``x @ x.T / cols``.  About 8 ms for a 384 x 512
    batch on one core of the project's machine."""
    spectrum = np.abs(np.fft.rfft(x, axis=1))
    peak = spectrum[:, 1:].argmax(axis=1) + 1  # bin 0 is the mean, not a frequency
    power = (spectrum**2).sum(axis=1)
    gram = x @ x.T / x.shape[1]
    top = np.linalg.eigvalsh(gram)[-TOP_EIGENVALUES:]
    features = np.column_stack(
        [x.mean(axis=1), x.std(axis=1), x.min(axis=1), x.max(axis=1), peak, power, gram.sum(axis=1)]
    )
    return features, top


def die_by_sigkill() -> None:
    """Kills its own worker with SIGKILL, as the kernel's OOM killer would (the demo
    says that the task sent it: fastpool's message can only guess at the sender)."""
    os.kill(os.getpid(), signal.SIGKILL)


def die_by_segfault() -> None:
    """Dereferences NULL in C: the worker dies of SIGSEGV, as with a bug in native code."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the user's directory
    except (ImportError, ValueError, OSError):
        pass
    ctypes.string_at(0)


def hog_memory(step_mib: int = 32, cap_mib: int = 1536) -> int:
    """Allocates and touches ``step_mib`` at a time, up to ``cap_mib``, then gives up (so a
    memory limit that never fires fails the check instead of eating the machine)."""
    held = []
    for _ in range(cap_mib // step_mib):
        held.append(np.ones(step_mib * 2**20 // 8))
        time.sleep(0.005)  # the supervisor samples RSS every memory_interval_s
    return len(held) * step_mib


def spin(seconds: float = SPIN_LIMIT_S) -> str:
    """Burns CPU for ``seconds`` in pure Python (never sleeps), then returns."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return f"spun {n} times"


# ---- parent side -------------------------------------------------------------------


def make_batches(
    n_batches: int, rows: int = ROWS, cols: int = COLS, seed: int = SEED
) -> list[np.ndarray]:
    """``n_batches`` arrays of ``(rows, cols)`` float64: one sinusoid per row in unit noise.

    Row i of batch b has its own frequency (a whole number of cycles per row), so
    ``process_batch`` has a right answer to find.  Deterministic for a seed."""
    rng = np.random.default_rng(seed)
    n_freqs = cols // 4
    phase = 2 * np.pi * np.arange(cols) / cols
    table = 2.0 * np.sin(np.arange(1, n_freqs + 1)[:, None] * phase)  # (n_freqs, cols)
    out = []
    for _ in range(n_batches):
        freqs = rng.integers(1, n_freqs + 1, size=rows)
        batch = rng.standard_normal((rows, cols))
        batch += table[freqs - 1]
        out.append(batch)
    return out


def same_results(a: list, b: list) -> bool:
    """Bit for bit: every array of every result equal, NaN nowhere."""
    if len(a) != len(b):
        return False
    return all(
        len(ra) == len(rb) and all(np.array_equal(xa, xb) for xa, xb in zip(ra, rb))
        for ra, rb in zip(a, b)
    )


class Checks:
    """Named pass/fail checks; the demo's exit code is whether all passed."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.results: list[tuple[str, bool]] = []

    def __call__(self, ok: bool, what: str, detail: str = "") -> bool:
        self.results.append((what, bool(ok)))
        mark = "ok  " if ok else "FAIL"
        self.out.write(f"   [{mark}] {what}{(': ' + detail) if detail else ''}\n")
        self.out.flush()
        return bool(ok)

    @property
    def failed(self) -> list[str]:
        return [what for what, ok in self.results if not ok]


def outcome(fut: Future) -> tuple[str, BaseException | None]:
    try:
        fut.result(timeout=RESULT_WAIT_S)
    except BaseException as exc:  # noqa: BLE001 - the demo shows whatever each future got
        return "error", exc
    return "ok", None


def wait_healed(pool: Any, restarts: int, workers: int) -> bool:
    """True once ``restarts`` replacements happened and every slot holds a ready worker."""
    deadline = time.monotonic() + HEAL_WAIT_S
    while time.monotonic() < deadline:
        stats = pool.stats()
        ready = sum(1 for w in stats["workers"] if w["state"] == "ready")
        if stats["restarts"] >= restarts and ready == workers:
            return True
        time.sleep(0.02)
    return False


def alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def shared_mappings(pids: list[int]) -> tuple[set[str], int]:
    """(files under /dev/shm that any of ``pids`` maps, how many of ``pids`` map the
    board's memfd)."""
    shm: set[str] = set()
    with_memfd = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue
        paths = {line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6}
        shm |= {p for p in paths if p.startswith("/dev/shm/")}
        with_memfd += any(p.startswith("/memfd:fastpool") for p in paths)
    return shm, with_memfd
