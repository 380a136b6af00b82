"""What ``__main__`` defines behaves as with ProcessPoolExecutor: classes from
``__main__`` come back from workers (a dataclass returned, an exception raised and caught
by its own ``except``), a global an ``initializer`` sets is seen by the task functions, and
worker tracebacks show the script's file and source lines. Each case is a real script run
as ``__main__`` in a subprocess; the functions travel by value, as a notebook's do."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# What the scripts define in __main__; each script then runs its checks through one API.
DEFINITIONS = textwrap.dedent("""
    import dataclasses
    import fastpool

    MODEL = None

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    class CalibrationError(Exception):
        pass

    def load(value):
        global MODEL
        MODEL = value

    def predict(x):
        return MODEL * x

    def make_point(x):
        return Point(x, 2 * x)

    def fail(x):
        raise CalibrationError(f"bad {x}")
""")

SCRIPT = DEFINITIONS + textwrap.dedent("""
    if __name__ == "__main__":
        with fastpool.Pool(2, initializer=load, initargs=(10,)) as pool:
            p = pool.submit(make_point, 3).result(timeout=60)
            assert type(p) is Point and p == Point(3, 6), (type(p), p)
            try:
                pool.submit(fail, 4).result(timeout=60)
            except CalibrationError as exc:
                assert str(exc) == "bad 4"
                tb = exc.__cause__.tb  # the script's file and source line, not <dynamic-code>
                assert 'analysis.py", line' in tb and 'raise CalibrationError(f"bad {x}")' in tb, tb
            else:
                raise AssertionError("no error")
            assert list(pool.map(predict, range(4))) == [0, 10, 20, 30]
            assert pool.submit(predict, 5).result(timeout=60) == 50
        print("OK")
""")


# The joblib backend: its batches travel through the pool's codec, so they get the same
# __main__ handling (a class returned, an exception caught as itself, the globals the
# backend's initializer= sets).
JOBLIB_SCRIPT = DEFINITIONS + textwrap.dedent("""
    import joblib
    from joblib import Parallel, delayed
    import fastpool.joblib

    if __name__ == "__main__":
        with joblib.parallel_config(backend="fastpool", n_jobs=2, initializer=load, initargs=(10,)):
            points = Parallel()(delayed(make_point)(x) for x in range(3))
            assert [type(p) for p in points] == [Point] * 3 and points[2] == Point(2, 4), points
            try:
                Parallel()(delayed(fail)(x) for x in range(2))
            except CalibrationError as exc:
                assert str(exc).startswith("bad "), exc
            else:
                raise AssertionError("no error")
            assert Parallel()(delayed(predict)(x) for x in range(4)) == [0, 10, 20, 30]
        print("OK")
""")

# fastpool.mp's starmap, whose items cross as fn(*item) wrappers: the same handling.
STARMAP_SCRIPT = DEFINITIONS + textwrap.dedent("""
    import fastpool.mp

    if __name__ == "__main__":
        with fastpool.mp.Pool(2, initializer=load, initargs=(10,)) as pool:
            assert pool.starmap(predict, [(1,), (2,)]) == [10, 20]
            out = pool.starmap(make_point, [(3,)])
            assert type(out[0]) is Point and out == [Point(3, 6)], out
            try:
                pool.starmap(fail, [(4,)])
            except CalibrationError as exc:
                tb = exc.__cause__.tb  # the script's file and source line, not <dynamic-code>
                assert 'analysis.py", line' in tb and "<dynamic-code>" not in tb, tb
            else:
                raise AssertionError("no error")
        print("OK")
""")

# A spawned template runs the script as __mp_main__ (multiprocessing's rule): a __main__
# object a task gets and returns must come back as the parent's class.  The script
# imports no multiprocessing, whose import would set the parent's alias by itself.
SPAWN_SCRIPT = textwrap.dedent("""
    import dataclasses
    import enum
    import sys
    import fastpool

    class Color(enum.Enum):
        RED = 1

    @dataclasses.dataclass
    class Box:
        size: int

    def same(x):
        return x

    if __name__ == "__main__":
        with fastpool.Pool(2) as pool:
            for value in (Color.RED, Box(3), {"color": Color.RED, "box": Box(4)}):
                back = pool.submit(same, value).result(timeout=60)
                assert back == value, (back, value)
            assert pool.submit(same, Color.RED).result(timeout=60) is Color.RED
        print("OK", "multiprocessing" in sys.modules)
""")


def run_script(tmp_path, name, text, **env):
    script = tmp_path / name
    script.write_text(text)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    return proc.stdout


def test_main_classes_come_back_and_initializer_globals_are_seen(tmp_path):
    run_script(tmp_path, "analysis.py", SCRIPT)


def test_joblib_batches_get_the_same_main_handling(tmp_path):
    run_script(tmp_path, "analysis.py", JOBLIB_SCRIPT)


def test_mp_starmap_gets_the_same_main_handling(tmp_path):
    run_script(tmp_path, "analysis.py", STARMAP_SCRIPT)


def test_a_spawned_template_returns_main_objects_as_the_parents_classes(tmp_path):
    out = run_script(tmp_path, "colors.py", SPAWN_SCRIPT, FASTPOOL_TEMPLATE_START="spawn")
    assert "OK False" in out  # else multiprocessing's own alias would hide the defect
