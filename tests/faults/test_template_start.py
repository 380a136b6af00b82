"""How the template starts: forked when that is safe (a parent that imported NumPy,
whose only other threads are OpenBLAS's), spawned otherwise (a big parent, a native
thread, or FASTPOOL_TEMPLATE_START=spawn); what a forked one inherits, and what it
must not do again.

Each test runs a script in a fresh interpreter: the fork decision depends on the
threads of the process that makes the first pool, and pytest's own process runs
faulthandler's watchdog thread (so its templates are spawned).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.faults, pytest.mark.linux]

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 120


def _run(tmp_path, body: str, *flags: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body).replace("TESTS_DIR", repr(TESTS_DIR)))
    full_env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    full_env.update(env)
    out = subprocess.run(
        [sys.executable, *flags, str(script)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=full_env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    return out


_BLAS_THREADS = """
    import os, sys, threading
    sys.path.insert(0, TESTS_DIR)
    import numpy as np
    import fastpool, _tasks
    from fastpool._runtime import _forksafe, _template

    def thread_names():
        names = []
        for tid in sorted(os.listdir("/proc/self/task")):
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        return names

    if __name__ == "__main__":
        a = np.ones((400, 400))
        a @ a  # OpenBLAS's pool has run a job
        before = _forksafe.os_threads()
        from threadpoolctl import threadpool_info
        blas = [
            (i["internal_api"], i["threading_layer"], i["num_threads"]) for i in threadpool_info()
        ]
        assert threading.active_count() == 1
        print("before", before, blas, thread_names(), file=sys.stderr)
        with fastpool.Pool(2) as p:
            assert p.submit(_tasks.add, 1, 2).result(timeout=60) == 3
            assert p.submit(_tasks.blas_matmul, 300).result(timeout=60) == 300.0
            t = _template.template()
            kind, tpid = type(t._proc).__name__, t.pid
            assert p.map(_tasks.double, range(8)) is not None
            restarts, crashed = p.stats()["restarts"], p.stats()["crashed"]
            assert t.pid == tpid  # the template never died and was replaced
        a @ a  # the parent's BLAS pool starts again on demand
        print(before, kind, restarts, crashed, _forksafe.os_threads())
"""


def test_a_parent_whose_only_other_threads_are_openblass_forks_its_template_without_a_warning(
    tmp_path,
):
    # -W error: on 3.12+ a fork beside a running thread raises DeprecationWarning here, in
    # the parent's Pool() or in the template's fork of a worker (that would kill the
    # template and show as a restart).  On 3.11 the warning does not exist, and the
    # test still checks that the fork happened with OpenBLAS's threads up just before.
    out = _run(tmp_path, _BLAS_THREADS, "-W", "error::DeprecationWarning", OPENBLAS_NUM_THREADS="2")
    before, kind, restarts, crashed, after = out.stdout.split()
    if int(before) < 2:
        pytest.skip(f"OpenBLAS started no thread here ({out.stderr.strip()})")
    assert (kind, restarts, crashed) == ("_ForkedProcess", "0", "0"), out.stderr
    assert int(after) == int(before)  # OpenBLAS brought its pool back in the parent
    assert "Warning" not in out.stderr


def test_a_parent_running_another_native_thread_beside_openblas_still_spawns(tmp_path):
    # faulthandler's watchdog is a C thread that threading does not list: the checked
    # fork sees it (the kernel's count, CPython's warning recorded, not raised), kills
    # that child and spawns the template instead.
    body = _BLAS_THREADS.replace(
        "a @ a  # OpenBLAS's pool has run a job",
        "a @ a\n        import faulthandler; faulthandler.dump_traceback_later(600)",
    )
    out = _run(tmp_path, body, "-W", "error::DeprecationWarning", OPENBLAS_NUM_THREADS="2")
    before, kind, restarts, crashed, _after = out.stdout.split()
    assert int(before) >= 2
    assert (kind, restarts, crashed) == ("Popen", "0", "0"), out.stderr
    assert "Warning" not in out.stderr


_MAIN_ONCE = """
    import os, sys
    sys.path.insert(0, TESTS_DIR)
    import numpy as np
    import fastpool
    from fastpool._runtime import _template

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs.txt"), "a") as f:
        f.write(f"{os.getpid()}\\n")  # top-level code: runs once per import of this script

    class Point:
        def __init__(self, x):
            self.x = x

    def get_x(p):
        return p.x * np.float64(2)

    if __name__ == "__main__":
        with fastpool.Pool(2) as p:
            assert [p.submit(get_x, Point(i)).result(timeout=60) for i in range(4)] == [0, 2, 4, 6]
            print(type(_template.template()._proc).__name__)
"""


@pytest.mark.parametrize(
    "method, kind, runs",
    [
        ("", "_ForkedProcess", 1),  # the fork already holds __main__: it is not run again
        (
            "spawn",
            "Popen",
            2,
        ),  # a new interpreter imports it as __mp_main__ (multiprocessing's rule)
    ],
)
def test_the_main_script_runs_again_only_in_a_spawned_template(tmp_path, method, kind, runs):
    out = _run(tmp_path, _MAIN_ONCE, FASTPOOL_TEMPLATE_START=method)
    assert out.stdout.split() == [kind]
    pids = (tmp_path / "runs.txt").read_text().split()
    assert len(pids) == runs, pids


LOG_FILES = 12
_INHERITED_LOG = """
    import logging, os, sys
    sys.path.insert(0, TESTS_DIR)
    import numpy as np
    import fastpool, _tasks
    from fastpool._runtime import _template

    if __name__ == "__main__":
        here = os.path.dirname(os.path.abspath(__file__))
        root = logging.getLogger()
        root.setLevel(logging.INFO)
        # Open before the template, several of them: the low fd numbers they hold are the
        # ones a worker's shared-memory descriptors would otherwise be given.
        for i in range(LOG_FILES):
            root.addHandler(logging.FileHandler(os.path.join(here, f"parent{i}.log")))
        logging.getLogger("parent").info("before the pool")
        with fastpool.Pool(1) as p:
            assert type(_template.template()._proc).__name__ == "_ForkedProcess"
            for _ in range(5):
                p.submit(_tasks.log_lines, 50).result(timeout=60)
            assert p.submit(_tasks.root_handler_count).result(timeout=60) == 0
            big = np.arange(1 << 16, dtype=np.float64)  # travels through the arena
            for i in range(50):
                assert p.submit(_tasks.add, i, 1).result(timeout=60) == i + 1
                assert p.submit(_tasks.identity, big).result(timeout=60).sum() == big.sum()
            stats = p.stats()
        logging.getLogger("parent").info("after the pool")
        print(stats["crashed"], stats["restarts"], stats["calls_completed"])
"""


def test_a_task_logging_through_a_handler_inherited_by_a_forked_template_leaves_the_pool_healthy(
    tmp_path,
):
    out = _run(tmp_path, _INHERITED_LOG.replace("LOG_FILES", str(LOG_FILES)))
    assert out.stdout.split() == ["0", "0", "106"], out.stderr
    assert "Logging error" not in out.stderr
    for i in range(LOG_FILES):  # nothing a worker wrote reached the parent's files
        assert (tmp_path / f"parent{i}.log").read_text().splitlines() == [
            "before the pool",
            "after the pool",
        ]


_START = """
    import os, sys
    sys.path.insert(0, TESTS_DIR)
    import fastpool, _tasks
    from fastpool._runtime import _template
    if __name__ == "__main__":
        import numpy as np
        ballast = np.ones(int(os.environ["BALLAST_MIB"]) * 2**17)  # a big parent is not forked
        if os.environ.get("NATIVE_THREAD") == "1":
            import faulthandler
            faulthandler.dump_traceback_later(600)  # a C thread that threading does not list
        r, w = os.pipe()  # opened before the template: it must not keep w open
        with fastpool.Pool(2) as p:
            assert sorted(p.map(_tasks.double, range(10))) == [2 * i for i in range(10)]
            tpid = _template.template().pid
            os.close(w)
            assert os.read(r, 1) == b"", "the template holds the parent's pipe open"
            kind = type(_template.template()._proc).__name__
        print(kind, tpid != os.getpid(), flush=True)
"""


@pytest.mark.parametrize(
    "method, ballast_mib, native_thread, proc_type",
    [
        ("", 0, False, "_ForkedProcess"),
        ("spawn", 0, False, "Popen"),
        ("", 400, False, "Popen"),  # a big parent would be pinned by a forked template
        ("", 0, True, "Popen"),  # forking beside a native thread is unsafe (CPython 3.12+ warns)
    ],
)
def test_template_start_methods(tmp_path, method, ballast_mib, native_thread, proc_type):
    # one BLAS thread: the parent then runs no native thread, and forking it is safe
    out = _run(
        tmp_path,
        _START,
        FASTPOOL_TEMPLATE_START=method,
        BALLAST_MIB=str(ballast_mib),
        OPENBLAS_NUM_THREADS="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        NATIVE_THREAD="1" if native_thread else "0",
    )
    assert out.stdout.split() == [proc_type, "True"]


_LATE_THREAD = """
    import sys
    sys.path.insert(0, TESTS_DIR)
    import numpy
    import fastpool, _tasks
    from fastpool._runtime import _forksafe, _template

    real, seen = _forksafe.fork_checked, []

    def fork_checked():
        # the first BAD forks are reported as made beside another thread (as when the
        # kernel still counts a thread OpenBLAS's fork handler has just joined)
        pid, alone = real()
        if pid:
            seen.append(pid)
        return pid, alone and len(seen) > BAD

    _forksafe.fork_checked = fork_checked
    if __name__ == "__main__":
        with fastpool.Pool(1) as p:
            assert p.submit(_tasks.double, 21).result(timeout=60) == 42
            how = _template.template().how
        print(type(_template.template()._proc).__name__, len(seen), how[0], "|", how[1])
"""


@pytest.mark.parametrize(
    "bad, kind, forks, how",
    [
        (1, "_ForkedProcess", 2, "fork"),  # the second fork finds it alone
        (2, "Popen", 2, "spawn"),  # beside a thread twice: spawned, and says why
    ],
)
def test_a_fork_found_beside_another_thread_is_tried_once_more(tmp_path, bad, kind, forks, how):
    out = _run(tmp_path, _LATE_THREAD.replace("BAD", str(bad)), OPENBLAS_NUM_THREADS="1")
    fields, why = out.stdout.split("|")
    assert fields.split() == [kind, str(forks), how], out.stdout
    if how == "spawn":
        assert "another thread ran at each of 2 forks" in why


def test_a_parent_that_never_imported_numpy_forks_a_template_without_it(tmp_path):
    # The template used to import NumPy whatever the parent had: 0.2-0.3 s that a first
    # pool's constructor waited for, in a script that never uses NumPy (a Manager-proxy
    # batch).  A task that imports it still gets arrays back, through the worker's hook.
    out = _run(
        tmp_path,
        """
        import sys
        sys.path.insert(0, TESTS_DIR)
        import fastpool
        from fastpool._runtime import _template

        def numpy_loaded(_=None):
            return "numpy" in sys.modules

        def ramp(n):
            import numpy as np
            return np.arange(n, dtype=np.float64)

        if __name__ == "__main__":
            before = numpy_loaded()
            with fastpool.Pool(2) as p:
                loaded = p.run_on_workers(numpy_loaded)
                arrays = [p.submit(ramp, 1 << 19).result(timeout=60) for _ in range(3)]
                want = float((1 << 19) * ((1 << 19) - 1) // 2)
                assert all(float(a.sum()) == want for a in arrays)
                print(_template.template().how[0], sorted(loaded.values()), before)
        """,
    )
    assert out.stdout.split() == ["fork", "[False,", "False]", "False"]


def test_a_forked_templates_workers_run_one_openmp_thread_when_the_parent_loaded_openmp(tmp_path):
    # scikit-learn maps its own libgomp into the parent; the template sets it to one
    # thread (omp_set_num_threads through ctypes, not threadpoolctl: 8-16 ms of the
    # first pool's start) and every worker forked from it inherits that count.  Without
    # the call, OpenMP's default is one thread per CPU.
    pytest.importorskip("sklearn")
    pytest.importorskip("threadpoolctl")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: OpenMP's default count is already 1")
    out = _run(
        tmp_path,
        """
        import sys
        import sklearn.svm  # noqa: F401 - maps scikit-learn's OpenMP runtime
        import fastpool
        from fastpool._runtime import _forksafe, _template

        def openmp_threads(_=None):
            from threadpoolctl import threadpool_info
            return sorted(i["num_threads"] for i in threadpool_info() if i["user_api"] == "openmp")

        if __name__ == "__main__":
            mapped = any("omp" in p.rsplit("/", 1)[-1] for p in _forksafe.mapped_libraries())
            parent = openmp_threads()
            with fastpool.Pool(2, blas_threads=1) as p:
                counts = p.run_on_workers(openmp_threads)
                print(_template.template().how[0], mapped, parent, sorted(counts.values()))
        """,
    )
    how, mapped, parent, workers = out.stdout.strip().split(" ", 3)
    if mapped != "True":
        pytest.skip(f"this scikit-learn maps no OpenMP runtime ({out.stdout.strip()})")
    assert how == "fork", out.stdout
    assert parent != "[1]", f"the parent's OpenMP already ran one thread: {out.stdout}"
    assert workers == "[[1], [1]]", out.stdout


def test_a_forked_templates_workers_run_one_openblas_thread_and_the_parents_pool_stays_stopped(
    tmp_path,
):
    # The template's OpenBLAS is set to one thread in the child (its exported count), so
    # the parent's is never set and set back: that restarted the parent's pool at once,
    # and each of its threads spun ~0.1 s beside the first pool's starting workers.
    # The fork stopped the parent's pool; its next BLAS call starts it again.  A build
    # that hides its count (NumPy 2.5's OpenBLAS 0.3.34) is still set the old way: its
    # workers run one thread all the same, and its parent's pool runs again at once.
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: OpenBLAS runs no pool threads")
    out = _run(
        tmp_path,
        """
        import sys, threading
        import numpy as np
        import fastpool
        from fastpool._runtime import _forksafe, _template

        def openblas_counts(_=None):
            from fastpool._runtime import _forksafe
            return sorted(_forksafe._openblas_call(lib, "get_num_threads")()
                          for lib in _forksafe.openblas_pools())

        def native_threads():  # threads Python did not start: OpenBLAS's pool
            return _forksafe.os_threads() - threading.active_count()

        if __name__ == "__main__":
            a = np.ones((400, 400))
            a @ a
            up = native_threads()
            libs = _forksafe.openblas_pools()
            hidden = any(_forksafe.exported_count(lib) is None for lib in libs)
            with fastpool.Pool(2, blas_threads=1) as p:
                workers = sorted(map(tuple, p.run_on_workers(openblas_counts).values()))
                during = native_threads()
                counts = openblas_counts()
                a @ a
                again = native_threads()
            print(_template.template().how[0], hidden, up, during, again, counts, workers)
        """,
    )
    how, hidden, up, during, again, rest = out.stdout.strip().split(" ", 5)
    if int(up) < 1:
        pytest.skip(f"OpenBLAS started no pool thread here ({out.stdout.strip()})")
    assert how == "fork", out.stdout
    counts, workers = rest.split("] ", 1)
    if hidden == "False":
        assert during == "0", f"the parent's OpenBLAS pool ran again at the start: {out.stdout}"
    assert int(again) == int(up), out.stdout  # the next BLAS call brought it back
    assert "1" not in counts.strip("[]").split(", "), out.stdout  # the parent kept its count
    assert workers == "[(1,), (1,)]", out.stdout
