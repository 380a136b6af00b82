"""The tasks of the workloads section (workloads.py), importable by name in every worker.

Modelled on batch jobs users bring: CPU-bound tasks of a set length, filters over a large
image, word counts kept per worker, a model loaded once per worker then evaluated, tasks
that return arrays. Each task returns what lets the caller check its result: the item it
was given back, beside its value, so an order mix-up cannot pass.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from fastpool._bench.tasks import cpu_spin

# ---- long tasks, heavy tail ---------------------------------------------------------------


def spin_item(item: tuple[int, float]) -> int:
    """``item`` = (index, seconds): that much CPU, then the index back."""
    i, seconds = item
    cpu_spin(seconds)
    return i


# ---- a large image: filters over it -------------------------------------------------------


def make_image(mb: float, seed: int = 31) -> Any:
    import numpy as np

    side = int((mb * 1e6 / 8) ** 0.5)
    return np.random.default_rng(seed).random((side, side))


def filter_image(image: Any, k: int, passes: int) -> tuple[int, float]:
    """Filter ``k`` over ``image``: ``passes`` rounds of NumPy work on the whole image (its
    temporaries as large as the image), the response's total back."""
    import numpy as np

    acc = 0.0
    for p in range(passes):
        y = np.abs(image * (k + 1) - 0.5 * (p + 1))
        y = np.minimum(y, 0.75)
        acc += float(y.sum())
    return k, acc


# ---- per-worker state: word counts --------------------------------------------------------


def make_docs(n: int, words: int, seed: int = 31) -> list[str]:
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(2000)]
    return [" ".join(vocab[j] for j in rng.zipf(1.3, words) % len(vocab)) for _ in range(n)]


_COUNTS: Counter[str] | None = None


def init_counts() -> None:
    global _COUNTS
    _COUNTS = Counter()


def count_into_state(doc: str) -> int:
    """Count ``doc``'s words into this worker's Counter (init_counts made it)."""
    assert _COUNTS is not None, "init_counts did not run in this worker"
    words = doc.split()
    _COUNTS.update(words)
    return len(words)


def take_counts() -> tuple[int, Counter[str] | None]:
    """This worker's Counter, once: (pid, counts), then (pid, None)."""
    global _COUNTS
    got, _COUNTS = _COUNTS, None
    return os.getpid(), got


def count_doc(doc: str) -> Counter[str]:
    """The stateless form: each task's counts, merged by the caller."""
    return Counter(doc.split())


def count_with_state(state: dict[str, Any], doc: str) -> int:
    """MPIRE's form: its worker_state dict."""
    words = doc.split()
    state["counts"].update(words)
    return len(words)


def mpire_init_counts(state: dict[str, Any]) -> None:
    state["counts"] = Counter()


def mpire_exit_counts(state: dict[str, Any]) -> Counter[str]:
    return state["counts"]


# ---- a per-worker model, loaded once ------------------------------------------------------

_MODEL: dict[str, Any] | None = None


def load_model(seconds: float) -> dict[str, Any]:
    """A model load: ``seconds`` of CPU, then weights. Returns the model."""
    cpu_spin(seconds)
    return {"weight": 3, "pid": os.getpid(), "loaded_at": time.time()}


def init_model(seconds: float) -> None:
    global _MODEL
    _MODEL = load_model(seconds)


def evaluate(item: tuple[int, float]) -> int:
    """Evaluate item (index, seconds) on this worker's model (init_model loaded it)."""
    assert _MODEL is not None, "init_model did not run in this worker"
    return evaluate_on(_MODEL, item)


def evaluate_lazy(item: tuple[int, float], load_s: float) -> int:
    """The form without an initializer: the model loaded by the worker's first task."""
    global _MODEL
    if _MODEL is None:
        _MODEL = load_model(load_s)
    return evaluate_on(_MODEL, item)


def evaluate_on(model: dict[str, Any], item: tuple[int, float]) -> int:
    i, seconds = item
    cpu_spin(seconds)
    return i * model["weight"]


def evaluate_with_state(state: dict[str, Any], item: tuple[int, float]) -> int:
    """MPIRE's form: the model in its worker_state."""
    return evaluate_on(state["model"], item)


def mpire_init_model(state: dict[str, Any], seconds: float) -> None:
    state["model"] = load_model(seconds)


# ---- tasks that return arrays -------------------------------------------------------------


def make_array(item: tuple[int, int]) -> Any:
    """item = (seed, elements): a new float64 array of that many elements, computed."""
    import numpy as np

    seed, n = item
    out = np.random.default_rng(seed).random(n)
    np.sqrt(out, out=out)
    out += seed
    return out
