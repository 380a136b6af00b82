"""Imported at start-up by every interpreter of the venv while joblib's suite runs (the
``.pth`` file that tests/compat/test_joblib_suite.py writes names it, and acts only where
``FASTPOOL_JOBLIB_SUITE`` is set): the name ``"fastpool"`` then resolves in joblib there,
as in a process that imported fastpool.joblib.  The scripts joblib's tests start replace
PYTHONPATH with joblib's test folder, so a .pth file is the one way in.

joblib is not imported here: a hook adds the entry once something imports joblib.parallel.
``FASTPOOL_JOBLIB_SUITE`` holds the checkout's root, put on sys.path where fastpool is not
importable otherwise (an interpreter started without the suite's PYTHONPATH)."""

import importlib.abc
import importlib.util
import os
import sys


def _fastpool_backend(*args, **kwargs):
    """The backend's factory until fastpool.joblib is imported (which registers its class
    in its place): Parallel(backend=name) reads BACKENDS, not EXTERNAL_BACKENDS."""
    import fastpool.joblib

    return fastpool.joblib.FastpoolBackend(*args, **kwargs)


class _AfterJoblibParallel(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name != "joblib.parallel":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        exec_module = spec.loader.exec_module

        def exec_and_add(module):
            exec_module(module)
            module.BACKENDS.setdefault("fastpool", _fastpool_backend)

        spec.loader.exec_module = exec_and_add
        return spec


_root = os.environ.get("FASTPOOL_JOBLIB_SUITE", "")
if _root and importlib.util.find_spec("fastpool") is None:
    sys.path.append(_root)
sys.meta_path.insert(0, _AfterJoblibParallel())
