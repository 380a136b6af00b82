# The memfd under every shared segment (csrc/fp_shm.h), declared once for
# Board (_core.pyx) and Arena (_arena.pyx).  Each returns FP_OK, FP_ERRNO
# (errno says why) or FP_CORRUPT; the caller raises.
from libc.stdint cimport uint64_t

cdef extern from "fp_shm.h" nogil:
    int FP_SHM_FD_FLOOR
    int fp_shm_create(const char *name, uint64_t size, int *fd_out, void **addr_out)
    int fp_shm_attach(int fd, void *head, size_t len, uint64_t *file_size)
    int fp_shm_dup(int fd, int min_fd, int *out)
    int fp_shm_map(int fd, uint64_t size, int prot, void **out)
    int fp_shm_privatise(int fd, void *addr, uint64_t size, int prot)
