# The system calls and csrc basics that both extensions use, declared once.
from libc.stdint cimport uint32_t, uint64_t

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int madvise(void *addr, size_t length, int advice)
    int PROT_READ, PROT_WRITE, MAP_SHARED, MAP_NORESERVE
    void *MAP_FAILED

cdef extern from "<fcntl.h>" nogil:
    int fallocate(int fd, int mode, long offset, long length)
    int FALLOC_FL_PUNCH_HOLE, FALLOC_FL_KEEP_SIZE

cdef extern from "<unistd.h>" nogil:
    int ftruncate(int fd, long length)
    int close(int fd)
    long pread(int fd, void *buf, size_t count, long offset)
    long write(int fd, const void *buf, size_t count)

cdef extern from "<errno.h>":
    int errno
    int EINVAL

cdef extern from "fp_status.h":
    int FP_OK, FP_TIMEOUT, FP_AGAIN, FP_TOOBIG, FP_CORRUPT, FP_ERRNO, FP_INTR

cdef extern from "fp_atomic.h" nogil:
    ctypedef uint32_t fp_a32
    ctypedef uint64_t fp_a64
    uint32_t fp_load32_acquire(fp_a32 *p)
    void fp_store32_release(fp_a32 *p, uint32_t v)
    uint32_t fp_xchg32_acqrel(fp_a32 *p, uint32_t v)
    uint32_t fp_add32_seqcst(fp_a32 *p, uint32_t v)
    uint32_t fp_sub32_seqcst(fp_a32 *p, uint32_t v)
    uint64_t fp_load64_acquire(fp_a64 *p)
    uint64_t fp_load64_relaxed(fp_a64 *p)
    void fp_store64_release(fp_a64 *p, uint64_t v)
    uint64_t fp_add64_relaxed(fp_a64 *p, uint64_t v)
