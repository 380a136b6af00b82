/* The memfd under every shared segment (board, arena): create, attach, map.
 *
 *   parent                                      worker
 *   fp_shm_create(name, size, &fd, &addr)       fp_shm_attach(fd, &head, sizeof head, &file_size)
 *     memfd, sized, sealed against resizing       one pread into the caller's private copy,
 *     mapped shared, read-write                   plus the file's real size; the caller checks
 *                                                 the copy against it, then
 *                                               fp_shm_dup(fd, FP_SHM_FD_FLOOR, &own)
 *                                               fp_shm_map(own, checked_size, prot, &addr)
 *
 * The seals matter: every worker holds the fd, and a memfd shrunk under a
 * mapping turns the parent's next touch of a page past the new end into
 * SIGBUS.  F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL after sizing makes the
 * size final for every holder; writes and hole punching stay allowed.
 * Every function returns FP_OK, FP_ERRNO (errno says why) or FP_CORRUPT. */
#ifndef FP_SHM_H
#define FP_SHM_H

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fp_status.h"

/* Low fds get reused by objects a forked template inherited (a logging
 * handler's stream): a segment's fd sits above them where the limit allows. */
#define FP_SHM_FD_FLOOR 1000

static inline int fp_shm_map(int fd, uint64_t size, int prot, void **out)
{
    if (size == 0 || size > (uint64_t)SIZE_MAX) {
        errno = EINVAL;
        return FP_ERRNO;
    }
    void *p = mmap(NULL, (size_t)size, prot, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED)
        return FP_ERRNO;
    *out = p;
    return FP_OK;
}

/* Turns this process's shared mapping of fd at addr into a private one, in place:
 * MAP_FIXED over the same range, so every pointer into it stays valid.  For a
 * forked child: what it writes from then on lands in pages
 * of its own (copy-on-write), never in the segment other processes map.  Pages
 * the child has not written still read the segment's current bytes. */
static inline int fp_shm_privatise(int fd, void *addr, uint64_t size, int prot)
{
    if (addr == NULL || size == 0 || size > (uint64_t)SIZE_MAX) {
        errno = EINVAL;
        return FP_ERRNO;
    }
    void *p = mmap(addr, (size_t)size, prot, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED)
        return FP_ERRNO;
    return FP_OK;
}

/* A duplicate of fd, close-on-exec, at or above min_fd when the fd limit allows. */
static inline int fp_shm_dup(int fd, int min_fd, int *out)
{
    int d = fcntl(fd, F_DUPFD_CLOEXEC, min_fd);
    /* min_fd over RLIMIT_NOFILE, or none free above it */
    if (d < 0 && (errno == EINVAL || errno == EMFILE))
        d = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    if (d < 0)
        return FP_ERRNO;
    *out = d;
    return FP_OK;
}

/* A new sealed memfd of size bytes (sparse: nothing is committed), mapped
 * read-write.  On failure nothing is left open or mapped. */
static inline int fp_shm_create(const char *name, uint64_t size, int *fd_out, void **addr_out)
{
    if (size == 0 || size > (uint64_t)INT64_MAX) {
        errno = EINVAL;
        return FP_ERRNO;
    }
    /* No move above FP_SHM_FD_FLOOR here, in the creating (parent) process: its low
     * fds belong to its own live objects, and growing the fd table of a process that
     * runs threads (NumPy's BLAS pool) waits for an RCU grace period, ~8 ms of every
     * first pool.  The floor is for the processes that attach (fp_shm_dup). */
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return FP_ERRNO;
    void *p = NULL;
    if (ftruncate(fd, (off_t)size) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
        fp_shm_map(fd, size, PROT_READ | PROT_WRITE, &p) != FP_OK) {
        int e = errno;
        close(fd);
        errno = e;
        return FP_ERRNO;
    }
    *fd_out = fd;
    *addr_out = p;
    return FP_OK;
}

/* Reads a segment's header once, into head (the caller's private copy), and
 * the file's size, which bounds what the caller may map.  FP_CORRUPT when the
 * file is shorter than a header. */
static inline int fp_shm_attach(int fd, void *head, size_t len, uint64_t *file_size)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return FP_ERRNO;
    if (st.st_size < 0 || (uint64_t)st.st_size < len)
        return FP_CORRUPT;
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(fd, (unsigned char *)head + got, len - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return FP_ERRNO;
        if (n == 0)
            return FP_CORRUPT;
        got += (size_t)n;
    }
    *file_size = (uint64_t)st.st_size;
    return FP_OK;
}

#endif /* FP_SHM_H */
