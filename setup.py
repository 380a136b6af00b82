import os

import numpy
from setuptools import Extension, setup

CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wno-unused-function", "-D_GNU_SOURCE"]
CSRC = [os.path.join("csrc", f) for f in sorted(os.listdir("csrc")) if f.endswith(".h")]
if os.environ.get("FASTPOOL_SANITIZE"):
    CFLAGS += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]

setup(
    ext_modules=[
        Extension(
            "fastpool._core",
            sources=["fastpool/_core.pyx"],  # csrc is header-only
            include_dirs=["csrc", numpy.get_include()],
            depends=CSRC + ["fastpool/_sys.pxd", "fastpool/_core.pxd"],
            extra_compile_args=CFLAGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ),
        Extension(
            "fastpool._dispatch",
            sources=["fastpool/_dispatch.pyx"],
            include_dirs=["csrc", numpy.get_include()],
            depends=CSRC + ["fastpool/_sys.pxd", "fastpool/_core.pxd", "fastpool/_dispatch.pxd"],
            extra_compile_args=CFLAGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ),
        Extension(
            "fastpool._serve",
            sources=["fastpool/_serve.pyx"],
            include_dirs=["csrc", numpy.get_include()],
            depends=CSRC + ["fastpool/_sys.pxd", "fastpool/_core.pxd"],
            extra_compile_args=CFLAGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ),
        Extension(
            "fastpool._arena",
            sources=["fastpool/_arena.pyx"],  # csrc/fp_arena.h, header-only
            include_dirs=["csrc", numpy.get_include()],
            depends=["csrc/fp_arena.h", "csrc/fp_atomic.h", "csrc/fp_status.h", "fastpool/_sys.pxd"],
            extra_compile_args=CFLAGS,
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        ),
    ],
)
