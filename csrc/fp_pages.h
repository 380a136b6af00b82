/* The pages behind a process's own arena region: taken before a fresh block's first
 * use (fp_pages_commit), given back to the kernel once its freed blocks lie idle
 * beyond a warm reserve (fp_pages_trim; fp_pages_punch_free for a region nobody will
 * reuse soon), and taken again when a block that lost them is reused
 * (fp_pages_recommit).  docs/arrays.md, "Memory that comes back", says when.
 *
 * punched is the caller's private map of its own region, one byte per page (never
 * in the shared arena: a worker could forge it), 1 where a trim gave the page back;
 * *npunched counts those bytes.  Every walk goes through fp_arena.h's bounded
 * walker, so a forged chain costs an early stop, never a stray access.  A trimmed
 * block is first claimed (fp_arena_claim_free: nobody can reference or reuse it
 * meanwhile), then punched, then released: a block anyone references is never
 * punched, so no live array reads the zeros of a page given back.  Only a region's
 * owner reuses its blocks, so only it trims them.  A block's header page stays: other
 * processes still walk the chain through it.
 */
#ifndef FP_PAGES_H
#define FP_PAGES_H

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdint.h>
#include <sys/mman.h>

#include "fp_arena.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels answer EINVAL */
#endif

/* Takes the pages of [off, off + length) of the arena now and maps them in this
 * process: 0, or -1 with errno (the kernel cannot supply them).
 *
 * fallocate first: the memfd takes its pages in one batch, then MADV_POPULATE_WRITE
 * only maps them, 85-93 ms for a fresh 256 MiB against 110-115 ms for the populate
 * alone (which takes them page by page through the fault path).  Mapped here, the
 * first copy into them runs at memcpy speed instead of faulting page by page. */
static inline int fp_pages_commit(int fd, unsigned char *base, uint64_t off, uint64_t length)
{
    int rc;
    if (fd >= 0 && fallocate(fd, 0, (off_t)off, (off_t)length) != 0 && errno != EOPNOTSUPP)
        return -1;
    rc = madvise(base + off, length, MADV_POPULATE_WRITE);
    if (rc != 0 && errno == EINVAL && fd >= 0) /* kernel older than 5.14: fallocate did it */
        return 0;
    return rc;
}

/* Takes again the pages of a reused block [off, off + size) of the own region (which
 * starts at own_base) that a trim gave back, so that its next copy runs at memcpy
 * speed and a page the kernel cannot supply fails here, not as a SIGBUS on first
 * touch: 0, or -1 with errno. */
static inline int fp_pages_recommit(int fd, const fp_arena_view_t *v, uint64_t own_base,
                                    uint8_t *punched, uint64_t *npunched, uint64_t off,
                                    uint64_t size)
{
    uint64_t i, first;
    int any = 0;
    if (*npunched == 0 || punched == NULL)
        return 0;
    first = (off - own_base) / FP_ARENA_PAGE;
    for (i = first; i < first + size / FP_ARENA_PAGE; i++) {
        if (punched[i]) {
            punched[i] = 0;
            (*npunched)--;
            any = 1;
        }
    }
    return any ? fp_pages_commit(fd, v->base, off, size) : 0;
}

/* Punches the data pages of every free block of region r, from the first whole page
 * after its header (a free block's header stays readable, zero counts, for a process
 * that still walks the chain).  For a region whose owner is gone or going: it tracks
 * no punched map. */
static inline void fp_pages_punch_free(const fp_arena_view_t *v, uint32_t r, int fd)
{
    fp_arena_walk_t w;
    uint64_t off = 0, s = 0, skip = fp_arena_align(v->hdr, FP_ARENA_PAGE);
    int free_ = 0;
    if (fd < 0 || fp_arena_walk_begin(&w, v, r) != FP_OK)
        return;
    while (fp_arena_walk_next(&w, &off, &s) == 1) {
        if (s > skip && fp_arena_is_free(v, off, &free_) == FP_OK && free_)
            fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(off + skip),
                      (off_t)(s - skip));
    }
}

/* Gives back the pages of region p's freed blocks beyond reserve bytes of them (the
 * first in the chain stay warm), p being the caller's own region starting at
 * own_base: *given, the bytes given back now (added to the arena's returned count);
 * *live, the blocks someone references (what may be freed and trimmed later).  A
 * block given back already and not reused since is skipped; a memfd the kernel
 * cannot punch stops the walk.  Must not run beside another allocation in region p:
 * the chain must not change under the walk (the caller holds what serialises them). */
static inline void fp_pages_trim(const fp_arena_view_t *v, uint32_t p, int fd, uint64_t own_base,
                                 uint8_t *punched, uint64_t *npunched, uint64_t reserve,
                                 uint64_t *given, uint64_t *live)
{
    fp_arena_walk_t w;
    uint64_t off = 0, s = 0, skip = fp_arena_align(v->hdr, FP_ARENA_PAGE);
    uint64_t kept = 0, i, first, last;
    int free_ = 0, done, rc;
    *given = *live = 0;
    if (fd < 0 || fp_arena_walk_begin(&w, v, p) != FP_OK)
        return;
    while (fp_arena_walk_next(&w, &off, &s) == 1) {
        if (fp_arena_is_free(v, off, &free_) != FP_OK || !free_) {
            (*live)++;
            continue;
        }
        if (s <= skip)
            continue;
        first = (off + skip - own_base) / FP_ARENA_PAGE;
        last = (off + s - own_base) / FP_ARENA_PAGE;
        done = 1;
        for (i = first; i < last && done; i++)
            done = punched[i];
        if (done)
            continue; /* given back already, and not reused since */
        if (kept + s <= reserve) {
            kept += s;
            continue;
        }
        if (!fp_arena_claim_free(v, p, off)) {
            (*live)++;
            continue;
        }
        rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)(off + skip),
                       (off_t)(s - skip));
        fp_arena_unref(v, p, off);
        if (rc != 0)
            break; /* the kernel cannot punch this memfd: nothing more to do here */
        for (i = first; i < last; i++) {
            if (!punched[i]) {
                punched[i] = 1;
                (*npunched)++;
            }
        }
        *given += s - skip;
    }
    if (*given)
        fp_arena_add_returned(v, *given);
}

#endif /* FP_PAGES_H */
