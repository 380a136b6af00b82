import glob
import os
import sys

import numpy
from setuptools import Extension, setup

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-function", "-D_GNU_SOURCE"]
if sys.version_info >= (3, 15):
    # Python 3.15's PyTypeObject ends in a new field, _tp_iteritem, that Cython (3.3.1, the
    # newest release) does not list in the static type objects it writes: C zero-fills it,
    # which is what 3.15 wants, and -Wextra warns once per cdef class (16 here).  Only for
    # 3.15: the 3.11-3.14 builds keep the warning for the header-only C in csrc/.
    CFLAGS.append("-Wno-missing-field-initializers")
if os.environ.get("FASTPOOL_SANITIZE"):
    CFLAGS += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
# csrc is header-only; every extension rebuilds when a header or a .pxd changes
DEPENDS = sorted(glob.glob("csrc/*.h") + glob.glob("fastpool/**/*.pxd", recursive=True))


def extension(name: str) -> Extension:
    return Extension(
        name,
        sources=[name.replace(".", "/") + ".pyx"],
        include_dirs=["csrc", numpy.get_include()],
        depends=DEPENDS,
        extra_compile_args=CFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


# In cimport order: the board, arrays, a task, the slots, the dispatcher (its core, then its
# controls), the worker's loop.
MODULES = (
    "fastpool._native._core",
    "fastpool._native._arena",
    "fastpool._native._ndarray",
    "fastpool._native._alloc",
    "fastpool._runtime._numbers",
    "fastpool._runtime._task",
    "fastpool._runtime._slots",
    "fastpool._runtime._dispatch",
    "fastpool._runtime._controls",
    "fastpool._runtime._serve",
)
setup(ext_modules=[extension(n) for n in MODULES])
