"""One workload on one library, as that library's users write it, in this fresh process.

    python -m fastpool._bench.workload_libs LIBRARY WORKLOAD SIZE WORKERS

prints one JSON line: {"seconds": wall time} (the "serial" library adds "parts", the
compute the ideal is made of), or {"fails": exception name, "message": ...} when the
library raised; exit 0 in both cases, so the bench can tell a library's failure from
its own. The inputs are made and the library imported before the clock starts; the
clock runs from the pool's construction to the end of its exit (a joblib call's
executor is shut down explicitly, as interpreter exit would), the results checked after.

Each library is a class whose methods are the workloads' shapes: ``map`` (an input
with a length, or a generator), ``map_arg`` (a large array as an argument: the
library's idiom for one, where it has one), ``state`` (per-worker counts gathered at
the end: the library's API for it, or each task's counts merged by the caller where
there is none), ``init`` (a per-worker model load: initializer, worker_state, actors,
client.run, or a model loaded lazily by each worker's first task) and ``grid`` (a
scikit-learn GridSearchCV through joblib, joblib's backends only).
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from fastpool._bench import work

WORKLOADS = (
    "long",
    "long-gen",
    "tail",
    "partial",
    "closure",
    "argument",
    "state",
    "init",
    "returns",
    "gridsearch",
)
SIZES: dict[str, dict[str, Any]] = {
    # about two to four seconds of serial compute a workload on two cores
    "full": {
        "long_n": 20,
        "long_s": 0.2,
        "tail_n": 60,
        "tail_scale_s": 0.012,
        "image_mb": 50,
        "image_tasks": 20,
        "passes": 2,
        "docs": 200,
        "words": 12_000,
        "init_s": 0.5,
        "evals": 40,
        "eval_s": 0.05,
        "returns": 40,
        "return_mb": 8,
        "grid_samples": 1500,
        "grid_cs": 8,
    },
    "quick": {
        "long_n": 12,
        "long_s": 0.05,
        "tail_n": 30,
        "tail_scale_s": 0.004,
        "image_mb": 16,
        "image_tasks": 8,
        "passes": 1,
        "docs": 60,
        "words": 4_000,
        "init_s": 0.2,
        "evals": 16,
        "eval_s": 0.02,
        "returns": 16,
        "return_mb": 2,
        "grid_samples": 500,
        "grid_cs": 4,
    },
    "tiny": {  # the tests: every library, seconds in all
        "long_n": 4,
        "long_s": 0.005,
        "tail_n": 6,
        "tail_scale_s": 0.001,
        "image_mb": 1,
        "image_tasks": 3,
        "passes": 1,
        "docs": 6,
        "words": 200,
        "init_s": 0.01,
        "evals": 4,
        "eval_s": 0.002,
        "returns": 3,
        "return_mb": 0.1,
        "grid_samples": 120,
        "grid_cs": 2,
    },
}


def tail_durations(n: int, scale_s: float, seed: int = 31) -> list[float]:
    """Seeded Pareto(1.5) task lengths: most short, a few ten times the median or more."""
    import random

    rng = random.Random(seed)
    return [scale_s * min(rng.paretovariate(1.5), 60.0) for _ in range(n)]


def inputs(workload: str, size: dict[str, Any]) -> dict[str, Any]:
    """What the workload's caller holds before its pool starts (made before the clock)."""
    if workload in ("long", "long-gen"):
        return {"items": [(i, size["long_s"]) for i in range(size["long_n"])]}
    if workload == "tail":
        durations = tail_durations(size["tail_n"], size["tail_scale_s"])
        return {"items": list(enumerate(durations))}
    if workload in ("partial", "closure", "argument"):
        image = work.make_image(size["image_mb"])
        return {"image": image, "ks": list(range(size["image_tasks"])), "passes": size["passes"]}
    if workload == "state":
        return {"docs": work.make_docs(size["docs"], size["words"])}
    if workload == "init":
        items = [(i, size["eval_s"]) for i in range(size["evals"])]
        return {"items": items, "load_s": size["init_s"]}
    if workload == "returns":
        # The caller receives arrays: NumPy is imported, as in any script that works on
        # them.  Imported on the clock instead, by the first result's unpickling, it put
        # ~0.07 s of import into every row, and into the serial run's first task (so the
        # ideal read 0.12-0.26 s), and a fork-based pool's workers imported it again.
        import numpy  # noqa: F401

        n = int(size["return_mb"] * 1e6 / 8)
        return {"items": [(seed, n) for seed in range(size["returns"])]}
    if workload == "gridsearch":
        from sklearn.datasets import make_classification

        X, y = make_classification(n_samples=size["grid_samples"], n_features=20, random_state=0)
        cs = [10.0**e for e in range(-2, -2 + size["grid_cs"])]
        return {"X": X, "y": y, "grid": {"C": cs, "gamma": ["scale"]}}
    raise ValueError(f"unknown workload {workload!r}")


# ---- the libraries ------------------------------------------------------------------------


class Library:
    """A library's idioms; every method starts its pool and ends its exit."""

    modules: tuple[str, ...] = ()  # what must be importable (imported before the clock)
    grid_backend: str | None = None  # joblib's backend name for the gridsearch workload

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        raise NotImplementedError

    def map_arg(self, image: Any, ks: list[int], passes: int) -> list[Any]:
        """filter_image(image, k, passes) for each k, the image passed as an argument."""
        return self.map(_Star(work.filter_image), [(image, k, passes) for k in ks])

    def state(self, docs: list[str]) -> Counter[str]:
        """No per-worker state API: each task's counts, merged here."""
        total: Counter[str] = Counter()
        for counts in self.map(work.count_doc, docs):
            total.update(counts)
        return total

    def init(self, items: list[Any], load_s: float) -> list[Any]:
        """No initializer: each worker loads the model in its first task (a global)."""
        return self.map(functools.partial(work.evaluate_lazy, load_s=load_s), items)

    def grid(self, X: Any, y: Any, grid: dict[str, Any]) -> Any:
        raise NotApplicable


class NotApplicable(Exception):
    """This workload has no form in this library (GridSearchCV outside joblib)."""


class _Star:
    """fn(*item): the argument tuple as one item, for maps that take one iterable."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, item: tuple[Any, ...]) -> Any:
        return self.fn(*item)


class Serial(Library):
    """A loop in this process: the compute the ideal is made of, timed task by task."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.parts: dict[str, Any] = {"tasks": [], "fixed": 0.0, "copy": 0.0}

    def _timed(self, fn: Callable[[Any], Any], item: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(item)
        self.parts["tasks"].append(time.perf_counter() - t0)
        return out

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        return [self._timed(fn, x) for x in items]

    def map_arg(self, image: Any, ks: list[int], passes: int) -> list[Any]:
        t0 = time.perf_counter()
        image.copy()  # one copy of the input into memory the workers see: the ideal's copy
        self.parts["copy"] = time.perf_counter() - t0
        return super().map_arg(image, ks, passes)

    def state(self, docs: list[str]) -> Counter[str]:
        work.init_counts()
        self.map(work.count_into_state, docs)
        return work.take_counts()[1] or Counter()

    def init(self, items: list[Any], load_s: float) -> list[Any]:
        t0 = time.perf_counter()
        work.init_model(load_s)
        self.parts["fixed"] = time.perf_counter() - t0  # every worker loads it: not divided
        return self.map(work.evaluate, items)

    def grid(self, X: Any, y: Any, grid: dict[str, Any]) -> Any:
        search = _search(grid, 1)
        search.fit(X, y)
        # the fits divide among the workers, the refit on the best parameters does not
        self.parts["fixed"] = search.refit_time_
        self.parts["parallel_s"] = None  # filled by main from the total
        return search


class FastpoolPool(Library):
    # `import fastpool` defers fastpool.pool to the first `fastpool.Pool`; `from fastpool
    # import Pool` imports it at once.  It is the library's import, off the clock as for
    # the other rows (joblib[fastpool] imports it through fastpool.joblib).  fastpool.mp's
    # row keeps its laziness: multiprocessing's Pool imports multiprocessing.pool late too.
    modules = ("fastpool", "fastpool.pool")

    def _pool(self, **kw: Any) -> Any:
        import fastpool

        return fastpool.Pool(self.workers, **kw)

    def map(self, fn, items):
        with self._pool() as pool:
            return list(pool.map(fn, items))

    def map_arg(self, image, ks, passes):
        from itertools import repeat

        with self._pool() as pool:
            shared = pool.share(image, readonly=True)
            return list(pool.map(work.filter_image, repeat(shared), ks, repeat(passes)))

    def state(self, docs):
        with self._pool(initializer=work.init_counts) as pool:
            for _ in pool.map(work.count_into_state, docs):
                pass
            return _merge(_gather_fastpool(pool))

    def init(self, items, load_s):
        with self._pool(initializer=work.init_model, initargs=(load_s,)) as pool:
            return list(pool.map(work.evaluate, items))


def _gather_fastpool(pool: Any) -> list[Any]:
    """Every live worker's counts, through Pool.run_on_workers ({slot: (pid, counts)})."""
    return [counts for _pid, counts in pool.run_on_workers(work.take_counts).values()]


def _merge(parts: Iterable[Counter[str] | None]) -> Counter[str]:
    total: Counter[str] = Counter()
    for counts in parts:
        total.update(counts or {})
    return total


class MpPool(Library):
    """multiprocessing.Pool: map for a list, imap for a generator (map would list it)."""

    modules = ("multiprocessing",)

    def _module(self) -> Any:
        import multiprocessing

        return multiprocessing

    def map(self, fn, items):
        with self._module().Pool(self.workers) as pool:
            if isinstance(items, list):
                return pool.map(fn, items)
            return list(pool.imap(fn, items))

    def map_arg(self, image, ks, passes):
        with self._module().Pool(self.workers) as pool:
            return pool.starmap(work.filter_image, [(image, k, passes) for k in ks])

    def init(self, items, load_s):
        with self._module().Pool(self.workers, work.init_model, (load_s,)) as pool:
            return pool.map(work.evaluate, items)


class FastpoolMp(MpPool):
    """fastpool.mp.Pool: the multiprocessing code with the import changed."""

    modules = ("fastpool.mp",)

    def _module(self) -> Any:
        import fastpool.mp

        return fastpool.mp


class Ppe(Library):
    modules = ("concurrent.futures",)

    def _pool(self, **kw: Any) -> Any:
        from concurrent.futures import ProcessPoolExecutor

        return ProcessPoolExecutor(self.workers, **kw)

    def map(self, fn, items):
        with self._pool() as ex:
            return list(ex.map(fn, items))

    def map_arg(self, image, ks, passes):
        from itertools import repeat

        with self._pool() as ex:
            return list(ex.map(work.filter_image, repeat(image), ks, repeat(passes)))

    def init(self, items, load_s):
        with self._pool(initializer=work.init_model, initargs=(load_s,)) as ex:
            return list(ex.map(work.evaluate, items))


class Joblib(Library):
    """Parallel(n_jobs)(delayed(f)(x) for x in items) on one backend, its workers shut
    down at the end (interpreter exit would do it otherwise, after the clock)."""

    modules = ("joblib",)
    backend = "loky"
    grid_backend = "loky"

    def _config(self) -> Any:
        import joblib

        return joblib.parallel_config(backend=self.backend, n_jobs=self.workers)

    def map(self, fn, items):
        from joblib import Parallel, delayed

        try:
            with self._config():
                return Parallel()(delayed(fn)(x) for x in items)
        finally:
            self._shutdown()

    def map_arg(self, image, ks, passes):
        from joblib import Parallel, delayed

        try:
            with self._config():
                return Parallel()(delayed(work.filter_image)(image, k, passes) for k in ks)
        finally:
            self._shutdown()

    def grid(self, X, y, grid):
        search = _search(grid, self.workers)
        try:
            with self._config():
                search.fit(X, y)
        finally:
            self._shutdown()
        return search

    def _shutdown(self) -> None:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=True)


class JoblibFastpool(Joblib):
    modules = ("joblib", "fastpool.joblib")
    backend = "fastpool"
    grid_backend = "fastpool"

    def _shutdown(self) -> None:
        import fastpool.joblib

        fastpool.joblib.shutdown()


class JoblibThreads(Joblib):
    backend = "threading"
    grid_backend = "threading"

    def _shutdown(self) -> None:
        pass


class Mpire(Library):
    """MPIRE's WorkerPool: shared_objects for a large array, worker_state with worker_init
    and worker_exit for state and models."""

    modules = ("mpire",)

    def _pool(self, **kw: Any) -> Any:
        from mpire import WorkerPool

        return WorkerPool(n_jobs=self.workers, **kw)

    def map(self, fn, items):
        # MPIRE unpacks a tuple item into arguments: a one-argument function's item is (x,)
        with self._pool() as pool:
            args = ((x,) for x in items) if _tuples(items) else items
            return pool.map(fn, args, iterable_len=_len(items), concatenate_numpy_output=False)

    def map_arg(self, image, ks, passes):
        with self._pool(shared_objects=image) as pool:
            return pool.map(functools.partial(work.filter_image, passes=passes), ks)

    def state(self, docs):
        with self._pool(use_worker_state=True) as pool:
            pool.map(
                work.count_with_state,
                docs,
                worker_init=work.mpire_init_counts,
                worker_exit=work.mpire_exit_counts,
            )
            return _merge(pool.get_exit_results())

    def init(self, items, load_s):
        with self._pool(use_worker_state=True) as pool:
            init = functools.partial(work.mpire_init_model, seconds=load_s)
            return pool.map(work.evaluate_with_state, [(x,) for x in items], worker_init=init)


def _len(items: Iterable[Any]) -> int | None:
    return len(items) if isinstance(items, list) else None


def _tuples(items: Iterable[Any]) -> bool:
    """Whether ``items`` (a list) holds tuples; a generator's items are taken to."""
    return not isinstance(items, list) or bool(items) and isinstance(items[0], tuple)


class Ray(Library):
    """ray.init(num_cpus=workers), remote functions (ray.put for a large array), actors for
    state and models, ray.shutdown() at the end."""

    modules = ("ray",)

    @contextlib.contextmanager
    def _ray(self) -> Any:
        import ray

        ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()

    def map(self, fn, items):
        with self._ray() as ray:
            remote = ray.remote(fn)
            return ray.get([remote.remote(x) for x in items])

    def map_arg(self, image, ks, passes):
        with self._ray() as ray:
            ref = ray.put(image)
            remote = ray.remote(work.filter_image)
            return ray.get([remote.remote(ref, k, passes) for k in ks])

    def _actors(self, ray: Any, cls: type, *args: Any) -> list[Any]:
        return [ray.remote(cls).remote(*args) for _ in range(self.workers)]

    def state(self, docs):
        from ray.util import ActorPool

        with self._ray() as ray:
            actors = self._actors(ray, _CountActor)
            list(ActorPool(actors).map_unordered(lambda a, d: a.add.remote(d), docs))
            return _merge(ray.get([a.counts.remote() for a in actors]))

    def init(self, items, load_s):
        from ray.util import ActorPool

        with self._ray() as ray:
            actors = self._actors(ray, _ModelActor, load_s)
            return list(ActorPool(actors).map(lambda a, x: a.evaluate.remote(x), items))


class _CountActor:
    def __init__(self) -> None:
        self.total: Counter[str] = Counter()

    def add(self, doc: str) -> int:
        words = doc.split()
        self.total.update(words)
        return len(words)

    def counts(self) -> Counter[str]:
        return self.total


class _ModelActor:
    def __init__(self, load_s: float) -> None:
        self.model = work.load_model(load_s)

    def evaluate(self, item: tuple[int, float]) -> int:
        return work.evaluate_on(self.model, item)


class Dask(Library):
    """dask.distributed on a LocalCluster of single-threaded worker processes: client.map
    and client.gather, client.scatter for a large array, client.run for per-worker state
    and models."""

    modules = ("dask.distributed",)

    @contextlib.contextmanager
    def _client(self) -> Any:
        from dask.distributed import Client, LocalCluster

        with (
            LocalCluster(
                n_workers=self.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
            ) as cluster,
            Client(cluster) as client,
        ):
            yield client

    def map(self, fn, items):
        with self._client() as client:
            # client.map takes sequences: a generator is listed first, as its users do
            return client.gather(client.map(fn, list(items)))

    def map_arg(self, image, ks, passes):
        with self._client() as client:
            shared = client.scatter(image, broadcast=True)
            return client.gather(
                client.map(work.filter_image, [shared] * len(ks), ks, passes=passes)
            )

    def state(self, docs):
        with self._client() as client:
            client.run(work.init_counts)
            client.gather(client.map(work.count_into_state, docs))
            return _merge(counts for _pid, counts in client.run(work.take_counts).values())

    def init(self, items, load_s):
        with self._client() as client:
            client.run(work.init_model, load_s)
            return client.gather(client.map(work.evaluate, items))


LIBRARIES: dict[str, type[Library]] = {
    "fastpool.Pool": FastpoolPool,
    "fastpool.mp.Pool": FastpoolMp,
    "joblib[fastpool]": JoblibFastpool,
    "MPIRE": Mpire,
    "joblib[loky]": Joblib,
    "Ray": Ray,
    "Dask": Dask,
    "mp.Pool": MpPool,
    "PPE": Ppe,
    "joblib[threads]": JoblibThreads,
    "serial": Serial,
}
GRID_LIBRARIES = ("joblib[fastpool]", "joblib[loky]", "joblib[threads]", "serial")
MAP_LIBRARIES = tuple(name for name in LIBRARIES if name != "joblib[threads]")
SERIAL = "serial"


def missing(library: str, workload: str) -> str | None:
    """Why ``library`` cannot run ``workload`` here (a module not installed), or None."""
    import importlib.util

    def absent(name: str) -> bool:
        # A bare folder of that name on sys.path (Ray's own /tmp/ray, beside a bench run
        # from /tmp) is a namespace package, not the library: its trials failed with
        # ModuleNotFoundError or AttributeError instead of reading "not installed".
        spec = importlib.util.find_spec(name)
        return spec is None or spec.origin in (None, "namespace")

    needs = LIBRARIES[library].modules + (("sklearn",) if workload == "gridsearch" else ())
    for module in needs:
        top = module.split(".")[0]
        if absent(top):
            return f"{top} is not installed (pip install 'fastpool[bench]')"
        if module != top and absent(module):
            return f"{module} is not installed (pip install 'fastpool[bench]')"
    return None


def _search(grid: dict[str, Any], n_jobs: int) -> Any:
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    return GridSearchCV(SVC(), grid, cv=3, n_jobs=n_jobs)


# ---- one run ------------------------------------------------------------------------------


def run(library: str, workload: str, size: dict[str, Any], workers: int) -> dict[str, Any]:
    """Run it here: {"seconds": ...} (and "parts" for serial), or {"fails": name, ...}."""
    lib = LIBRARIES[library](workers)
    for module in lib.modules:
        __import__(module)  # the library's import is not the pool's start
    data = inputs(workload, size)
    call = _workload_call(lib, workload, data)
    t0 = time.perf_counter()
    try:
        got = call()
    except NotApplicable:
        return {"skip": "no form in this library"}
    except Exception as exc:  # noqa: BLE001 - the library's failure is the row's result
        return {
            "fails": type(exc).__name__,
            "message": str(exc)[:300],
            "traceback": traceback.format_exc(limit=-3)[-1500:],
        }
    seconds = time.perf_counter() - t0
    _check(workload, data, got)
    out: dict[str, Any] = {"seconds": seconds}
    if isinstance(lib, Serial):
        out["parts"] = lib.parts
        if workload == "gridsearch":
            out["parts"]["tasks"] = [seconds - lib.parts["fixed"]]
            out["parts"]["divisible"] = True
    return out


def _workload_call(lib: Library, workload: str, data: dict[str, Any]) -> Callable[[], Any]:
    if workload in ("long", "tail", "returns"):
        fn = work.spin_item if workload != "returns" else work.make_array
        return lambda: lib.map(fn, data["items"])
    if workload == "long-gen":
        return lambda: lib.map(work.spin_item, (x for x in data["items"]))
    if workload == "partial":
        bound = functools.partial(work.filter_image, data["image"], passes=data["passes"])
        return lambda: lib.map(bound, data["ks"])
    if workload == "closure":
        image, passes = data["image"], data["passes"]

        def filter_k(k: int) -> tuple[int, float]:
            return work.filter_image(image, k, passes)

        return lambda: lib.map(filter_k, data["ks"])
    if workload == "argument":
        return lambda: lib.map_arg(data["image"], data["ks"], data["passes"])
    if workload == "state":
        return lambda: lib.state(data["docs"])
    if workload == "init":
        return lambda: lib.init(data["items"], data["load_s"])
    if workload == "gridsearch":
        return lambda: lib.grid(data["X"], data["y"], data["grid"])
    raise ValueError(f"unknown workload {workload!r}")


def _check(workload: str, data: dict[str, Any], got: Any) -> None:
    """The results are the right ones, in order: a fast wrong answer is no result."""
    if workload in ("long", "long-gen", "tail"):
        assert list(got) == [i for i, _ in data["items"]], "wrong or reordered results"
    elif workload in ("partial", "closure", "argument"):
        assert [k for k, _ in got] == data["ks"], "wrong or reordered results"
        assert len({round(v, 3) for _, v in got}) == len(got), "filters gave equal responses"
    elif workload == "state":
        assert sum(got.values()) == sum(len(d.split()) for d in data["docs"]), "counts lost"
    elif workload == "init":
        assert list(got) == [3 * i for i, _ in data["items"]], "wrong model results"
    elif workload == "returns":
        assert [int(a[0]) for a in got] == [s for s, _ in data["items"]], "wrong arrays"
        assert all(a.size == n for a, (_, n) in zip(got, data["items"])), "wrong sizes"
    elif workload == "gridsearch":
        assert got.best_params_["C"] in data["grid"]["C"], "no best parameters"


def main(argv: list[str]) -> None:
    library, workload, size, workers = argv
    print(json.dumps(run(library, workload, SIZES[size], int(workers))), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
