# The dispatcher with supervision's handles (fastpool/_runtime/_control.pyx).
from fastpool._runtime._dispatch cimport Dispatch


cdef class Dispatcher(Dispatch):
    pass
