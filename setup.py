import os

import numpy
from setuptools import Extension, setup

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-function", "-D_GNU_SOURCE"]
if os.environ.get("FASTPOOL_SANITIZE"):
    CFLAGS += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]

setup(
    ext_modules=[
        Extension(
            "fastpool._core",
            sources=["fastpool/_core.pyx"],  # csrc is header-only
            include_dirs=["csrc", numpy.get_include()],
            depends=[os.path.join("csrc", f) for f in sorted(os.listdir("csrc")) if f.endswith(".h")]
            + ["fastpool/_sys.pxd"],
            extra_compile_args=CFLAGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ),
        Extension(
            "fastpool._arena",
            sources=["fastpool/_arena.pyx"],  # csrc/fp_arena.h, header-only
            include_dirs=["csrc", numpy.get_include()],
            depends=["csrc/fp_arena.h", "csrc/fp_atomic.h", "csrc/fp_shm.h", "csrc/fp_status.h", "fastpool/_arena.pxd",
                     "fastpool/_shm.pxd", "fastpool/_sys.pxd"],
            extra_compile_args=CFLAGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ),
    ],
)
