# The dispatcher with supervision's handles (fastpool/_control.pyx).
from fastpool._dispatch cimport Dispatch


cdef class Dispatcher(Dispatch):
    pass
