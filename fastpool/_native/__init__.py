"""The native core: shared-memory board and rings, the arena and its array blocks, the
workers' NumPy allocator hook, and task records (Cython over the C headers in csrc/).

Imports nothing from fastpool at run time but ``fastpool.errors``.
"""
