"""A pytest plugin (``-p joblib_backend_plugin``) that runs the whole pytest session with
joblib's default backend set to the one named by ``FASTPOOL_SUITE_BACKEND`` (``"fastpool"``
or ``"loky"``, the control): every ``Parallel`` call that names no backend of its own runs
on it, as under ``with joblib.parallel_config(backend=...)`` around the session.

``fastpool.joblib`` is imported, and the backend registered, before pytest imports the test
modules; the config is entered at ``pytest_configure`` in the main thread, where pytest runs
the tests, and left at ``pytest_unconfigure``.
"""

from __future__ import annotations

import os
from typing import Any

import joblib
import pytest

import fastpool.joblib  # noqa: F401 - registers "fastpool" before the test modules load

_entered: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    backend = os.environ["FASTPOOL_SUITE_BACKEND"]
    cfg = joblib.parallel_config(backend=backend)
    cfg.__enter__()
    _entered.append(cfg)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _entered:
        _entered.pop().__exit__(None, None, None)
    fastpool.joblib.shutdown()
