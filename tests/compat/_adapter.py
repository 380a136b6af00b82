"""What the adapters for CPython's own suites share: each test in a child process, a journal
of outcomes, and the verdict against the adapter's lists of skips and expected failures.

An adapter (cpython_futures.py, cpython_mp.py) is a script run by the 3.13 interpreter that
has fastpool installed; it imports this module from its own folder. It gives ``main`` a
function that builds its ``unittest`` suite and its ``EXPECTED_FAILURES``; ``main`` runs the
tests in child processes (a child that dies marks its test "crashed" with its exit status and a
fresh child goes on with the rest), counts the outcomes and exits 0 when every test passed, was
skipped with a reason or failed as expected, and 1 otherwise (an unexpected failure, or an
expected failure that now passes). With ``--json`` it writes the counts and each outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import unittest
from collections.abc import Callable, Iterable, Mapping
from typing import Any

BuildSuite = Callable[[argparse.Namespace], unittest.TestSuite]
KeyOf = Callable[[unittest.TestCase], str]


def class_and_method(prefix: str = "") -> KeyOf:
    """A test's id: its class name (without ``prefix``), a dot, its method."""

    def key_of(test: unittest.TestCase) -> str:
        return f"{type(test).__name__.removeprefix(prefix)}.{test._testMethodName}"

    return key_of


def skipped(mixin: type, skips: Mapping[str, str], name: str) -> dict[str, object]:
    """Class attributes that skip, each with its reason, the methods of ``mixin`` listed in
    ``skips`` under ``name.method``."""
    attrs: dict[str, object] = {}
    loader = unittest.TestLoader()
    for attr in loader.getTestCaseNames(type("_probe", (mixin, unittest.TestCase), {})):
        key = f"{name}.{attr}"
        if key in skips:
            attrs[attr] = unittest.skip(skips[key])(getattr(mixin, attr))
    return attrs


def python_ok_with(original: Callable[..., Any], replacements: Iterable[tuple[str, str]]):
    """``assert_python_ok`` for tests that run child scripts: the script's text gets
    ``replacements`` (the imports that name the class under test), and the child's
    PYTHONPATH is this folder (the adapters) and ours, so that it finds the adapter and the
    same fastpool."""
    replacements = tuple(replacements)

    def run(*args: str, **env: Any):
        for old, new in replacements:
            args = tuple(a.replace(old, new) for a in args)
        env.setdefault("__isolated", False)
        path = [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]
        env.setdefault("PYTHONPATH", os.pathsep.join(filter(None, path)))
        return original(*args, **env)

    return run


class _Result(unittest.TextTestResult):
    """Appends each test's start and outcome to a journal, one JSON line each, so that the
    runner knows which test was running if this process dies (a crash that kills the parent
    is a finding too, not the end of the run)."""

    journal: Any = None
    key_of: KeyOf = staticmethod(class_and_method())
    # a test still running after this many seconds is recorded "timed out" (with every
    # thread's stack) and its process ends; a fresh one goes on with the rest
    limit_s: float = 120.0
    _watchdog: Any = None

    def _log(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        self.journal.write(json.dumps([type(self).key_of(test), outcome, detail]) + "\n")
        self.journal.flush()

    def startTest(self, test):
        self._log(test, "started")
        self._subtest_failures: list[str] = []
        self._watchdog = threading.Timer(self.limit_s, self._timed_out, (test,))
        self._watchdog.daemon = True
        self._watchdog.start()
        super().startTest(test)

    def stopTest(self, test):
        self._watchdog.cancel()
        # a test whose subtests failed gets neither addSuccess nor addFailure
        if self._subtest_failures:
            self._log(test, "failed", "\n".join(self._subtest_failures)[-2000:])
        super().stopTest(test)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._subtest_failures.append(
                f"{subtest._subDescription()}: " + self._exc_info_to_string(err, test)[-1000:]
            )

    def _timed_out(self, test: unittest.TestCase) -> None:
        frames = sys._current_frames()
        stacks = "".join(
            f"thread {t.name}:\n" + "".join(traceback.format_stack(frames[t.ident]))
            for t in threading.enumerate()
            if t.ident in frames and t is not threading.current_thread()
        )
        self._log(test, "timed out", f"still running after {self.limit_s:.0f} s\n{stacks}"[-4000:])
        os._exit(3)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._log(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._log(test, "failed", self.failures[-1][1][-2000:])

    def addError(self, test, err):
        super().addError(test, err)
        self._log(test, "error", self.errors[-1][1][-2000:])

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._log(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._log(test, "expected failure")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._log(test, "unexpected success")


def _tests(suite: unittest.TestSuite) -> Iterable[unittest.TestCase]:
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _tests(t)
        else:
            yield t


def _run_child(
    suite: unittest.TestSuite, key_of: KeyOf, ids: list[str], journal: str, verbose: bool
) -> None:
    """Runs the tests named by ``ids`` in this process, journaling each. The tests keep their
    classes and modules, so class and module fixtures run as unittest runs them."""
    wanted = set(ids)
    chosen = unittest.TestSuite(t for t in _tests(suite) if key_of(t) in wanted)
    with open(journal, "a") as f:
        result = type("_JournalResult", (_Result,), {"journal": f, "key_of": staticmethod(key_of)})
        unittest.TextTestRunner(
            verbosity=2 if verbose else 1, resultclass=result, stream=sys.stderr
        ).run(chosen)


def _run(
    script: str, child_args: list[str], ids: list[str], verbose: bool, log=sys.stderr
) -> dict[str, list[str]]:
    """Runs ``ids`` in child processes; a child that dies marks its current test "crashed"
    (with its exit status) and a new child goes on with the rest. Returns id -> [outcome,
    detail]."""
    outcomes: dict[str, list[str]] = {}
    remaining = list(ids)
    with tempfile.TemporaryDirectory(prefix="fastpool-cpython-") as tmp:
        journal = os.path.join(tmp, "journal.jsonl")
        while remaining:
            open(journal, "w").close()
            cmd = [sys.executable, script, *child_args, "--child", journal]
            cmd += ["-v"] if verbose else []
            proc = subprocess.run(cmd + remaining, stdout=log, stderr=log)
            current = None
            with open(journal) as f:
                for line in f:
                    key, outcome, detail = json.loads(line)
                    if outcome == "started":
                        current = key
                    else:
                        outcomes[key] = [outcome, detail]
                        current = None
            if current is not None:  # died inside a test
                outcomes[current] = [
                    "crashed",
                    f"the test process died: exit status {proc.returncode}",
                ]
            elif proc.returncode != 0 and not any(k in outcomes for k in remaining):
                raise RuntimeError(f"the test process failed before any test: {proc.returncode}")
            remaining = [k for k in remaining if k not in outcomes]
    return outcomes


_COUNTED = (
    ("passed", "passed"),
    ("failed", "failed"),
    ("errors", "error"),
    ("crashed", "crashed"),
    ("timed_out", "timed out"),
    ("skipped", "skipped"),
    ("expected_failures", "expected failure"),
    ("unexpected_successes", "unexpected success"),
)
BAD = ("failed", "error", "crashed", "timed out", "unexpected success")


def main(
    argv: list[str] | None,
    *,
    script: str,
    description: str,
    build_suite: BuildSuite,
    key_of: KeyOf,
    expected_failures: Callable[[argparse.Namespace], Mapping[str, str]],
    either_way: Mapping[str, str] = {},
    options: Mapping[str, Mapping[str, Any]] = {},
    about: Callable[[argparse.Namespace], Mapping[str, Any]] = lambda args: {},
) -> int:
    """The adapter's command line. ``options`` are the adapter's own (``--name``: argparse
    keywords, each with a default), passed on to the child processes; ``expected_failures``
    and ``about`` (extra fields for the counts) see them too."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--json", help="write counts and outcomes to this file")
    parser.add_argument("-k", dest="pattern", help="run only tests whose id contains this")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    for name, kwargs in options.items():
        parser.add_argument(f"--{name}", **kwargs)
    parser.add_argument("ids", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _run_child(build_suite(args), key_of, args.ids, args.child, args.verbose)
        return 0
    child_args = [f"--{name}={getattr(args, name.replace('-', '_'))}" for name in options]
    ids = [key_of(t) for t in _tests(build_suite(args))]
    if args.pattern:
        ids = [k for k in ids if args.pattern in k]
    start = time.monotonic()
    outcomes = _run(os.path.abspath(script), child_args, ids, args.verbose)
    expected = expected_failures(args)
    for key, value in outcomes.items():
        if key in expected:
            if value[0] in ("failed", "error", "crashed"):
                value[0] = "expected failure"
            elif value[0] == "passed" and key not in either_way:
                value[0] = "unexpected success"
    values = [v[0] for v in outcomes.values()]
    counts: dict[str, Any] = {name: values.count(outcome) for name, outcome in _COUNTED}
    counts.update(
        seconds=round(time.monotonic() - start, 1),
        python=sys.version.split()[0],
        **about(args),
    )
    bad = {k: v for k, v in outcomes.items() if v[0] in BAD}
    for key, (outcome, detail) in sorted(bad.items()):
        print(f"{outcome.upper()}: {key}\n{detail}", file=sys.stderr)
    print(json.dumps(counts), file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"counts": counts, "outcomes": outcomes}, f, indent=1)
    return 0 if not bad else 1
