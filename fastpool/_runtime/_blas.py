"""The environment variables that set a BLAS or OpenMP library's thread count,
every one fastpool knows: one list, for the template, sizing and the tools."""

BLAS_THREAD_VARS: tuple[str, ...] = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "BLIS_NUM_THREADS",
)
