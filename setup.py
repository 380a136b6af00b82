import os

import numpy
from setuptools import Extension, setup

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-function", "-D_GNU_SOURCE"]
if os.environ.get("FASTPOOL_SANITIZE"):
    CFLAGS += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
# csrc is header-only; every extension rebuilds when a header or a .pxd changes
DEPENDS = [os.path.join(d, f) for d, ext in (("csrc", ".h"), ("fastpool", ".pxd"))
           for f in sorted(os.listdir(d)) if f.endswith(ext)]


def extension(name: str) -> Extension:
    return Extension(
        f"fastpool.{name}",
        sources=[f"fastpool/{name}.pyx"],
        include_dirs=["csrc", numpy.get_include()],
        depends=DEPENDS,
        extra_compile_args=CFLAGS,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )


# In cimport order: the board, arrays, a task, the dispatcher and its handles, the worker's loop.
setup(ext_modules=[extension(n) for n in ("_core", "_arena", "_alloc", "_task", "_dispatch", "_control", "_serve")])
