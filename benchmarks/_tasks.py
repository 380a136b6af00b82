"""The worker functions of ``python -m fastpool bench`` (fastpool/_bench/tasks.py), under the
name the benchmark modules import.  Workers receive them as ``fastpool._bench.tasks.*``."""

from fastpool._bench.tasks import *  # noqa: F401,F403
from fastpool._bench.tasks import __file__ as SOURCE  # noqa: F401
