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
 *
 * Distrust.  Every worker maps all of this read-write and runs arbitrary code,
 * so any byte may be garbage.  Each process therefore keeps a private
 * fp_arena_view_t: the base of its own mapping and the geometry (nprocs,
 * region size, offsets, budget) checked once at init or attach, from a private
 * copy of the header; no function reads those header fields again.  What stays
 * shared and mutable is read once into a local and checked against the view
 * before use: each region's top, each block's size, magic and counts, and the
 * two arena-wide counters (committed, gen_seq; garbage there costs budget
 * accounting or stale-descriptor detection, never memory safety).  Every walk
 * over a chain goes through fp_arena_walk_next, which checks each size (no
 * wrap: s <= end - off, never off + s <= end) and stops after at most
 * region_size / FP_ARENA_PAGE blocks, so a damaged chain costs a status
 * (FP_CORRUPT, with the region, offset and reason in an fp_arena_damage_t),
 * never a hang or a stray access.  Nothing here can stop a worker from
 * overwriting the data of blocks it can see: that needs the layout discussed
 * in _arena.pyx (counts apart from data), not more checks.
 */
#ifndef FP_ARENA_H
#define FP_ARENA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fp_atomic.h"
#include "fp_status.h"

#define FP_ARENA_MAGIC 0x414e455241504646ULL /* "FFPARENA" */
#define FP_ARENA_VERSION 3u
#define FP_BLOCK_MAGIC 0x4b434f4c42504646ULL /* "FFPBLOCK" */
#define FP_ARENA_PAGE 4096u
#define FP_ARENA_MAX_PROCS 1024u
#define FP_ARENA_MAX_BYTES (1ull << 46)  /* the whole arena: 64 TiB of address space */
#define FP_ARENA_MIN_SPLIT (64u * 1024u) /* a smaller tail stays inside the block */
#define FP_ARENA_PIN (1u << 30)          /* the parent's count on a quarantined block */
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
    fp_a64 returned;     /* bytes every process's trims gave back to the kernel (stats only) */
    char _pad1[40];
    /* fp_a64 top[nprocs] follows at offset 128 */
} fp_arena_t;
static_assert(sizeof(fp_arena_t) == 128, "arena header is 128 bytes");
static_assert(offsetof(fp_arena_t, committed) == 64, "committed sits on its own cache line");

typedef struct {
    uint64_t magic;
    fp_a64 size;  /* the whole block, header included; a multiple of the page */
    fp_a64 gen;   /* bumped on every reuse: a stale descriptor is detected */
    uint32_t owner;
    uint32_t _pad;
    /* fp_a32 count[nprocs] follows */
} fp_block_t;
static_assert(sizeof(fp_block_t) == 32, "block header is 32 bytes");

/* This process's own view of one arena: process memory, never shared. */
typedef struct {
    unsigned char *base;     /* this process's mapping, at least total_size bytes */
    uint64_t total_size;
    uint64_t regions_offset;
    uint64_t region_size;
    uint64_t budget;
    uint64_t token;
    uint64_t hdr;            /* block header bytes: fp_arena_hdr_size(nprocs) */
    uint64_t min_block;      /* the smallest block: a header and one byte, in pages */
    uint32_t nprocs;
    uint32_t _pad;
} fp_arena_view_t;

/* A block as one process knows it, from checked reads: what a Block keeps. */
typedef struct {
    uint64_t off;  /* from the arena's start */
    uint64_t size; /* the whole block, header included */
    uint64_t gen;
} fp_arena_blk_t;

/* What was wrong, where: filled when a function returns FP_CORRUPT. */
enum {
    FP_ARENA_BAD_NONE = 0,
    FP_ARENA_BAD_TOP,       /* the region's top is past its end or not a page multiple */
    FP_ARENA_BAD_SIZE,      /* a block is smaller than a header and a byte */
    FP_ARENA_BAD_ALIGN,     /* a block's size is not a page multiple */
    FP_ARENA_BAD_PAST_TOP,  /* a block runs past the region's top (or wraps) */
    FP_ARENA_BAD_TOO_MANY,  /* more blocks than the region can hold */
    FP_ARENA_BAD_OFFSET,    /* an offset that cannot be a block header */
    FP_ARENA_BAD_MAGIC,     /* no block header at that offset */
    FP_ARENA_BAD_PROC,      /* a process index outside the arena */
};

typedef struct {
    uint32_t region; /* the region, or nprocs when none applies (a bad offset) */
    int why;         /* FP_ARENA_BAD_* */
    uint64_t at;     /* offset of the damage within its region (arena offset for BAD_OFFSET) */
    uint64_t value;  /* the value that failed the check */
} fp_arena_damage_t;

static inline const char *fp_arena_damage_text(int why)
{
    switch (why) {
    case FP_ARENA_BAD_TOP: return "the region's top is past its end or not a multiple of the page";
    case FP_ARENA_BAD_SIZE: return "a block size smaller than a block header";
    case FP_ARENA_BAD_ALIGN: return "a block size that is not a multiple of the page";
    case FP_ARENA_BAD_PAST_TOP: return "a block that runs past the region's top";
    case FP_ARENA_BAD_TOO_MANY: return "more blocks than the region can hold";
    case FP_ARENA_BAD_OFFSET: return "an offset that is not a block header";
    case FP_ARENA_BAD_MAGIC: return "no block header (magic) at that offset";
    case FP_ARENA_BAD_PROC: return "a process index outside the arena";
    default: return "no damage";
    }
}

static inline uint64_t fp_arena_align(uint64_t n, uint64_t a) { return (n + a - 1) & ~(a - 1); }

static inline uint64_t fp_arena_hdr_size(uint32_t nprocs)
{
    return fp_arena_align(sizeof(fp_block_t) + 4ull * nprocs, 64);
}

static inline uint64_t fp_arena_min_block(uint32_t nprocs)
{
    return fp_arena_align(fp_arena_hdr_size(nprocs) + 1, FP_ARENA_PAGE);
}
/* min_block <= hdr + PAGE <= 32 + 4 nprocs + 63 + PAGE */
static_assert(FP_ARENA_MIN_SPLIT >=
                  sizeof(fp_block_t) + 4u * FP_ARENA_MAX_PROCS + 63u + FP_ARENA_PAGE,
              "a split tail holds a whole block in an arena of any size");

static inline uint64_t fp_arena_regions_offset(uint32_t nprocs)
{
    return fp_arena_align(sizeof(fp_arena_t) + 8ull * nprocs, FP_ARENA_PAGE);
}

/* The arena's bytes, or 0 when the geometry is impossible (too many processes,
 * a region that holds no block or is not a page multiple, over FP_ARENA_MAX_BYTES). */
static inline uint64_t fp_arena_size(uint32_t nprocs, uint64_t region_size)
{
    if (nprocs < 2 || nprocs > FP_ARENA_MAX_PROCS || region_size % FP_ARENA_PAGE ||
        region_size < fp_arena_min_block(nprocs))
        return 0;
    uint64_t roff = fp_arena_regions_offset(nprocs);
    if (region_size > (FP_ARENA_MAX_BYTES - roff) / nprocs) /* before the product: no wrap */
        return 0;
    return roff + (uint64_t)nprocs * region_size;
}

static inline fp_arena_t *fp_arena_head(const fp_arena_view_t *v) { return (fp_arena_t *)v->base; }

/* The caller checked r < v->nprocs. */
static inline fp_a64 *fp_arena_top(const fp_arena_view_t *v, uint32_t r)
{
    return (fp_a64 *)(v->base + sizeof(fp_arena_t)) + r;
}

static inline uint64_t fp_arena_region(const fp_arena_view_t *v, uint32_t r)
{
    return v->regions_offset + (uint64_t)r * v->region_size;
}

/* The caller checked that off names a header inside the mapping. */
static inline fp_block_t *fp_arena_block(const fp_arena_view_t *v, uint64_t off)
{
    return (fp_block_t *)(v->base + off);
}

static inline fp_a32 *fp_block_counts(fp_block_t *b)
{
    return (fp_a32 *)((unsigned char *)b + sizeof(fp_block_t));
}

static inline uint64_t fp_arena_next_gen(const fp_arena_view_t *v)
{
    return fp_add64_seqcst(&fp_arena_head(v)->gen_seq, 1) + 1;
}

static inline int fp_block_free(const fp_arena_view_t *v, fp_block_t *b)
{
    fp_a32 *c = fp_block_counts(b);
    for (uint32_t i = 0; i < v->nprocs; i++)
        if (fp_load32_seqcst(&c[i]))
            return 0;
    return 1;
}

/* Free and a real header: the only blocks an allocator may merge or reuse. */
static inline int fp_block_reusable(const fp_arena_view_t *v, fp_block_t *b)
{
    return b->magic == FP_BLOCK_MAGIC && fp_block_free(v, b);
}

static inline int fp_arena_bad(fp_arena_damage_t *d, uint32_t region, int why, uint64_t at,
                               uint64_t value)
{
    if (d) {
        d->region = region;
        d->why = why;
        d->at = at;
        d->value = value;
    }
    return FP_CORRUPT;
}

static inline void fp_arena_view_fill(fp_arena_view_t *v, void *base, uint32_t nprocs,
                                      uint64_t region_size, uint64_t budget, uint64_t token)
{
    v->base = (unsigned char *)base;
    v->nprocs = nprocs;
    v->region_size = region_size;
    v->budget = budget;
    v->token = token;
    v->regions_offset = fp_arena_regions_offset(nprocs);
    v->total_size = fp_arena_size(nprocs, region_size);
    v->hdr = fp_arena_hdr_size(nprocs);
    v->min_block = fp_arena_min_block(nprocs);
    v->_pad = 0;
}

/* On a zero-filled mapping of `mapped` >= fp_arena_size(nprocs, region_size)
 * bytes: writes the header and fills this process's view. */
static inline int fp_arena_init(void *base, uint64_t mapped, uint32_t nprocs, uint64_t region_size,
                                uint64_t budget, uint64_t token, fp_arena_view_t *v)
{
    uint64_t total = fp_arena_size(nprocs, region_size);
    if (total == 0 || total > mapped)
        return FP_CORRUPT;
    fp_arena_t *a = (fp_arena_t *)base;
    a->version = FP_ARENA_VERSION;
    a->nprocs = nprocs;
    a->region_size = region_size;
    a->budget = budget;
    a->token = token;
    a->regions_offset = fp_arena_regions_offset(nprocs);
    a->total_size = total;
    fp_fence_seqcst();
    a->magic = FP_ARENA_MAGIC; /* last: an attach never sees a half-made header */
    fp_arena_view_fill(v, base, nprocs, region_size, budget, token);
    return FP_OK;
}

/* Checks a private copy of the header (never the shared one: it could change
 * between the check and the use) against the bytes the file really holds. */
static inline int fp_arena_check(const fp_arena_t *head, uint64_t file_size)
{
    if (head->magic != FP_ARENA_MAGIC || head->version != FP_ARENA_VERSION)
        return FP_CORRUPT;
    uint64_t total = fp_arena_size(head->nprocs, head->region_size);
    if (total == 0 || head->total_size != total ||
        head->regions_offset != fp_arena_regions_offset(head->nprocs) || total > file_size)
        return FP_CORRUPT;
    return FP_OK;
}

/* Fills this process's view from a checked private copy of the header and
 * its own mapping of at least head->total_size bytes. */
static inline int fp_arena_attach(const fp_arena_t *head, void *base, uint64_t mapped,
                                  fp_arena_view_t *v)
{
    if (fp_arena_check(head, mapped) != FP_OK)
        return FP_CORRUPT;
    fp_arena_view_fill(v, base, head->nprocs, head->region_size, head->budget, head->token);
    return FP_OK;
}

/* ------------------------------------------------------------------ walker */

/* The one walk over a region's chain: the allocator, reclaim, usage, checks,
 * resets and the close-time punch of free pages all go through it.
 *
 *   fp_arena_walk_t w;
 *   fp_arena_walk_begin(&w, v, r);          (FP_CORRUPT at once for a bad top)
 *   while ((rc = fp_arena_walk_next(&w, &off, &size)) == 1)
 *       ... block at off, size bytes (both checked) ...
 *   rc < 0: damaged; w.damage says where and why.  Once damaged, it stays so,
 *   and a bad top fails the first fp_arena_walk_next too. */
typedef struct {
    const fp_arena_view_t *v;
    uint64_t base;  /* the region's first byte */
    uint64_t end;   /* base + top, the top checked */
    uint64_t next;  /* the next block's offset */
    uint64_t left;  /* blocks still allowed: the walk's bound */
    fp_arena_damage_t damage;
} fp_arena_walk_t;

/* The caller checked r < v->nprocs. */
static inline int fp_arena_walk_begin(fp_arena_walk_t *w, const fp_arena_view_t *v, uint32_t r)
{
    w->v = v;
    w->base = w->next = w->end = fp_arena_region(v, r);
    w->left = v->region_size / FP_ARENA_PAGE;
    w->damage = (fp_arena_damage_t){r, FP_ARENA_BAD_NONE, 0, 0};
    uint64_t top = fp_load64_acquire(fp_arena_top(v, r)); /* read once */
    if (top > v->region_size || top % FP_ARENA_PAGE)
        return fp_arena_bad(&w->damage, r, FP_ARENA_BAD_TOP, 0, top);
    w->end = w->base + top;
    return FP_OK;
}

/* 1: the next block is at *off, *size bytes (read once, checked); 0: the chain
 * ended exactly at the top; FP_CORRUPT: damaged, w->damage says how. */
static inline int fp_arena_walk_next(fp_arena_walk_t *w, uint64_t *off, uint64_t *size)
{
    if (w->damage.why != FP_ARENA_BAD_NONE)
        return FP_CORRUPT;
    uint64_t o = w->next;
    if (o == w->end)
        return 0;
    uint32_t r = w->damage.region;
    if (w->left == 0) /* unreachable while sizes are checked; the bound does not rest on that */
        return fp_arena_bad(&w->damage, r, FP_ARENA_BAD_TOO_MANY, o - w->base, 0);
    const fp_arena_view_t *v = w->v;
    uint64_t s = fp_load64_acquire(&fp_arena_block(v, o)->size); /* read once */
    if (s < v->min_block)
        return fp_arena_bad(&w->damage, r, FP_ARENA_BAD_SIZE, o - w->base, s);
    if (s % FP_ARENA_PAGE)
        return fp_arena_bad(&w->damage, r, FP_ARENA_BAD_ALIGN, o - w->base, s);
    if (s > w->end - o)
        return fp_arena_bad(&w->damage, r, FP_ARENA_BAD_PAST_TOP, o - w->base, s);
    w->next = o + s;
    w->left--;
    *off = o;
    *size = s;
    return 1;
}

static inline int fp_arena_walk_fail(const fp_arena_walk_t *w, fp_arena_damage_t *d)
{
    if (d)
        *d = w->damage;
    return FP_CORRUPT;
}

/* --------------------------------------------------------------- allocator */

#define FP_ARENA_TOP_UNKNOWN UINT64_MAX

/* Takes (or reuses) a block of at least nbytes data in region p, holding one
 * reference for p; *out is the block as the caller may trust it.  *fresh_len
 * is nonzero when the block was bumped, never used before: the caller commits
 * [out->off, out->off + *fresh_len) (e.g. fallocate) or undoes it
 * (fp_arena_unbump).  Only process p may call this for region p.
 *
 * own_top (NULL: not kept) is the caller's private record of its region's
 * top, FP_ARENA_TOP_UNKNOWN until its first allocation: only the owner moves
 * that top, so a shared top that differs from it was written by someone else
 * (lowered to a block boundary, it would make the next bump land on live
 * blocks) and is reported as damage. */
static inline int fp_arena_alloc_capped(const fp_arena_view_t *v, uint32_t p, uint64_t nbytes,
                                        uint64_t cap, fp_arena_blk_t *out, uint64_t *fresh_len,
                                        uint64_t *own_top, fp_arena_damage_t *dmg);

static inline int fp_arena_alloc(const fp_arena_view_t *v, uint32_t p, uint64_t nbytes,
                                 fp_arena_blk_t *out, uint64_t *fresh_len, uint64_t *own_top,
                                 fp_arena_damage_t *dmg)
{
    return fp_arena_alloc_capped(v, p, nbytes, v->budget, out, fresh_len, own_top, dmg);
}

/* fp_arena_alloc, but a bump (never a reuse) also fails with FP_NOSPACE when
 * the arena's committed bytes would pass cap (at most the budget): NumPy's
 * allocations in a worker (fastpool/_alloc.pyx) leave the rest of the budget
 * to the arrays the parent shares. */
static inline int fp_arena_alloc_capped(const fp_arena_view_t *v, uint32_t p, uint64_t nbytes,
                                        uint64_t cap, fp_arena_blk_t *out, uint64_t *fresh_len,
                                        uint64_t *own_top, fp_arena_damage_t *dmg)
{
    if (cap > v->budget)
        cap = v->budget;
    *fresh_len = 0;
    if (p >= v->nprocs)
        return fp_arena_bad(dmg, v->nprocs, FP_ARENA_BAD_PROC, 0, p);
    if (nbytes > v->region_size - v->hdr) /* before the arithmetic: hdr + nbytes could wrap */
        return FP_NOSPACE;
    uint64_t need = fp_arena_align(v->hdr + (nbytes ? nbytes : 1), FP_ARENA_PAGE);
    if (need > v->region_size)
        return FP_NOSPACE;
    fp_arena_walk_t w;
    if (fp_arena_walk_begin(&w, v, p) != FP_OK)
        return fp_arena_walk_fail(&w, dmg);
    if (own_top && *own_top != FP_ARENA_TOP_UNKNOWN && w.end - w.base != *own_top)
        return fp_arena_bad(dmg, p, FP_ARENA_BAD_TOP, 0, w.end - w.base);
    uint64_t off, s;
    int rc;
    while ((rc = fp_arena_walk_next(&w, &off, &s)) == 1) {
        fp_block_t *b = fp_arena_block(v, off);
        if (!fp_block_reusable(v, b))
            continue;
        /* merge free successors: one store of the size, so a crash leaves a valid
         * chain.  A successor found in use ends the merge and is skipped by the walk. */
        uint64_t coff, cs;
        while (s < need && (rc = fp_arena_walk_next(&w, &coff, &cs)) == 1) {
            fp_block_t *c = fp_arena_block(v, coff);
            if (!fp_block_reusable(v, c))
                break;
            s += cs;
            fp_store64_release(&b->size, s);
            c->magic = 0; /* absorbed: a stale descriptor for it is no longer valid */
        }
        if (rc < 0)
            break;
        if (s < need)
            continue;
        /* Claim before use: a new generation first, then the counts again.  A
         * racing fp_arena_ref (count++, then gen) either sees the new generation
         * and backs off, or is seen here, and the block is skipped. */
        uint64_t gen = fp_arena_next_gen(v);
        fp_store64_seqcst(&b->gen, gen);
        if (!fp_block_free(v, b))
            continue;
        if (s - need >= FP_ARENA_MIN_SPLIT) {
            fp_block_t *t = fp_arena_block(v, off + need); /* the tail first, then shrink */
            memset((void *)fp_block_counts(t), 0, 4ull * v->nprocs);
            t->owner = p;
            fp_store64_release(&t->gen, fp_arena_next_gen(v));
            fp_store64_release(&t->size, s - need);
            t->magic = FP_BLOCK_MAGIC;
            fp_store64_release(&b->size, need);
            s = need;
        }
        fp_add32_seqcst(&fp_block_counts(b)[p], 1);
        *out = (fp_arena_blk_t){off, s, gen};
        return FP_OK;
    }
    if (rc < 0)
        return fp_arena_walk_fail(&w, dmg);
    uint64_t used = w.end - w.base;
    if (own_top)
        *own_top = used; /* checked by the walk: the chain tiles [base, base + used) */
    if (need > v->region_size - used)
        return FP_NOSPACE;
    fp_arena_t *a = fp_arena_head(v);
    uint64_t committed = fp_load64_acquire(&a->committed);
    if (committed > cap || need > cap - committed)
        return FP_NOSPACE;
    uint64_t end = w.end;
    fp_block_t *b = fp_arena_block(v, end);
    uint64_t gen = fp_arena_next_gen(v);
    b->magic = FP_BLOCK_MAGIC;
    b->owner = p;
    memset((void *)fp_block_counts(b), 0, 4ull * v->nprocs);
    fp_store64_release(&b->gen, gen);
    fp_store64_release(&b->size, need);
    fp_store32_release(&fp_block_counts(b)[p], 1);
    fp_store64_release(fp_arena_top(v, p), used + need); /* last: publishes the block */
    fp_add64_relaxed(&a->committed, need);
    if (own_top)
        *own_top = used + need;
    *out = (fp_arena_blk_t){end, need, gen};
    *fresh_len = need;
    return FP_OK;
}

/* Undoes the bump of a fresh block the caller could not commit (owner only);
 * blk is what fp_arena_alloc returned, not a re-read of the header. */
static inline void fp_arena_unbump(const fp_arena_view_t *v, uint32_t p, const fp_arena_blk_t *blk,
                                   uint64_t *own_top)
{
    if (p >= v->nprocs)
        return;
    uint64_t base = fp_arena_region(v, p);
    fp_a64 *top = fp_arena_top(v, p);
    if (base + fp_load64_acquire(top) == blk->off + blk->size) {
        fp_store64_release(top, blk->off - base);
        if (own_top)
            *own_top = blk->off - base;
        /* modular: a subtraction */
        fp_add64_relaxed(&fp_arena_head(v)->committed, (uint64_t)0 - blk->size);
    }
    fp_store32_release(&fp_block_counts(fp_arena_block(v, blk->off))[p], 0);
}

/* The owner p takes a free block of its own region out of reuse, to give its
 * pages back: a new generation first, then the counts again, as the allocator
 * claims a block, so a racing fp_arena_ref with a stale descriptor either sees
 * the new generation and backs off, or is seen here and the block is left
 * alone.  1: claimed, p holds the one reference (fp_arena_unref drops it);
 * 0: someone references it.  Only p may call this for region p (it is the
 * only process that merges, splits or reuses that region's blocks). */
static inline int fp_arena_claim_free(const fp_arena_view_t *v, uint32_t p, uint64_t off)
{
    fp_block_t *b = fp_arena_block(v, off);
    if (p >= v->nprocs || !fp_block_reusable(v, b))
        return 0;
    fp_store64_seqcst(&b->gen, fp_arena_next_gen(v));
    if (!fp_block_free(v, b))
        return 0;
    fp_store32_release(&fp_block_counts(b)[p], 1);
    return 1;
}

static inline void fp_arena_add_returned(const fp_arena_view_t *v, uint64_t n)
{
    fp_add64_relaxed(&fp_arena_head(v)->returned, n);
}

static inline uint64_t fp_arena_returned(const fp_arena_view_t *v)
{
    return fp_load64_relaxed(&fp_arena_head(v)->returned);
}

/* -------------------------------------------------------------- references */

/* The region of off, when off can be a block header (page-aligned, a whole
 * smallest block before the region's end); FP_CORRUPT otherwise. */
static inline int fp_arena_locate(const fp_arena_view_t *v, uint64_t off, uint32_t *region,
                                  uint64_t *in_region, fp_arena_damage_t *dmg)
{
    if (off < v->regions_offset || off >= v->total_size || off % FP_ARENA_PAGE)
        return fp_arena_bad(dmg, v->nprocs, FP_ARENA_BAD_OFFSET, off, off);
    uint64_t rel = off - v->regions_offset;
    uint64_t r = rel / v->region_size, in = rel % v->region_size;
    if (in > v->region_size - v->min_block)
        return fp_arena_bad(dmg, (uint32_t)r, FP_ARENA_BAD_OFFSET, in, off);
    *region = (uint32_t)r;
    *in_region = in;
    return FP_OK;
}

/* Process p's counter in the header at off, or NULL when off cannot be one. */
static inline fp_a32 *fp_arena_counter(const fp_arena_view_t *v, uint32_t p, uint64_t off)
{
    uint32_t r;
    uint64_t in;
    if (p >= v->nprocs || fp_arena_locate(v, off, &r, &in, NULL) != FP_OK)
        return NULL;
    return &fp_block_counts(fp_arena_block(v, off))[p];
}

/* Process p takes a reference on the block at off, if it is still generation
 * gen.  *out gets the block's size from one checked read: it fits inside the
 * region's top, is a page multiple and holds a header; the caller uses that
 * size from then on, whatever the header says later. */
static inline int fp_arena_ref(const fp_arena_view_t *v, uint32_t p, uint64_t off, uint64_t gen,
                               fp_arena_blk_t *out, fp_arena_damage_t *dmg)
{
    uint32_t r;
    uint64_t in;
    if (p >= v->nprocs)
        return fp_arena_bad(dmg, v->nprocs, FP_ARENA_BAD_PROC, 0, p);
    if (fp_arena_locate(v, off, &r, &in, dmg) != FP_OK)
        return FP_CORRUPT;
    fp_block_t *b = fp_arena_block(v, off);
    if (b->magic != FP_BLOCK_MAGIC)
        return fp_arena_bad(dmg, r, FP_ARENA_BAD_MAGIC, in, b->magic);
    uint64_t top = fp_load64_acquire(fp_arena_top(v, r)); /* each read once */
    uint64_t s = fp_load64_acquire(&b->size);
    if (top > v->region_size || top % FP_ARENA_PAGE)
        return fp_arena_bad(dmg, r, FP_ARENA_BAD_TOP, 0, top);
    if (s < v->min_block)
        return fp_arena_bad(dmg, r, FP_ARENA_BAD_SIZE, in, s);
    if (s % FP_ARENA_PAGE)
        return fp_arena_bad(dmg, r, FP_ARENA_BAD_ALIGN, in, s);
    if (in >= top || s > top - in)
        return fp_arena_bad(dmg, r, FP_ARENA_BAD_PAST_TOP, in, s);
    fp_add32_seqcst(&fp_block_counts(b)[p], 1);
    if (fp_load64_seqcst(&b->gen) != gen) { /* seq_cst: pairs with the claim in fp_arena_alloc */
        fp_sub32_seqcst(&fp_block_counts(b)[p], 1);
        return FP_STALE;
    }
    *out = (fp_arena_blk_t){off, s, gen};
    return FP_OK;
}

/* Drops one of process p's references; never below zero, so a reference the
 * parent already reclaimed for a dead worker cannot be dropped twice.  The CAS
 * loop is bounded: a counter that some process rewrites without end is left
 * one too high (the block leaks) rather than spun on. */
static inline int fp_arena_unref(const fp_arena_view_t *v, uint32_t p, uint64_t off)
{
    fp_a32 *c = fp_arena_counter(v, p, off);
    if (c == NULL)
        return FP_CORRUPT;
    uint32_t n = fp_load32_seqcst(c);
    for (int tries = 0; n > 0 && tries < (1 << 20); tries++)
        if (fp_cas32_acqrel(c, &n, n - 1))
            return FP_OK;
    return n == 0 ? FP_OK : FP_AGAIN;
}

static inline int fp_arena_count(const fp_arena_view_t *v, uint32_t p, uint64_t off, uint32_t *out)
{
    fp_a32 *c = fp_arena_counter(v, p, off);
    if (c == NULL)
        return FP_CORRUPT;
    *out = fp_load32_seqcst(c);
    return FP_OK;
}

static inline int fp_arena_is_free(const fp_arena_view_t *v, uint64_t off, int *out)
{
    if (fp_arena_counter(v, 0, off) == NULL)
        return FP_CORRUPT;
    *out = fp_block_free(v, fp_arena_block(v, off));
    return FP_OK;
}

/* ------------------------------------------------------- whole-arena walks */

typedef void (*fp_arena_visit_fn)(const fp_arena_view_t *v, uint64_t off, uint64_t size, void *ctx);

/* Calls fn(v, off, size, ctx) on every block of region r (the caller checked
 * r < nprocs), up to its damage: FP_OK, or FP_CORRUPT and *dmg. */
static inline int fp_arena_visit(const fp_arena_view_t *v, uint32_t r, fp_arena_visit_fn fn,
                                 void *ctx, fp_arena_damage_t *dmg)
{
    fp_arena_walk_t w;
    uint64_t off, s;
    int rc;
    fp_arena_walk_begin(&w, v, r); /* a bad top makes the first next report it */
    while ((rc = fp_arena_walk_next(&w, &off, &s)) == 1)
        fn(v, off, s, ctx);
    return rc < 0 ? fp_arena_walk_fail(&w, dmg) : FP_OK;
}

/* fp_arena_visit over every region: each damaged region is visited up to its
 * damage, the others in full, and the first damage is reported. */
static inline int fp_arena_each(const fp_arena_view_t *v, fp_arena_visit_fn fn, void *ctx,
                                fp_arena_damage_t *dmg)
{
    int status = FP_OK;
    for (uint32_t r = 0; r < v->nprocs; r++)
        if (fp_arena_visit(v, r, fn, ctx, status == FP_OK ? dmg : NULL) != FP_OK)
            status = FP_CORRUPT;
    return status;
}

static inline void fp_arena_count_one(const fp_arena_view_t *v, uint64_t off, uint64_t size,
                                      void *ctx)
{
    (void)v, (void)off, (void)size;
    (*(uint64_t *)ctx)++;
}

/* Walks region r to its end: FP_OK and the number of blocks, or FP_CORRUPT. */
static inline int fp_arena_check_region(const fp_arena_view_t *v, uint32_t r, uint64_t *nblocks,
                                        fp_arena_damage_t *dmg)
{
    *nblocks = 0;
    if (r >= v->nprocs)
        return fp_arena_bad(dmg, v->nprocs, FP_ARENA_BAD_PROC, 0, r);
    return fp_arena_visit(v, r, fp_arena_count_one, nblocks, dmg);
}

typedef struct {
    uint32_t p;
    uint64_t held;
} fp_arena_reclaim_ctx_t;

static inline void fp_arena_reclaim_one(const fp_arena_view_t *v, uint64_t off, uint64_t size,
                                        void *ctx)
{
    (void)size;
    fp_arena_reclaim_ctx_t *c = (fp_arena_reclaim_ctx_t *)ctx;
    fp_block_t *b = fp_arena_block(v, off);
    /* magic: a block merged away a moment ago is no header now (and was free) */
    if (b->magic == FP_BLOCK_MAGIC && fp_xchg32_acqrel(&fp_block_counts(b)[c->p], 0))
        c->held++;
}

/* The parent, after process p died: drop every reference p held, in every
 * region.  *held counts the blocks p was holding.  A damaged region is
 * reclaimed up to its damage and the others in full (fp_arena_each). */
static inline int fp_arena_reclaim(const fp_arena_view_t *v, uint32_t p, uint64_t *held,
                                   fp_arena_damage_t *dmg)
{
    *held = 0;
    if (p >= v->nprocs)
        return fp_arena_bad(dmg, v->nprocs, FP_ARENA_BAD_PROC, 0, p);
    fp_arena_reclaim_ctx_t c = {p, 0};
    int rc = fp_arena_each(v, fp_arena_reclaim_one, &c, dmg);
    *held = c.held;
    return rc;
}

typedef struct {
    uint64_t live, idle, nlive;
} fp_arena_usage_ctx_t;

static inline void fp_arena_usage_one(const fp_arena_view_t *v, uint64_t off, uint64_t size,
                                      void *ctx)
{
    fp_arena_usage_ctx_t *c = (fp_arena_usage_ctx_t *)ctx;
    if (fp_block_free(v, fp_arena_block(v, off))) {
        c->idle += size;
    } else {
        c->live += size;
        c->nlive++;
    }
}

/* Bytes in live (referenced) blocks and in free blocks, over all regions; a
 * damaged region counts up to its damage (fp_arena_each). */
static inline int fp_arena_usage(const fp_arena_view_t *v, uint64_t *live, uint64_t *idle,
                                 uint64_t *nlive, fp_arena_damage_t *dmg)
{
    fp_arena_usage_ctx_t c = {0, 0, 0};
    int rc = fp_arena_each(v, fp_arena_usage_one, &c, dmg);
    *live = c.live;
    *idle = c.idle;
    *nlive = c.nlive;
    return rc;
}

typedef struct {
    uint32_t p;
    uint64_t bytes;
} fp_arena_held_ctx_t;

static inline void fp_arena_held_one(const fp_arena_view_t *v, uint64_t off, uint64_t size,
                                     void *ctx)
{
    fp_arena_held_ctx_t *c = (fp_arena_held_ctx_t *)ctx;
    if (fp_load32_seqcst(&fp_block_counts(fp_arena_block(v, off))[c->p]))
        c->bytes += size;
}

/* Bytes of the blocks in region p that process p itself still references:
 * what a worker allocated in shared memory (its NumPy arrays, through the
 * allocator hook) and holds, which its RSS counts as shared, not its own. */
static inline int fp_arena_held(const fp_arena_view_t *v, uint32_t p, uint64_t *bytes,
                                fp_arena_damage_t *dmg)
{
    fp_arena_held_ctx_t c = {p, 0};
    int rc = p < v->nprocs ? fp_arena_visit(v, p, fp_arena_held_one, &c, dmg) : FP_CORRUPT;
    *bytes = c.bytes;
    return rc;
}

/* Makes region r's chain whole again after its owner died (the caller
 * reclaimed the owner's references first), or on the caller's own region.
 *
 * An intact chain is left as it is: every block someone references stays,
 * free blocks stay free for the next owner.  A damaged chain is cut at the
 * damage: blocks before it stay as they are; from the damage up to the
 * region's old top (the region's end when the top itself is garbage) becomes
 * one quarantined block, pinned with FP_ARENA_PIN in the parent's counter so
 * it is never reused.  That span may still hold blocks other processes map
 * (the parent's results, another worker's inputs) that the damaged chain no
 * longer names; their bytes and their own headers are left untouched, and
 * only the one header at the damage is rewritten.
 *
 * FP_OK once the chain is whole; dmg->why says what was found (NONE: intact)
 * and *quarantined the bytes set aside. */
/* keep_below: where (relative to the region's base) the furthest block that any
 * other process may still hold ends, by the caller's own account (the parent
 * sees a descriptor for every block that leaves a worker's region).  With a
 * garbage top, only [cut, keep_below) is quarantined, not the rest of the region. */
static inline int fp_arena_reset_region(const fp_arena_view_t *v, uint32_t r, uint64_t keep_below,
                                        uint64_t *quarantined, fp_arena_damage_t *dmg)
{
    *quarantined = 0;
    *dmg = (fp_arena_damage_t){r, FP_ARENA_BAD_NONE, 0, 0};
    if (r >= v->nprocs)
        return fp_arena_bad(dmg, v->nprocs, FP_ARENA_BAD_PROC, 0, r);
    fp_arena_walk_t w;
    uint64_t off, s;
    int top_bad = fp_arena_walk_begin(&w, v, r) != FP_OK;
    if (top_bad) { /* garbage top: keep what holds together, up to the region's end */
        *dmg = w.damage;
        w.damage.why = FP_ARENA_BAD_NONE;
        w.end = w.base + v->region_size;
    }
    int rc;
    while ((rc = fp_arena_walk_next(&w, &off, &s)) == 1)
        ;
    if (rc == 0 && !top_bad)
        return FP_OK;
    if (!top_bad)
        *dmg = w.damage;
    uint64_t cut = w.next - w.base; /* the first byte the chain cannot vouch for */
    uint64_t high = top_bad ? v->region_size : w.end - w.base;
    if (top_bad)
        high = keep_below > cut ? (keep_below < v->region_size ? keep_below : v->region_size) : cut;
    fp_a64 *top = fp_arena_top(v, r);
    if (cut == high || v->region_size - cut < v->min_block) {
        /* nothing past the cut, or too little for any block: the top moves to it */
        fp_store64_release(top, cut);
        return FP_OK;
    }
    if (high - cut < v->min_block)
        high = cut + v->min_block;
    fp_block_t *q = fp_arena_block(v, w.next);
    fp_store32_release(&fp_block_counts(q)[0], FP_ARENA_PIN);
    q->owner = r;
    fp_store64_seqcst(&q->gen, fp_arena_next_gen(v)); /* old descriptors of this header go stale */
    fp_store64_release(&q->size, high - cut);
    q->magic = FP_BLOCK_MAGIC;
    fp_store64_release(top, high);
    *quarantined = high - cut;
    return FP_OK;
}

#endif /* FP_ARENA_H */
