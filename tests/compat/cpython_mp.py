"""Run CPython's own ``multiprocessing`` pool tests against ``fastpool.mp.Pool``.

Only this adapter lives in the repository: the tests come from the interpreter's own ``test``
package (``test._test_multiprocessing`` and ``test.test_multiprocessing_main_handling``;
pyenv's CPython 3.13 ships them). Run it with an interpreter that has both that package and
fastpool installed::

    python3.13 tests/compat/cpython_mp.py --start-method fork [--pool fastpool] [-v] [--json F]

The suite is the one CPython runs as ``test_multiprocessing_<method>.test_processes``, cut to
the pool tests: ``_TestPool``, ``_TestPoolWorkerErrors``, ``_TestPoolWorkerLifetime`` (with the
``processes`` mixin, as CPython installs them, module fixtures included), ``TestInitializers``,
and the ``test_multiprocessing_main_handling`` class of that start method. The start method is
the tests' own (their queues, managers and scripts use it); fastpool forks its workers from its
template whatever it is. ``--pool multiprocessing`` runs the same tests unchanged, the control.

With ``--pool fastpool`` the tests' ``Pool`` is ``fastpool.mp.Pool``: the mixin's ``Pool``, the
``multiprocessing.Pool`` that some tests call by name, and the ``from multiprocessing import
Pool`` of the scripts that the main-handling tests and one lifetime test run. Two kinds of test
do not count:

- ``SKIPPED``: tests that read ``multiprocessing.pool.Pool`` internals (``_pool``,
  ``_repopulate_pool``), each with its reason.
- ``EXPECTED_FAILURES``: deliberate differences, each with its reason; docs/multiprocessing.md
  lists the same ones (tests/docs checks the mirror).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import types
import unittest

import _adapter

import fastpool
import fastpool.mp

START_METHODS = ("fork", "spawn", "forkserver")

# the classes of test._test_multiprocessing, as install_tests_in_module_dict names them
POOL_CLASSES = (
    "WithProcessesTestPool",
    "WithProcessesTestPoolWorkerErrors",
    "WithProcessesTestPoolWorkerLifetime",
)
CMDLINE_CLASSES = {
    "fork": "ForkCmdLineTest",
    "spawn": "SpawnCmdLineTest",
    "forkserver": "ForkServerCmdLineTest",
}

# test id (class name without "WithProcesses", then the method) -> why it is skipped
SKIPPED: dict[str, str] = {
    "TestPool.test_make_pool": "reads len(pool._pool), multiprocessing's list of Process objects",
    "TestPoolWorkerLifetime.test_pool_worker_lifetime": (
        "reads pool._pool's Process objects and calls pool._repopulate_pool()"
    ),
}

# test id -> the deliberate difference that makes it fail (mirrored in docs/multiprocessing.md)
EXPECTED_FAILURES: dict[str, str] = {}

key_of = _adapter.class_and_method("WithProcesses")

_SCRIPT_IMPORTS = (
    (
        "from multiprocessing import Pool, set_start_method",
        "from multiprocessing import set_start_method\nfrom fastpool.mp import Pool",
    ),
    ("from multiprocessing import Pool\n", "from fastpool.mp import Pool\n"),
)


def _with_fastpool_imports(make: object) -> object:
    """``make_script`` / ``make_zip_pkg`` of the main-handling tests, writing scripts whose
    ``Pool`` is fastpool's."""

    def made(*args: object, **kwargs: object) -> object:
        args = tuple(_rewritten(a) for a in args)
        kwargs = {k: _rewritten(v) for k, v in kwargs.items()}
        return make(*args, **kwargs)  # type: ignore[operator]

    return made


def _rewritten(source: object) -> object:
    if isinstance(source, str):
        for old, new in _SCRIPT_IMPORTS:
            source = source.replace(old, new)
    return source


def _load() -> tuple[types.ModuleType, types.ModuleType]:
    try:
        from test import _test_multiprocessing, test_multiprocessing_main_handling
    except ImportError as exc:
        raise SystemExit(
            f"{sys.executable} has no test._test_multiprocessing ({exc}); use an interpreter "
            "built with its test suite, such as pyenv's CPython 3.13"
        ) from exc
    return _test_multiprocessing, test_multiprocessing_main_handling


def build_suite(args: argparse.Namespace) -> unittest.TestSuite:
    tests, main_handling = _load()
    from test.support import script_helper

    # Every child script keeps PYTHONPATH (the tests run them with -E otherwise).
    main_handling.assert_python_ok = _adapter.python_ok_with(main_handling.assert_python_ok, ())
    on_fastpool = args.pool == "fastpool"
    if on_fastpool:
        multiprocessing.Pool = fastpool.mp.Pool  # the tests that call it by name
        script_helper.assert_python_ok = _adapter.python_ok_with(
            script_helper.assert_python_ok, _SCRIPT_IMPORTS
        )
        for name in ("make_script", "make_zip_pkg"):
            setattr(main_handling, name, _with_fastpool_imports(getattr(main_handling, name)))
    else:
        script_helper.assert_python_ok = _adapter.python_ok_with(script_helper.assert_python_ok, ())

    # A module of its own, so that unittest runs the start method's module fixtures
    # (setUpModule sets it, tearDownModule restores it) around these classes. Spawned and
    # forkserver children re-import this script as __mp_main__ and build it again (below),
    # so that what they unpickle by that module's name resolves.
    os.environ[_CHILD_ENV] = f"{args.start_method}:{args.pool}"
    module = types.ModuleType(f"cpython_mp_{args.start_method}")
    sys.modules[module.__name__] = module
    installed: dict[str, object] = {"__name__": module.__name__}
    tests.install_tests_in_module_dict(installed, args.start_method, only_type="processes")
    module.setUpModule = installed["setUpModule"]  # type: ignore[attr-defined]
    module.tearDownModule = installed["tearDownModule"]  # type: ignore[attr-defined]

    bases = [installed[n] for n in POOL_CLASSES]
    bases += [tests.TestInitializers, getattr(main_handling, CMDLINE_CLASSES[args.start_method])]
    loader = unittest.TestLoader()
    suite = unittest.TestSuite()
    for base in bases:
        name = base.__name__.removeprefix("WithProcesses")  # type: ignore[attr-defined]
        attrs = _adapter.skipped(base, SKIPPED, name) if on_fastpool else {}  # type: ignore[arg-type]
        attrs["__module__"] = module.__name__
        if on_fastpool and issubclass(base, tests.BaseTestCase):  # type: ignore[arg-type]
            attrs["Pool"] = staticmethod(fastpool.mp.Pool)
        cls = type(base.__name__, (base,), attrs)  # type: ignore[attr-defined]
        setattr(module, cls.__name__, cls)
        suite.addTests(loader.loadTestsFromTestCase(cls))
    return suite


def main(argv: list[str] | None = None) -> int:
    return _adapter.main(
        argv,
        script=__file__,
        description=__doc__.splitlines()[0],
        build_suite=build_suite,
        key_of=key_of,
        expected_failures=lambda args: EXPECTED_FAILURES if args.pool == "fastpool" else {},
        options={
            "start-method": {"choices": START_METHODS, "required": True},
            "pool": {"choices": ("fastpool", "multiprocessing"), "default": "fastpool"},
        },
        about=lambda args: {
            "start_method": args.start_method,
            "pool": args.pool,
            "fastpool": fastpool.__version__,
        },
    )


_CHILD_ENV = "FASTPOOL_CPYTHON_MP_SUITE"

if __name__ == "__mp_main__" and os.environ.get(_CHILD_ENV):  # a spawned child of a test
    _method, _pool = os.environ[_CHILD_ENV].split(":")
    build_suite(argparse.Namespace(start_method=_method, pool=_pool))

if __name__ == "__main__":
    sys.exit(main())
