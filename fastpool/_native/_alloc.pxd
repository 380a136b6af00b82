# What the worker's loop needs from the NumPy allocator hook (fastpool/_native/_alloc.pyx).

from libc.stdint cimport uint64_t

cdef object owned_roots(object result)
cdef uint64_t freed_bytes() noexcept nogil
cdef uint64_t task_mark() noexcept nogil
cdef uint64_t peak_bytes() noexcept nogil
