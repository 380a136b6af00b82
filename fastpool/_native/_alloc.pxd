# What the worker's loop needs from the NumPy allocator hook (fastpool/_native/_alloc.pyx).

cdef object owned_roots(object result)
