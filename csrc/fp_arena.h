/* The pool's arena: one sparse memfd of reference-counted blocks that every
 * process of a pool maps, so arrays cross between them as (offset, gen) pairs.
 *
 *   offset 0          fp_arena_t   magic, version, sizes, committed bytes, token
 *   +128              fp_a64 top[nprocs]   bytes used in each region (bump pointer)
 *   page-aligned      region 0 (the parent), region 1 (worker slot 0), ...
 *                     each region_size bytes: a chain of blocks, back to back
 *
 *   block (page-aligned)  fp_block_t: magic, size (whole block), gen, owner
 *                         fp_a32 count[nprocs]: references held by each process
 *                         data at fp_arena_hdr_size(nprocs) (64-byte aligned)
 *
 * Process p (0 = parent, 1 + s = worker slot s) allocates only in region p, so
 * the allocator needs no lock: only the region's owner splits, merges or bumps
 * its chain, and it publishes every change with one atomic store of a size or a
 * top, after the header that store exposes is written.  Any process references
 * any block by bumping its own counter; a block is free when every counter is
 * zero.  A process may die on any instruction: the parent then zeroes that
 * process's counter in every block (fp_arena_reclaim) and the replacement in
 * the same slot inherits the region with its chain intact.  Nothing here is a
 * lock.  Layout changes bump FP_ARENA_VERSION.
 */
#ifndef FP_ARENA_H
#define FP_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fp_atomic.h"
#include "fp_status.h"

#define FP_ARENA_MAGIC 0x414e455241504646ULL /* "FFPARENA" */
#define FP_ARENA_VERSION 2u
#define FP_BLOCK_MAGIC 0x4b434f4c42504646ULL /* "FFPBLOCK" */
#define FP_ARENA_PAGE 4096u
#define FP_ARENA_MAX_PROCS 1024u
#define FP_ARENA_MIN_SPLIT (64u * 1024u) /* a smaller tail stays inside the block */
#define FP_NOSPACE (-7)                  /* the region or the budget is full */
#define FP_STALE (-8)                    /* the block was reused: a descriptor outlived its pin */

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t nprocs;
    uint64_t region_size;
    uint64_t budget;     /* committed bytes allowed, all regions together */
    uint64_t total_size;
    uint64_t token;      /* random: names this arena in descriptors */
    uint64_t regions_offset;
    char _pad0[8];
    fp_a64 committed;    /* bytes of block space ever bumped, all regions */
    fp_a64 gen_seq;      /* arena-wide: a generation is never reused at any offset */
    char _pad1[48];
    /* fp_a64 top[nprocs] follows at offset 128 */
} fp_arena_t;
static_assert(sizeof(fp_arena_t) == 128, "arena header is 128 bytes");

typedef struct {
    uint64_t magic;
    fp_a64 size;  /* the whole block, header included; a multiple of the page */
    fp_a64 gen;   /* bumped on every reuse: a stale descriptor is detected */
    uint32_t owner;
    uint32_t _pad;
    /* fp_a32 count[nprocs] follows */
} fp_block_t;
static_assert(sizeof(fp_block_t) == 32, "block header is 32 bytes");

static inline uint64_t fp_arena_align(uint64_t n, uint64_t a) { return (n + a - 1) & ~(a - 1); }

static inline uint64_t fp_arena_hdr_size(uint32_t nprocs)
{
    return fp_arena_align(sizeof(fp_block_t) + 4ull * nprocs, 64);
}

static inline uint64_t fp_arena_regions_offset(uint32_t nprocs)
{
    return fp_arena_align(sizeof(fp_arena_t) + 8ull * nprocs, FP_ARENA_PAGE);
}

static inline uint64_t fp_arena_size(uint32_t nprocs, uint64_t region_size)
{
    return fp_arena_regions_offset(nprocs) + (uint64_t)nprocs * region_size;
}

static inline fp_a64 *fp_arena_top(fp_arena_t *a, uint32_t p)
{
    return (fp_a64 *)((unsigned char *)a + sizeof(fp_arena_t)) + p;
}

static inline uint64_t fp_arena_region(const fp_arena_t *a, uint32_t p)
{
    return a->regions_offset + (uint64_t)p * a->region_size;
}

static inline fp_block_t *fp_arena_block(fp_arena_t *a, uint64_t off)
{
    return (fp_block_t *)((unsigned char *)a + off);
}

static inline fp_a32 *fp_block_counts(fp_block_t *b) { return (fp_a32 *)((unsigned char *)b + sizeof(fp_block_t)); }

static inline uint64_t fp_arena_next_gen(fp_arena_t *a) { return fp_add64_seqcst(&a->gen_seq, 1) + 1; }

static inline int fp_block_free(fp_block_t *b, uint32_t nprocs)
{
    fp_a32 *c = fp_block_counts(b);
    for (uint32_t i = 0; i < nprocs; i++)
        if (fp_load32_seqcst(&c[i]))
            return 0;
    return 1;
}

/* On a zero-filled mapping of fp_arena_size(nprocs, region_size) bytes. */
static inline int fp_arena_init(fp_arena_t *a, uint32_t nprocs, uint64_t region_size, uint64_t budget, uint64_t token)
{
    if (nprocs < 2 || nprocs > FP_ARENA_MAX_PROCS || region_size % FP_ARENA_PAGE || region_size == 0)
        return FP_CORRUPT;
    a->version = FP_ARENA_VERSION;
    a->nprocs = nprocs;
    a->region_size = region_size;
    a->budget = budget;
    a->token = token;
    a->regions_offset = fp_arena_regions_offset(nprocs);
    a->total_size = fp_arena_size(nprocs, region_size);
    fp_fence_seqcst();
    a->magic = FP_ARENA_MAGIC; /* last: an attach never sees a half-made header */
    return FP_OK;
}

static inline int fp_arena_check(const fp_arena_t *a, uint64_t mapped)
{
    if (mapped < sizeof(fp_arena_t) || a->magic != FP_ARENA_MAGIC || a->version != FP_ARENA_VERSION)
        return FP_CORRUPT;
    if (a->nprocs < 2 || a->nprocs > FP_ARENA_MAX_PROCS || a->total_size != fp_arena_size(a->nprocs, a->region_size) ||
        a->total_size > mapped)
        return FP_CORRUPT;
    return FP_OK;
}

/* Takes (or reuses) a block of at least nbytes data in region p, holding one
 * reference for p.  fresh_off and fresh_len name the bytes that were never used
 * before (the caller commits them, e.g. fallocate), 0 when a block was reused.
 * Only process p may call this for region p. */
static inline int fp_arena_alloc(fp_arena_t *a, uint32_t p, uint64_t nbytes, uint64_t *out_off, uint64_t *fresh_off,
                                 uint64_t *fresh_len)
{
    uint32_t n = a->nprocs;
    uint64_t hdr = fp_arena_hdr_size(n);
    if (nbytes > a->region_size) /* before the arithmetic: hdr + nbytes could wrap */
        return FP_NOSPACE;
    uint64_t need = fp_arena_align(hdr + (nbytes ? nbytes : 1), FP_ARENA_PAGE);
    uint64_t base = fp_arena_region(a, p);
    fp_a64 *top = fp_arena_top(a, p);
    uint64_t end = base + fp_load64_acquire(top);
    *fresh_off = *fresh_len = 0;
    if (need > a->region_size)
        return FP_NOSPACE;
    for (uint64_t off = base; off < end;) {
        fp_block_t *b = fp_arena_block(a, off);
        uint64_t s = fp_load64_acquire(&b->size);
        if (s < FP_ARENA_PAGE || off + s > end)
            return FP_CORRUPT;
        if (fp_block_free(b, n)) {
            /* merge free successors: one store of the size, so a crash leaves a valid chain */
            for (uint64_t nx = off + s; nx < end;) {
                fp_block_t *c = fp_arena_block(a, nx);
                uint64_t cs = fp_load64_acquire(&c->size);
                if (s >= need || cs < FP_ARENA_PAGE || !fp_block_free(c, n))
                    break;
                s += cs;
                nx += cs;
                fp_store64_release(&b->size, s);
                c->magic = 0; /* absorbed: a stale descriptor for it is no longer valid */
            }
            if (s >= need) {
                /* Claim before use: a new generation first, then the counts again.  A
                 * racing fp_arena_ref (count++, then gen) either sees the new generation
                 * and backs off, or is seen here, and the block is skipped. */
                fp_store64_seqcst(&b->gen, fp_arena_next_gen(a));
                if (!fp_block_free(b, n)) {
                    off += s;
                    continue;
                }
                if (s - need >= FP_ARENA_MIN_SPLIT) {
                    fp_block_t *t = fp_arena_block(a, off + need); /* the tail first, then shrink */
                    memset((void *)fp_block_counts(t), 0, 4ull * n);
                    t->owner = p;
                    fp_store64_release(&t->gen, fp_arena_next_gen(a));
                    fp_store64_release(&t->size, s - need);
                    t->magic = FP_BLOCK_MAGIC;
                    fp_store64_release(&b->size, need);
                }
                fp_add32_seqcst(&fp_block_counts(b)[p], 1);
                *out_off = off;
                return FP_OK;
            }
        }
        off += s;
    }
    uint64_t used = end - base;
    if (used + need > a->region_size)
        return FP_NOSPACE;
    if (fp_load64_acquire(&a->committed) + need > a->budget)
        return FP_NOSPACE;
    fp_block_t *b = fp_arena_block(a, end);
    *fresh_off = end;
    *fresh_len = need;
    b->magic = FP_BLOCK_MAGIC;
    b->owner = p;
    memset((void *)fp_block_counts(b), 0, 4ull * n);
    fp_store64_release(&b->gen, fp_arena_next_gen(a));
    fp_store64_release(&b->size, need);
    fp_store32_release(&fp_block_counts(b)[p], 1);
    fp_store64_release(top, used + need); /* last: publishes the block */
    fp_add64_relaxed(&a->committed, need);
    *out_off = end;
    return FP_OK;
}

/* Undoes the bump of a fresh block the caller could not commit (owner only). */
static inline void fp_arena_unbump(fp_arena_t *a, uint32_t p, uint64_t off)
{
    fp_block_t *b = fp_arena_block(a, off);
    uint64_t s = fp_load64_acquire(&b->size);
    fp_a64 *top = fp_arena_top(a, p);
    if (fp_arena_region(a, p) + fp_load64_acquire(top) == off + s) {
        fp_store64_release(top, off - fp_arena_region(a, p));
        fp_add64_relaxed(&a->committed, (uint64_t)0 - s); /* modular: a subtraction */
    }
    fp_store32_release(&fp_block_counts(b)[p], 0);
}

static inline int fp_arena_valid(fp_arena_t *a, uint64_t off)
{
    if (off < a->regions_offset || off >= a->total_size || off % FP_ARENA_PAGE)
        return 0;
    return fp_arena_block(a, off)->magic == FP_BLOCK_MAGIC;
}

/* Process p takes a reference on the block at off, if it is still generation gen. */
static inline int fp_arena_ref(fp_arena_t *a, uint32_t p, uint64_t off, uint64_t gen)
{
    if (p >= a->nprocs || !fp_arena_valid(a, off))
        return FP_CORRUPT;
    fp_block_t *b = fp_arena_block(a, off);
    fp_add32_seqcst(&fp_block_counts(b)[p], 1);
    if (fp_load64_seqcst(&b->gen) != gen) { /* seq_cst: pairs with the claim in fp_arena_alloc */
        fp_sub32_seqcst(&fp_block_counts(b)[p], 1);
        return FP_STALE;
    }
    return FP_OK;
}

/* Drops one of process p's references; never below zero, so a reference the
 * parent already reclaimed for a dead worker cannot be dropped twice. */
static inline void fp_arena_unref(fp_arena_t *a, uint32_t p, uint64_t off)
{
    fp_a32 *c = &fp_block_counts(fp_arena_block(a, off))[p];
    uint32_t v = fp_load32_seqcst(c);
    while (v > 0 && !fp_cas32_acqrel(c, &v, v - 1))
        ;
}

static inline uint32_t fp_arena_count(fp_arena_t *a, uint32_t p, uint64_t off)
{
    return fp_load32_seqcst(&fp_block_counts(fp_arena_block(a, off))[p]);
}

/* The parent, after process p died: drop every reference p held, in every
 * region.  Returns the number of blocks that p was holding. */
static inline uint64_t fp_arena_reclaim(fp_arena_t *a, uint32_t p)
{
    uint64_t held = 0;
    for (uint32_t r = 0; r < a->nprocs; r++) {
        uint64_t base = fp_arena_region(a, r), end = base + fp_load64_acquire(fp_arena_top(a, r));
        for (uint64_t off = base; off < end;) {
            fp_block_t *b = fp_arena_block(a, off);
            uint64_t s = fp_load64_acquire(&b->size);
            if (s < FP_ARENA_PAGE || off + s > end)
                break;
            if (fp_xchg32_acqrel(&fp_block_counts(b)[p], 0))
                held++;
            off += s;
        }
    }
    return held;
}

/* Bytes in live (referenced) blocks and in free blocks, over all regions. */
static inline void fp_arena_usage(fp_arena_t *a, uint64_t *live, uint64_t *idle, uint64_t *nlive)
{
    *live = *idle = *nlive = 0;
    for (uint32_t r = 0; r < a->nprocs; r++) {
        uint64_t base = fp_arena_region(a, r), end = base + fp_load64_acquire(fp_arena_top(a, r));
        for (uint64_t off = base; off < end;) {
            fp_block_t *b = fp_arena_block(a, off);
            uint64_t s = fp_load64_acquire(&b->size);
            if (s < FP_ARENA_PAGE || off + s > end)
                break;
            if (fp_block_free(b, a->nprocs)) {
                *idle += s;
            } else {
                *live += s;
                (*nlive)++;
            }
            off += s;
        }
    }
}

#endif /* FP_ARENA_H */
