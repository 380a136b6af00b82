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

SCRIPT = textwrap.dedent("""
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


def test_main_classes_come_back_and_initializer_globals_are_seen(tmp_path):
    script = tmp_path / "analysis.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
