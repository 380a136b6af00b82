/* Claims about fp_arena.h: init/check, the bump allocator of each region, the
 * reuse, split and merge of free blocks, generation numbers against stale
 * descriptors, per-process reference counts, reclaim of a dead process's
 * references, and two cross-process runs on a MAP_SHARED arena: children
 * taking and dropping references on the same blocks, and a child SIGKILLed
 * while allocating in its own region, after which the parent reclaims it and
 * the chains are whole.
 *
 * Four tests pin defects found in review and fixed since: a merged-away block
 * that still took references, generations repeating at an offset, a size that
 * wrapped around, and a reference racing a reuse (now claimed gen-first). */
#include <signal.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fp_arena.h"

#define MS 1000000LL
#define PAGE FP_ARENA_PAGE
#define NPROCS 4u
#define REGION (1024u * 1024u)

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#define H(a) fp_arena_head(a)

/* A zero-filled shared mapping, as the memfd gives the pool; the view (the
 * process's private geometry) is malloc'd and only its base is filled. */
static fp_arena_view_t *arena_map(uint32_t nprocs, uint64_t region, uint64_t *size)
{
    *size = fp_arena_size(nprocs, region);
    if (*size == 0) /* a geometry the layout refuses: map something to refuse it on */
        *size = 64 * PAGE;
    void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    fp_arena_view_t *v = calloc(1, sizeof(*v));
    CHECK(v != NULL);
    v->base = p;
    return v;
}

static fp_arena_view_t *arena_new(uint32_t nprocs, uint64_t region, uint64_t budget, uint64_t *size)
{
    fp_arena_view_t *a = arena_map(nprocs, region, size);
    CHECK_EQ(fp_arena_init(a->base, *size, nprocs, region, budget, 0x1234abcdull, a), FP_OK);
    fp_arena_t copy;
    memcpy(&copy, a->base, sizeof(copy));
    CHECK_EQ(fp_arena_check(&copy, *size), FP_OK);
    return a;
}

static void arena_free(fp_arena_view_t *a, uint64_t size)
{
    munmap(a->base, size);
    free(a);
}

/* fp_arena_check on a private copy of the header, as attach does. */
static int t_check(fp_arena_view_t *a, uint64_t mapped)
{
    fp_arena_t copy;
    memcpy(&copy, a->base, sizeof(copy));
    return fp_arena_check(&copy, mapped);
}

/* The calls in the shape most claims below were written in. */
static int t_alloc(fp_arena_view_t *a, uint32_t p, uint64_t nbytes, uint64_t *off, uint64_t *fo,
                   uint64_t *fl)
{
    fp_arena_blk_t b = {0, 0, 0};
    fp_arena_damage_t d;
    int rc = fp_arena_alloc(a, p, nbytes, &b, fl, NULL, &d);
    if (rc == FP_OK) {
        *off = b.off;
        *fo = *fl ? b.off : 0;
        CHECK_EQ(b.size, fp_load64_acquire(&fp_arena_block(a, b.off)->size));
        CHECK_EQ(b.gen, fp_load64_acquire(&fp_arena_block(a, b.off)->gen));
    }
    return rc;
}

static int t_ref(fp_arena_view_t *a, uint32_t p, uint64_t off, uint64_t gen)
{
    fp_arena_blk_t b;
    fp_arena_damage_t d;
    int rc = fp_arena_ref(a, p, off, gen, &b, &d);
    if (rc == FP_OK)
        CHECK(b.off == off && b.gen == gen &&
              b.size == fp_load64_acquire(&fp_arena_block(a, off)->size));
    return rc;
}

static uint32_t t_count(fp_arena_view_t *a, uint32_t p, uint64_t off)
{
    uint32_t n = 0;
    CHECK_EQ(fp_arena_count(a, p, off, &n), FP_OK);
    return n;
}

static uint64_t t_reclaim(fp_arena_view_t *a, uint32_t p)
{
    uint64_t held = 0;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_reclaim(a, p, &held, &d), FP_OK);
    return held;
}

static void t_usage(fp_arena_view_t *a, uint64_t *live, uint64_t *idle, uint64_t *nlive)
{
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_usage(a, live, idle, nlive, &d), FP_OK);
}

/* A block header at off that a ref could accept (the old fp_arena_valid). */
static int t_valid(fp_arena_view_t *a, uint64_t off)
{
    uint32_t r;
    uint64_t in;
    return fp_arena_locate(a, off, &r, &in, NULL) == FP_OK &&
           fp_arena_block(a, off)->magic == FP_BLOCK_MAGIC;
}

static void t_unbump(fp_arena_view_t *a, uint32_t p, uint64_t off)
{
    fp_arena_blk_t b = {off, fp_load64_acquire(&fp_arena_block(a, off)->size), 0};
    fp_arena_unbump(a, p, &b, NULL);
}

static uint64_t hdr(fp_arena_view_t *a) { return fp_arena_hdr_size(a->nprocs); }
static uint64_t need_of(fp_arena_view_t *a, uint64_t nbytes)
{
    return fp_arena_align(hdr(a) + (nbytes ? nbytes : 1), PAGE);
}
static uint64_t top_of(fp_arena_view_t *a, uint32_t p)
{
    return fp_load64_acquire(fp_arena_top(a, p));
}
static uint64_t size_of(fp_arena_view_t *a, uint64_t off)
{
    return fp_load64_acquire(&fp_arena_block(a, off)->size);
}
static uint64_t gen_of(fp_arena_view_t *a, uint64_t off)
{
    return fp_load64_acquire(&fp_arena_block(a, off)->gen);
}
static unsigned char *data_of(fp_arena_view_t *a, uint64_t off) { return a->base + off + hdr(a); }

/* alloc that must succeed; returns the offset, and checks the fresh range. */
static uint64_t must_alloc(fp_arena_view_t *a, uint32_t p, uint64_t nbytes, uint64_t *fresh_len)
{
    uint64_t off = 0, fo = 7, fl = 7;
    int rc = t_alloc(a, p, nbytes, &off, &fo, &fl);
    CHECKF(rc == FP_OK, "alloc(p=%u, %llu bytes) returned %d", p, (unsigned long long)nbytes, rc);
    CHECK(fl == 0 || fo == off);
    if (fresh_len)
        *fresh_len = fl;
    return off;
}

/* Walks every region's chain: each block has the magic, its region as owner,
 * a page-multiple size, and the blocks tile [base, base + top) exactly, so no
 * two overlap.  Returns the number of blocks; *nfree counts the free ones and
 * *sum_top adds up the tops. */
static uint64_t walk(fp_arena_view_t *a, uint64_t *nfree, uint64_t *sum_top)
{
    uint64_t nblocks = 0, free_ = 0, tops = 0;
    for (uint32_t r = 0; r < a->nprocs; r++) {
        uint64_t base = fp_arena_region(a, r), top = top_of(a, r);
        CHECKF(top <= a->region_size && top % PAGE == 0, "region %u top %llu", r,
               (unsigned long long)top);
        uint64_t off = base;
        while (off < base + top) {
            fp_block_t *b = fp_arena_block(a, off);
            uint64_t s = size_of(a, off);
            CHECKF(b->magic == FP_BLOCK_MAGIC, "region %u block at +%llu: bad magic", r,
                   (unsigned long long)(off - base));
            CHECKF(b->owner == r, "region %u block at +%llu: owner %u", r,
                   (unsigned long long)(off - base), b->owner);
            CHECKF(s >= PAGE && s % PAGE == 0 && off + s <= base + top,
                   "region %u block at +%llu: size %llu", r, (unsigned long long)(off - base),
                   (unsigned long long)s);
            CHECK(gen_of(a, off) >= 1);
            free_ += fp_block_free(a, b);
            nblocks++;
            off += s;
        }
        CHECK_EQ(off, base + top);
        tops += top;
    }
    if (nfree)
        *nfree = free_;
    if (sum_top)
        *sum_top = tops;
    return nblocks;
}

/* ---------------------------------------------------------------- init/check */

TEST(arena_init_lays_out_the_header)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, 64u * REGION, &size);
    CHECK_EQ(H(a)->magic, FP_ARENA_MAGIC);
    CHECK_EQ(H(a)->version, FP_ARENA_VERSION);
    CHECK_EQ(a->nprocs, NPROCS);
    CHECK_EQ(a->region_size, REGION);
    CHECK_EQ(a->token, 0x1234abcdull);
    CHECK_EQ(a->total_size, size);
    CHECK_EQ(a->regions_offset % PAGE, 0);
    CHECK(a->regions_offset >= sizeof(fp_arena_t) + 8u * NPROCS);
    CHECK_EQ(size, a->regions_offset + (uint64_t)NPROCS * REGION);
    for (uint32_t p = 0; p < NPROCS; p++) {
        CHECK_EQ(top_of(a, p), 0);
        CHECK_EQ(fp_arena_region(a, p), a->regions_offset + (uint64_t)p * REGION);
    }
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), 0);
    CHECK_EQ(hdr(a) % 64, 0);
    CHECK(hdr(a) >= sizeof(fp_block_t) + 4u * NPROCS);
    CHECK_EQ(fp_arena_hdr_size(1024), fp_arena_align(32 + 4096, 64));
    uint64_t live = 1, idle = 1, nlive = 1;
    t_usage(a, &live, &idle, &nlive);
    CHECK_EQ(live, 0);
    CHECK_EQ(idle, 0);
    CHECK_EQ(nlive, 0);
    CHECK_EQ(t_check(a, size + PAGE), FP_OK); /* a larger mapping is fine */
    arena_free(a, size);
}

TEST(arena_init_refuses_bad_geometry)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_map(NPROCS, REGION, &size);
    fp_arena_view_t v;
    unsigned char *m = a->base;
    /* under 2 processes */
    CHECK_EQ(fp_arena_init(m, size, 1, REGION, REGION, 1, &v), FP_CORRUPT);
    /* over the max */
    CHECK_EQ(fp_arena_init(m, size, FP_ARENA_MAX_PROCS + 1, REGION, REGION, 1, &v), FP_CORRUPT);
    CHECK_EQ(fp_arena_init(m, size, NPROCS, 0, REGION, 1, &v), FP_CORRUPT);
    /* not a page multiple */
    CHECK_EQ(fp_arena_init(m, size, NPROCS, REGION + 8, REGION, 1, &v), FP_CORRUPT);
    /* one block per region */
    CHECK_EQ(fp_arena_init(m, size, NPROCS, PAGE, REGION, 1, &v), FP_OK);
    memset(m, 0, sizeof(fp_arena_t));
    /* mapping too small */
    CHECK_EQ(fp_arena_init(m, size - 1, NPROCS, REGION, REGION, 1, &v), FP_CORRUPT);
    /* regions that together pass FP_ARENA_MAX_BYTES (or wrap 64 bits) */
    CHECK_EQ(fp_arena_init(m, UINT64_MAX, NPROCS, FP_ARENA_MAX_BYTES / NPROCS, REGION, 1, &v),
             FP_CORRUPT);
    CHECK_EQ(fp_arena_init(m, UINT64_MAX, NPROCS, (UINT64_MAX / NPROCS + 1) & ~(uint64_t)(PAGE - 1),
                           1, 1, &v),
             FP_CORRUPT);
    CHECK_EQ(fp_arena_size(NPROCS, UINT64_MAX & ~(uint64_t)(PAGE - 1)), 0);
    /* a header of 1024 counters needs two pages */
    CHECK_EQ(fp_arena_size(FP_ARENA_MAX_PROCS, PAGE), 0);
    CHECK(fp_arena_size(FP_ARENA_MAX_PROCS, 2 * PAGE) != 0);
    CHECK_EQ(H(a)->magic, 0); /* a refused init publishes nothing */
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    arena_free(a, size);
}

TEST(arena_check_refuses_mismatches)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION, &size);
    CHECK_EQ(t_check(a, size - 1), FP_CORRUPT); /* mapping smaller than the arena */
    CHECK_EQ(t_check(a, sizeof(fp_arena_t) - 1), FP_CORRUPT);
    CHECK_EQ(t_check(a, 0), FP_CORRUPT);

    H(a)->magic ^= 1;
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->magic ^= 1;
    CHECK_EQ(t_check(a, size), FP_OK);

    H(a)->version = FP_ARENA_VERSION + 1;
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->version = FP_ARENA_VERSION - 1;
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->version = FP_ARENA_VERSION;
    CHECK_EQ(t_check(a, size), FP_OK);

    H(a)->nprocs = 1;
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->nprocs = FP_ARENA_MAX_PROCS + 1;
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->nprocs = NPROCS + 1; /* total_size no longer matches */
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->nprocs = NPROCS;

    H(a)->region_size += PAGE;
    CHECK_EQ(t_check(a, size + 64 * PAGE), FP_CORRUPT);
    H(a)->region_size -= PAGE;
    H(a)->total_size += PAGE;
    CHECK_EQ(t_check(a, size + PAGE), FP_CORRUPT);
    H(a)->total_size -= PAGE;
    H(a)->regions_offset += PAGE;
    CHECK_EQ(t_check(a, size), FP_CORRUPT);
    H(a)->regions_offset -= PAGE;
    /* a region size and count whose product wraps to the same total */
    H(a)->region_size = (uint64_t)1 << 62;
    H(a)->total_size = H(a)->regions_offset; /* 4 * 2^62 wraps to 0 */
    CHECK_EQ(t_check(a, UINT64_MAX), FP_CORRUPT);
    H(a)->region_size = REGION;
    H(a)->total_size = size;
    CHECK_EQ(t_check(a, size), FP_OK);
    arena_free(a, size);
}

/* --------------------------------------------------------------------- alloc */

TEST(arena_alloc_bumps_page_aligned_blocks_in_its_own_region)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, NPROCS * (uint64_t)REGION, &size);
    uint64_t h = hdr(a);
    static const uint64_t sizes[] = {0, 1, 100, PAGE - 64 /* hdr + n == PAGE */,
                                     PAGE - 63, 3 * PAGE, 200000};
    enum { N = sizeof(sizes) / sizeof(sizes[0]) };
    uint64_t off[N];
    for (uint32_t p = 0; p < NPROCS; p += 3) { /* regions 0 and 3 */
        uint64_t base = fp_arena_region(a, p), expect = base,
                 committed0 = fp_load64_acquire(&H(a)->committed);
        for (int i = 0; i < N; i++) {
            uint64_t fl = 0;
            off[i] = must_alloc(a, p, sizes[i], &fl);
            uint64_t want = need_of(a, sizes[i]);
            CHECKF(off[i] == expect, "p=%u i=%d", p, i);
            CHECK_EQ(off[i] % PAGE, 0);
            CHECK_EQ(size_of(a, off[i]), want);
            CHECK(size_of(a, off[i]) - h >= sizes[i]);
            CHECK_EQ(fl, want); /* all of it is fresh: the caller commits it */
            CHECK(gen_of(a, off[i]) != 0); /* arena-wide sequence: never reused anywhere */
            if (i > 0)
                CHECK(gen_of(a, off[i]) > gen_of(a, off[i - 1]));
            CHECK_EQ(fp_arena_block(a, off[i])->magic, FP_BLOCK_MAGIC);
            CHECK_EQ(fp_arena_block(a, off[i])->owner, p);
            for (uint32_t q = 0; q < NPROCS; q++)
                CHECK_EQ(t_count(a, q, off[i]), q == p);
            CHECK(t_valid(a, off[i]));
            expect += want;
            CHECK_EQ(top_of(a, p), expect - base);
        }
        CHECK_EQ(fp_load64_acquire(&H(a)->committed) - committed0, expect - base);
        /* the data of every block is its own: fill them all, then read back */
        for (int i = 0; i < N; i++)
            memset(data_of(a, off[i]), 0x40 + i, size_of(a, off[i]) - h);
        for (int i = 0; i < N; i++) {
            unsigned char *d = data_of(a, off[i]);
            for (uint64_t k = 0; k < size_of(a, off[i]) - h; k++)
                if (d[k] != 0x40 + i)
                    CHECKF(0, "block %d byte %llu overwritten", i, (unsigned long long)k);
        }
    }
    CHECK_EQ(top_of(a, 1), 0); /* the regions in between are untouched */
    CHECK_EQ(top_of(a, 2), 0);
    uint64_t nfree = 9, tops = 0;
    CHECK_EQ(walk(a, &nfree, &tops), 2 * N);
    CHECK_EQ(nfree, 0);
    CHECK_EQ(tops, fp_load64_acquire(&H(a)->committed));
    arena_free(a, size);
}

TEST(arena_alloc_reports_nospace_when_the_region_is_full)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, 64 * PAGE, NPROCS * 64ull * PAGE, &size);
    uint64_t off = 0, fo = 0, fl = 0;
    /* a request bigger than a whole region never fits */
    CHECK_EQ(t_alloc(a, 1, 64 * PAGE, &off, &fo, &fl), FP_NOSPACE);
    CHECK_EQ(fl, 0);
    /* exactly a whole region does */
    uint64_t whole = must_alloc(a, 1, 64 * PAGE - hdr(a), NULL);
    CHECK_EQ(whole, fp_arena_region(a, 1));
    CHECK_EQ(top_of(a, 1), 64 * PAGE);
    CHECK_EQ(t_alloc(a, 1, 1, &off, &fo, &fl), FP_NOSPACE);
    /* fill region 2 one page at a time */
    for (int i = 0; i < 64; i++)
        must_alloc(a, 2, 1, NULL);
    uint64_t committed = fp_load64_acquire(&H(a)->committed);
    CHECK_EQ(t_alloc(a, 2, 1, &off, &fo, &fl), FP_NOSPACE);
    CHECK_EQ(t_alloc(a, 2, 0, &off, &fo, &fl), FP_NOSPACE);
    CHECK_EQ(top_of(a, 2), 64 * PAGE); /* a refusal changes nothing */
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), committed);
    /* a full region does not stop the others */
    CHECK_EQ(must_alloc(a, 0, 1, NULL), fp_arena_region(a, 0));
    CHECK_EQ(walk(a, NULL, NULL), 66);
    arena_free(a, size);
}

TEST(arena_alloc_reports_nospace_when_the_budget_is_spent)
{
    uint64_t size = 0;
    /* budget: 10 pages, all regions */
    fp_arena_view_t *a = arena_new(NPROCS, 64 * PAGE, 10 * PAGE, &size);
    uint64_t off = 0, fo = 0, fl = 0;
    for (int i = 0; i < 4; i++)
        must_alloc(a, 0, 1, NULL);
    must_alloc(a, 1, 2 * PAGE, NULL); /* 3 pages */
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), 7 * PAGE);
    CHECK_EQ(t_alloc(a, 2, 3 * PAGE, &off, &fo, &fl), FP_NOSPACE); /* 4 pages: over */
    CHECK_EQ(top_of(a, 2), 0);
    uint64_t b = must_alloc(a, 2, 2 * PAGE, NULL); /* 3 pages: exactly the budget */
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), 10 * PAGE);
    CHECK_EQ(t_alloc(a, 3, 1, &off, &fo, &fl), FP_NOSPACE);
    /* a freed block is reused without new budget */
    fp_arena_unref(a, 2, b);
    uint64_t fresh = 1;
    CHECK_EQ(must_alloc(a, 2, 1, &fresh), b);
    CHECK_EQ(fresh, 0);
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), 10 * PAGE);
    arena_free(a, size);
}

TEST(arena_unbump_returns_a_fresh_block)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION, &size);
    uint64_t x = must_alloc(a, 0, 1, NULL);
    uint64_t y = must_alloc(a, 0, 3 * PAGE, NULL);
    uint64_t top = top_of(a, 0), committed = fp_load64_acquire(&H(a)->committed);
    t_unbump(a, 0, y); /* the last block: the top goes back */
    CHECK_EQ(top_of(a, 0), top - size_of(a, y));
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), committed - size_of(a, y));
    CHECK_EQ(t_count(a, 0, y), 0);
    uint64_t fl = 0;
    CHECK_EQ(must_alloc(a, 0, 3 * PAGE, &fl), y); /* bumped again, fresh again */
    CHECK_EQ(fl, size_of(a, y));
    top = top_of(a, 0);
    t_unbump(a, 0, x); /* not the last: only dropped */
    CHECK_EQ(top_of(a, 0), top);
    CHECK_EQ(t_count(a, 0, x), 0);
    CHECK_EQ(must_alloc(a, 0, 1, &fl), x);
    CHECK_EQ(fl, 0);
    arena_free(a, size);
}

/* --------------------------------------------------------- free, reuse, gens */

TEST(arena_block_is_reused_only_when_every_count_is_zero)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t x = must_alloc(a, 0, 5000, NULL);
    uint64_t y = must_alloc(a, 0, 5000, NULL);
    uint64_t gx = gen_of(a, x);
    memset(data_of(a, x), 0xAB, 5000);
    CHECK_EQ(t_ref(a, 1, x, gx), FP_OK);
    CHECK_EQ(t_ref(a, 2, x, gx), FP_OK);
    CHECK_EQ(t_ref(a, 2, x, gx), FP_OK);
    CHECK_EQ(t_count(a, 0, x), 1);
    CHECK_EQ(t_count(a, 1, x), 1);
    CHECK_EQ(t_count(a, 2, x), 2);
    CHECK_EQ(t_count(a, 3, x), 0);

    uint32_t order[] = {0, 2, 1, 2}; /* drop them one by one; x is reused only after the last */
    uint64_t z = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(!fp_block_free(a, fp_arena_block(a, x)));
        fp_arena_unref(a, order[i], x);
        if (i < 3) {
            uint64_t o = must_alloc(a, 0, 5000, NULL); /* must not be x */
            CHECK(o != x && o != y);
            CHECK(z == 0 || o == z); /* the free z of the round before */
            z = o;
            fp_arena_unref(a, 0, z);
        }
    }
    CHECK(fp_block_free(a, fp_arena_block(a, x)));
    uint64_t live = 0, idle = 0, nlive = 0;
    t_usage(a, &live, &idle, &nlive);
    CHECK_EQ(nlive, 1); /* y */
    CHECK_EQ(live, size_of(a, y));
    CHECK_EQ(idle, size_of(a, x) + size_of(a, z));

    uint64_t top = top_of(a, 0), committed = fp_load64_acquire(&H(a)->committed), fl = 1;
    CHECK_EQ(must_alloc(a, 0, 5000, &fl), x); /* same offset, nothing fresh */
    CHECK_EQ(fl, 0);
    CHECK(gen_of(a, x) > gx); /* a new generation: old descriptors are stale */
    CHECK_EQ(top_of(a, 0), top);
    CHECK_EQ(fp_load64_acquire(&H(a)->committed), committed);
    CHECK_EQ(data_of(a, x)[0], 0xAB); /* the pages were touched before and are not replaced */
    CHECK_EQ(data_of(a, x)[4999], 0xAB);
    for (uint32_t q = 0; q < NPROCS; q++)
        CHECK_EQ(t_count(a, q, x), q == 0);
    arena_free(a, size);
}

TEST(arena_unref_never_goes_below_zero)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION, &size);
    uint64_t x = must_alloc(a, 0, 1, NULL);
    fp_arena_unref(a, 0, x);
    fp_arena_unref(a, 0, x);
    fp_arena_unref(a, 3, x);
    CHECK_EQ(t_count(a, 0, x), 0);
    CHECK_EQ(t_count(a, 3, x), 0);
    CHECK(fp_block_free(a, fp_arena_block(a, x)));
    arena_free(a, size);
}

TEST(arena_ref_counts_are_per_process)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t x = must_alloc(a, 2, 1, NULL), g = gen_of(a, x);
    for (uint32_t p = 0; p < NPROCS; p++)
        for (uint32_t k = 0; k < 3 * p + 1; k++)
            CHECK_EQ(t_ref(a, p, x, g), FP_OK);
    for (uint32_t p = 0; p < NPROCS; p++)
        CHECK_EQ(t_count(a, p, x), 3 * p + 1 + (p == 2));
    for (uint32_t p = 0; p < NPROCS; p++)
        fp_arena_unref(a, p, x);
    for (uint32_t p = 0; p < NPROCS; p++)
        CHECK_EQ(t_count(a, p, x), 3 * p + (p == 2));
    CHECK_EQ(t_ref(a, NPROCS, x, g), FP_CORRUPT); /* no such process */
    arena_free(a, size);
}

TEST(arena_stale_descriptor_fails_after_reuse)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t x = must_alloc(a, 0, 1, NULL), g1 = gen_of(a, x);
    CHECK_EQ(g1, 1);
    fp_arena_unref(a, 0, x);
    CHECK_EQ(must_alloc(a, 0, 1, NULL), x);
    uint64_t g2 = gen_of(a, x);
    CHECK(g2 != g1);
    CHECK_EQ(t_ref(a, 1, x, g1), FP_STALE);
    CHECK_EQ(t_count(a, 1, x), 0); /* a refused ref leaves no count behind */
    CHECK_EQ(t_ref(a, 1, x, g2), FP_OK);
    CHECK_EQ(t_count(a, 1, x), 1);
    CHECK_EQ(t_ref(a, 1, x, g2 + 1), FP_STALE);
    CHECK_EQ(t_count(a, 1, x), 1);
    /* offsets that are not blocks at all */
    CHECK_EQ(t_ref(a, 1, x + 64, g2), FP_CORRUPT);                     /* not page aligned */
    CHECK_EQ(t_ref(a, 1, 0, g2), FP_CORRUPT);                          /* the header */
    CHECK_EQ(t_ref(a, 1, a->total_size, g2), FP_CORRUPT);              /* past the end */
    CHECK_EQ(t_ref(a, 1, fp_arena_region(a, 3), 1), FP_CORRUPT);      /* never allocated */
    CHECK_EQ(t_ref(a, 1, x + size_of(a, x), 1), FP_CORRUPT);          /* past the top */
    arena_free(a, size);
}

/* ------------------------------------------------------------ split and merge */

TEST(arena_split_leaves_a_free_tail_and_keeps_small_tails_inside)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t h = hdr(a);
    uint64_t big = must_alloc(a, 0, 64 * PAGE, NULL); /* 65 pages */
    uint64_t fence = must_alloc(a, 0, 1, NULL);       /* keeps the top away */
    CHECK_EQ(size_of(a, big), 65 * PAGE);
    fp_arena_unref(a, 0, big);

    /* 1 page out of 65: the 64-page tail is at least FP_ARENA_MIN_SPLIT, so it splits */
    uint64_t fl = 1;
    CHECK_EQ(must_alloc(a, 0, 1, &fl), big);
    CHECK_EQ(fl, 0);
    CHECK_EQ(size_of(a, big), PAGE);
    uint64_t tail = big + PAGE;
    CHECK(t_valid(a, tail));
    CHECK_EQ(size_of(a, tail), 64 * PAGE);
    CHECK_EQ(fp_arena_block(a, tail)->owner, 0);
    CHECK(fp_block_free(a, fp_arena_block(a, tail)));
    CHECK_EQ(tail + size_of(a, tail), fence);

    /* the tail is reused in turn; a remainder under MIN_SPLIT stays inside */
    uint64_t n = 64 * PAGE - FP_ARENA_MIN_SPLIT + PAGE - h; /* leaves MIN_SPLIT - PAGE */
    CHECK_EQ(must_alloc(a, 0, n, &fl), tail);
    CHECK_EQ(fl, 0);
    CHECK_EQ(size_of(a, tail), 64 * PAGE);
    fp_arena_unref(a, 0, tail);
    n = 64 * PAGE - FP_ARENA_MIN_SPLIT - h; /* leaves exactly MIN_SPLIT: splits */
    CHECK_EQ(must_alloc(a, 0, n, &fl), tail);
    CHECK_EQ(size_of(a, tail), 64 * PAGE - FP_ARENA_MIN_SPLIT);
    CHECK_EQ(size_of(a, tail + size_of(a, tail)), FP_ARENA_MIN_SPLIT);
    uint64_t nfree = 0;
    CHECK_EQ(walk(a, &nfree, NULL), 4);
    CHECK_EQ(nfree, 1);
    arena_free(a, size);
}

TEST(arena_merge_joins_free_neighbours_only)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t b[5];
    for (int i = 0; i < 5; i++)
        b[i] = must_alloc(a, 1, 1, NULL); /* one page each */
    uint64_t top = top_of(a, 1);
    /* b0 free, b1 held, b2 b3 free, b4 held: 2 pages fit only at b2 */
    fp_arena_unref(a, 1, b[0]);
    fp_arena_unref(a, 1, b[2]);
    fp_arena_unref(a, 1, b[3]);
    uint64_t fl = 1;
    CHECK_EQ(must_alloc(a, 1, PAGE, &fl), b[2]);
    CHECK_EQ(fl, 0);
    CHECK_EQ(size_of(a, b[2]), 2 * PAGE);
    CHECK_EQ(size_of(a, b[0]), PAGE);
    CHECK_EQ(size_of(a, b[1]), PAGE);
    CHECK_EQ(size_of(a, b[4]), PAGE);
    CHECK_EQ(top_of(a, 1), top);
    CHECK_EQ(walk(a, NULL, NULL), 4);
    /* nothing free fits 3 pages: a fresh block */
    CHECK_EQ(must_alloc(a, 1, 2 * PAGE, &fl), fp_arena_region(a, 1) + top);
    CHECK_EQ(fl, 3 * PAGE);
    /* free everything before the fresh one: 5 pages merge back into one block */
    fp_arena_unref(a, 1, b[1]);
    fp_arena_unref(a, 1, b[2]);
    fp_arena_unref(a, 1, b[4]);
    CHECK_EQ(must_alloc(a, 1, 4 * PAGE, &fl), b[0]);
    CHECK_EQ(fl, 0);
    CHECK_EQ(size_of(a, b[0]), 5 * PAGE);
    CHECK_EQ(walk(a, NULL, NULL), 2);
    arena_free(a, size);
}

/* ------------------------------------------------------------------- reclaim */

TEST(arena_reclaim_drops_every_reference_of_one_process)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    enum { PER = 5 };
    uint64_t blk[NPROCS][PER];
    for (uint32_t r = 0; r < NPROCS; r++)
        for (int i = 0; i < PER; i++)
            blk[r][i] = must_alloc(a, r, 1000u * (uint64_t)(i + 1), NULL);
    /* process 2 refs every block twice (and holds its own allocations in
     * region 2); process 1 refs blocks 0..2 of every other region; the owners
     * of regions 0, 1, 3 drop their own reference on blocks 3 and 4 */
    uint64_t expect_held = 0;
    for (uint32_t r = 0; r < NPROCS; r++)
        for (int i = 0; i < PER; i++) {
            uint64_t g = gen_of(a, blk[r][i]);
            CHECK_EQ(t_ref(a, 2, blk[r][i], g), FP_OK);
            CHECK_EQ(t_ref(a, 2, blk[r][i], g), FP_OK);
            if (i < 3 && r != 1)
                CHECK_EQ(t_ref(a, 1, blk[r][i], g), FP_OK);
            if (r != 2 && i >= 3)
                /* the owner lets go: only 2 (and maybe 1) hold it */
                fp_arena_unref(a, r, blk[r][i]);
            expect_held++;
        }
    CHECK_EQ(t_reclaim(a, 2), expect_held);
    uint64_t nfree = 0;
    walk(a, &nfree, NULL);
    for (uint32_t r = 0; r < NPROCS; r++)
        for (int i = 0; i < PER; i++) {
            uint64_t o = blk[r][i];
            CHECK_EQ(t_count(a, 2, o), 0);
            int owner_holds = r != 2 && i < 3; /* process 2 was region 2's owner */
            int one_holds = i < 3 && r != 1;
            CHECK_EQ(t_count(a, 1, o), one_holds + (r == 1 && i < 3));
            CHECKF(fp_block_free(a, fp_arena_block(a, o)) == !(owner_holds || one_holds),
                   "r=%u i=%d", r, i);
        }
    CHECK_EQ(nfree, 2 * NPROCS); /* blocks 3 and 4 of every region */
    CHECK_EQ(t_reclaim(a, 2), 0); /* twice is harmless */
    fp_arena_unref(a, 2, blk[0][0]);      /* a late unref of a reclaimed ref stays at zero */
    CHECK_EQ(t_count(a, 2, blk[0][0]), 0);
    /* a freed block is reused by its region's owner */
    uint64_t fl = 1;
    CHECK_EQ(must_alloc(a, 0, 4000, &fl), blk[0][3]);
    CHECK_EQ(fl, 0);
    arena_free(a, size);
}

/* -------------------------------------------------------------- two processes */

static void child_prologue(void)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a parent that fails a CHECK leaves no child */
    if (getppid() == 1)
        _exit(4);
}

static int reap(pid_t pid, int64_t timeout_ns)
{
    int status = 0;
    int64_t deadline = now_ns() + timeout_ns;
    for (;;) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        CHECK(got >= 0);
        if (got == pid)
            return status;
        if (now_ns() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECKF(0, "child %d did not finish", (int)pid);
        }
        sleep_ns(1 * MS);
    }
}

#define CPROCS 5u /* parent + 4 children */
#define CBLOCKS 16
#define CITERS 500000

typedef struct {
    fp_a32 go;
    fp_a32 ready;
    fp_a32 stop;
    fp_a32 _pad;
    fp_a64 ops;
    uint32_t held[CPROCS][CBLOCKS];
} cctl_t;

TEST(arena_procs_concurrent_refs_on_shared_blocks_add_up)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(CPROCS, REGION, REGION * CPROCS, &size);
    cctl_t *ctl =
        mmap(NULL, sizeof(cctl_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(ctl != MAP_FAILED);
    uint64_t off[CBLOCKS], gen[CBLOCKS];
    for (int j = 0; j < CBLOCKS; j++) {
        off[j] = must_alloc(a, 0, 100 + 3000u * (uint64_t)j, NULL);
        gen[j] = gen_of(a, off[j]);
    }
    pid_t kids[CPROCS];
    for (uint32_t i = 1; i < CPROCS; i++) {
        fflush(stdout);
        fflush(stderr);
        kids[i] = fork();
        CHECK(kids[i] >= 0);
        if (kids[i] == 0) {
            child_prologue();
            uint32_t held[CBLOCKS] = {0};
            uint64_t x = 0x5eed + i;
            fp_add32_seqcst(&ctl->ready, 1);
            while (!fp_load32_acquire(&ctl->go))
                fp_cpu_relax();
            for (int it = 0; it < CITERS; it++) {
                x = splitmix64(x);
                int j = (int)(x % CBLOCKS);
                if (held[j] < 4 && ((x >> 32) & 1)) {
                    CHECK_EQ(t_ref(a, i, off[j], gen[j]), FP_OK);
                    held[j]++;
                } else if (held[j] > 0) {
                    fp_arena_unref(a, i, off[j]);
                    held[j]--;
                }
                CHECK_EQ(t_count(a, i, off[j]), held[j]);
            }
            memcpy(ctl->held[i], held, sizeof(held));
            fp_add64_relaxed(&ctl->ops, CITERS);
            _exit(0);
        }
    }
    while (fp_load32_acquire(&ctl->ready) != CPROCS - 1)
        sleep_ns(MS / 10);
    fp_store32_release(&ctl->go, 1);
    /* meanwhile the parent allocates and frees other blocks in region 0, which
     * walks the chain over the shared blocks and must never take one of them */
    uint64_t x = 99, churn = 0;
    int live = CPROCS - 1;
    while (live > 0) {
        for (int k = 0; k < 200; k++) {
            x = splitmix64(x);
            uint64_t o = must_alloc(a, 0, x % 20000, NULL);
            for (int j = 0; j < CBLOCKS; j++)
                CHECK(o != off[j]);
            fp_arena_unref(a, 0, o);
            churn++;
        }
        live = 0;
        for (uint32_t i = 1; i < CPROCS; i++)
            if (kids[i] > 0) {
                int status = 0;
                pid_t got = waitpid(kids[i], &status, WNOHANG);
                CHECK(got >= 0);
                if (got == kids[i]) {
                    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %u: status %#x", i,
                           status);
                    kids[i] = 0;
                } else {
                    live++;
                }
            }
    }
    printf("[%llu child ops, %llu parent allocs] ",
           (unsigned long long)fp_load64_relaxed(&ctl->ops), (unsigned long long)churn);
    CHECK_EQ(fp_load64_relaxed(&ctl->ops), (uint64_t)(CPROCS - 1) * CITERS);
    for (int j = 0; j < CBLOCKS; j++) {
        CHECK_EQ(t_count(a, 0, off[j]), 1);
        CHECK_EQ(gen_of(a, off[j]), gen[j]);
        for (uint32_t i = 1; i < CPROCS; i++)
            CHECKF(t_count(a, i, off[j]) == ctl->held[i][j], "block %d process %u: %u != %u", j, i,
                   t_count(a, i, off[j]), ctl->held[i][j]);
    }
    /* the parent lets go; the children's references keep the blocks alive until reclaimed */
    for (int j = 0; j < CBLOCKS; j++)
        fp_arena_unref(a, 0, off[j]);
    for (uint32_t i = 1; i < CPROCS; i++) {
        uint64_t expect = 0;
        for (int j = 0; j < CBLOCKS; j++)
            expect += ctl->held[i][j] != 0;
        CHECK_EQ(t_reclaim(a, i), expect);
    }
    uint64_t used = 0, idle = 0, nlive = 0;
    t_usage(a, &used, &idle, &nlive);
    CHECK_EQ(nlive, 0);
    CHECK_EQ(used, 0);
    CHECK_EQ(idle, top_of(a, 0));
    munmap(ctl, sizeof(cctl_t));
    arena_free(a, size);
}

#define KPROCS 3u
#define KREGION (512u * 1024u)
#define KROUNDS 30
#define KPARENT 8

typedef struct {
    fp_a64 ops;
    uint64_t poff[KPARENT];
    uint64_t pgen[KPARENT];
} kctl_t;

/* Process 1, until killed: allocates random sizes in region 1 (reuse, split,
 * merge and bump), writes each block's data, refs and drops the parent's
 * blocks, and frees at random. */
static void crash_child(fp_arena_view_t *a, kctl_t *ctl, uint64_t seed)
{
    child_prologue();
    enum { MAXH = 24 };
    uint64_t mine[MAXH], nmine = 0;
    uint32_t pheld[KPARENT] = {0};
    uint64_t x = seed;
    for (;;) {
        x = splitmix64(x);
        uint32_t op = (uint32_t)(x % 8);
        if (op < 4 && nmine < MAXH) {
            uint64_t n = (x >> 8) % 4 == 0 ? (x >> 16) % 160000 : (x >> 16) % 12000;
            uint64_t off = 0, fo = 0, fl = 0;
            int rc = t_alloc(a, 1, n, &off, &fo, &fl);
            if (rc == FP_OK) {
                memset(data_of(a, off), (int)(off >> 12), n);
                mine[nmine++] = off;
            } else {
                CHECK_EQ(rc, FP_NOSPACE);
                op = 4;
            }
        }
        if (op >= 4 && op < 6 && nmine > 0) {
            uint64_t k = (x >> 24) % nmine;
            fp_arena_unref(a, 1, mine[k]);
            mine[k] = mine[--nmine];
        }
        if (op >= 6) {
            int j = (int)((x >> 24) % KPARENT);
            if (op == 6 && pheld[j] < 3) {
                CHECK_EQ(t_ref(a, 1, ctl->poff[j], ctl->pgen[j]), FP_OK);
                pheld[j]++;
            } else if (pheld[j] > 0) {
                fp_arena_unref(a, 1, ctl->poff[j]);
                pheld[j]--;
            }
        }
        fp_add64_relaxed(&ctl->ops, 1);
    }
}

TEST(arena_procs_killed_allocator_is_reclaimed_and_the_chain_stays_whole)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(KPROCS, KREGION, KREGION * KPROCS, &size);
    kctl_t *ctl =
        mmap(NULL, sizeof(kctl_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(ctl != MAP_FAILED);
    for (int j = 0; j < KPARENT; j++) {
        ctl->poff[j] = must_alloc(a, 0, 5000u * (uint64_t)(j + 1), NULL);
        ctl->pgen[j] = gen_of(a, ctl->poff[j]);
    }
    uint64_t seed = (uint64_t)now_ns() ^ (uint64_t)getpid();
    printf("[seed %llu] ", (unsigned long long)seed);
    uint64_t total_ops = 0, total_reclaimed = 0, drift = 0;
    for (int round = 0; round < KROUNDS; round++) {
        fp_store64_relaxed(&ctl->ops, 0);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0)
            crash_child(a, ctl, splitmix64(seed + (uint64_t)round));
        /* round 0 kills almost at once; the others after 0 to 20 ms of work */
        if (round > 0) {
            while (fp_load64_relaxed(&ctl->ops) == 0)
                sleep_ns(MS / 20);
            sleep_ns((int64_t)(splitmix64(seed ^ (uint64_t)round) % 20000) * 1000);
        }
        CHECK(kill(pid, SIGKILL) == 0);
        int status = reap(pid, 5000 * MS);
        CHECKF(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "round %d: child status %#x",
               round, status);
        total_ops += fp_load64_relaxed(&ctl->ops);

        total_reclaimed += t_reclaim(a, 1);
        uint64_t nfree = 0, tops = 0;
        uint64_t nblocks = walk(a, &nfree, &tops);
        /* committed lags the tops only when a kill fell between the top's
         * store and committed's add (fp_arena.h:202-203): counted, not failed */
        drift += fp_load64_acquire(&H(a)->committed) != tops;
        fp_store64_relaxed(&H(a)->committed, tops);
        /* region 1 held only the child's references: all free now */
        uint64_t base = fp_arena_region(a, 1);
        for (uint64_t o = base; o < base + top_of(a, 1); o += size_of(a, o))
            CHECKF(fp_block_free(a, fp_arena_block(a, o)), "round %d: block +%llu still held",
                   round, (unsigned long long)(o - base));
        for (int j = 0; j < KPARENT; j++) {
            CHECK_EQ(t_count(a, 0, ctl->poff[j]), 1);
            CHECK_EQ(t_count(a, 1, ctl->poff[j]), 0);
            CHECK_EQ(gen_of(a, ctl->poff[j]), ctl->pgen[j]);
        }
        CHECK_EQ(nblocks - nfree, KPARENT);
        uint64_t used = 0, idle = 0, nlive = 0;
        t_usage(a, &used, &idle, &nlive);
        CHECK_EQ(nlive, KPARENT);

        /* the replacement in slot 1 (the parent, here) inherits the region:
         * all of its used part is one free run again, then small blocks fill it */
        uint64_t t = top_of(a, 1);
        if (t > 0) {
            uint64_t fl = 1;
            uint64_t o = must_alloc(a, 1, t - hdr(a), &fl);
            CHECK_EQ(o, base);
            CHECK_EQ(fl, 0);
            CHECK_EQ(size_of(a, o), t);
            fp_arena_unref(a, 1, o);
        }
        uint64_t got[KREGION / PAGE], ngot = 0, off = 0, fo = 0, fl = 0;
        int rc;
        while ((rc = t_alloc(a, 1, 3 * PAGE - hdr(a), &off, &fo, &fl)) == FP_OK) {
            CHECK(ngot < KREGION / PAGE);
            got[ngot++] = off;
            memset(data_of(a, off), (int)(ngot & 0xff), 3 * PAGE - hdr(a));
        }
        CHECK_EQ(rc, FP_NOSPACE);
        CHECKF(ngot * 3 * PAGE + 3 * PAGE > KREGION - FP_ARENA_MIN_SPLIT,
               "round %d: only %llu blocks of 3 pages fit in the region", round,
               (unsigned long long)ngot);
        for (uint64_t k = 0; k < ngot; k++) {
            CHECK_EQ(data_of(a, got[k])[0], (unsigned char)((k + 1) & 0xff));
            CHECK_EQ(data_of(a, got[k])[3 * PAGE - hdr(a) - 1], (unsigned char)((k + 1) & 0xff));
            fp_arena_unref(a, 1, got[k]);
        }
        walk(a, NULL, NULL);
    }
    printf("[%llu child ops over %d kills, %llu references reclaimed, "
           "committed off after %llu kills] ",
           (unsigned long long)total_ops, KROUNDS, (unsigned long long)total_reclaimed,
           (unsigned long long)drift);
    munmap(ctl, sizeof(kctl_t));
    arena_free(a, size);
}

/* ------------------------------------------------------------ header defects */

/* fp_arena_alloc's merge (fp_arena.h:161-169) grows the free block's size over
 * its free successors but leaves each absorbed block's header (magic, gen) in
 * place, now inside the merged block's data.  A stale descriptor for an
 * absorbed block therefore still passes fp_arena_valid and the gen check:
 * fp_arena_ref returns FP_OK and its counter increment (fp_arena.h:234) lands
 * in the middle of another allocation's data. */
TEST(arena_stale_descriptor_of_a_merged_block_is_refused)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t x = must_alloc(a, 0, 1, NULL);
    uint64_t y = must_alloc(a, 0, 1, NULL), gy = gen_of(a, y);
    must_alloc(a, 0, 1, NULL); /* keeps the top away */
    fp_arena_unref(a, 0, x);
    fp_arena_unref(a, 0, y);
    /* 2 pages: x and y merge into one block at x */
    CHECK_EQ(must_alloc(a, 0, PAGE, NULL), x);
    CHECK_EQ(size_of(a, x), 2 * PAGE);
    /* the new owner has written only its first bytes; (y, gy) is a descriptor
     * of the old, freed y, and must not pin anything now */
    memset(data_of(a, x), 0x11, 100);
    int rc = t_ref(a, 1, y, gy);
    CHECKF(rc == FP_STALE || rc == FP_CORRUPT,
           "ref of the absorbed block y returned %d (FP_OK: a count was "
           "added inside x's data at +%llu)",
           rc, (unsigned long long)(y - x + sizeof(fp_block_t) + 4));
    arena_free(a, size);
}

/* The split (fp_arena.h:176) gives the new tail the generation of the block it
 * came from plus one, whatever generations that offset had before, so the
 * generations at one offset are not monotonic: after a merge and a new split
 * at the same place they count up again through values an earlier block there
 * already used, and a stale descriptor (off, gen) matches a different
 * allocation.  (An arena-wide generation counter would not repeat.) */
TEST(arena_generation_never_repeats_at_an_offset_after_merge_and_split)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t h = hdr(a);
    uint64_t big = must_alloc(a, 0, 64 * PAGE, NULL); /* 65 pages */
    must_alloc(a, 0, 1, NULL);                        /* keeps the top away */
    fp_arena_unref(a, 0, big);
    CHECK_EQ(must_alloc(a, 0, 1, NULL), big); /* split: 1 page + a 64-page tail */
    uint64_t t = big + PAGE;
    CHECK_EQ(size_of(a, t), 64 * PAGE);
    /* the tail is used ten times; keep a descriptor of the last use */
    for (int i = 0; i < 10; i++) {
        CHECK_EQ(must_alloc(a, 0, 64 * PAGE - h, NULL), t);
        if (i < 9)
            fp_arena_unref(a, 0, t);
    }
    uint64_t stale_gen = gen_of(a, t);
    fp_arena_unref(a, 0, t); /* that allocation is over */
    fp_arena_unref(a, 0, big);
    /* merge back into one 65-page block at big, free it, split again at t */
    CHECK_EQ(must_alloc(a, 0, 64 * PAGE, NULL), big);
    CHECK_EQ(size_of(a, big), 65 * PAGE);
    fp_arena_unref(a, 0, big);
    CHECK_EQ(must_alloc(a, 0, 1, NULL), big);
    CHECK_EQ(size_of(a, t), 64 * PAGE);
    uint64_t regen = gen_of(a, t);
    printf("[gen at the tail: %llu before, %llu after the new split] ",
           (unsigned long long)stale_gen, (unsigned long long)regen);
    /* new allocations at t, until one carries the old generation again */
    int matched = 0;
    for (int i = 0; i < 20 && !matched; i++) {
        CHECK_EQ(must_alloc(a, 0, 64 * PAGE - h, NULL), t);
        if (t_ref(a, 1, t, stale_gen) == FP_OK)
            matched = 1 + i;
        else
            fp_arena_unref(a, 0, t);
    }
    CHECKF(!matched && regen > stale_gen,
           "generation at +%llu went back from %llu to %llu; the stale descriptor (t, %llu) "
           "was accepted by a different allocation (the %d-th after the split)",
           (unsigned long long)(t - big), (unsigned long long)stale_gen, (unsigned long long)regen,
           (unsigned long long)stale_gen, matched);
    arena_free(a, size);
}

/* need = align(hdr + nbytes, PAGE) (fp_arena.h:147) wraps around for nbytes
 * near UINT64_MAX: the `need > a->region_size` check then passes and a request
 * of 2^64-1 bytes returns FP_OK with a one-page block.  (nbytes = 2^64 - hdr
 * gives need == 0: a size-0 block past the top, returned as FP_OK, and
 * handed out again by the next call.) */
TEST(arena_huge_request_is_refused_not_wrapped)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t off = 0, fo = 0, fl = 0;
    int rc = t_alloc(a, 0, UINT64_MAX, &off, &fo, &fl);
    CHECKF(rc == FP_NOSPACE, "alloc(UINT64_MAX) returned %d with a block of %llu bytes", rc,
           rc == FP_OK ? (unsigned long long)size_of(a, off) : 0ull);
    rc = t_alloc(a, 0, UINT64_MAX - hdr(a) + 1, &off, &fo, &fl);
    CHECKF(rc == FP_NOSPACE, "alloc(2^64 - hdr) returned %d with a block of %llu bytes", rc,
           rc == FP_OK ? (unsigned long long)size_of(a, off) : 0ull);
    arena_free(a, size);
}

/* fp_arena_alloc tests that every count of a free block is zero
 * (fp_arena.h:159) and only afterwards bumps its gen (fp_arena.h:180).  A ref
 * with the block's current gen that lands in between (fp_arena.h:234-235)
 * sees the old gen and succeeds, and the owner hands the same block out as a
 * new allocation: the block is reused while referenced.  The referrer here
 * holds a reference, saw gen g after taking it, and later, still holding it,
 * sees the gen change: that must never happen. */
#define RACE_NS (1500 * MS)

typedef struct {
    fp_a64 gen;       /* the gen of the owner's current allocation */
    fp_a32 stop;
    fp_a32 ready;
    fp_a64 refs_ok;   /* refs that succeeded */
    fp_a64 violations;
} rctl_t;

TEST(arena_ref_racing_reuse_never_gets_a_reused_block)
{
    uint64_t size = 0;
    /* one block per region: reuse every time */
    fp_arena_view_t *a = arena_new(8, PAGE, 8 * PAGE, &size);
    rctl_t *ctl =
        mmap(NULL, sizeof(rctl_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(ctl != MAP_FAILED);
    uint64_t x = must_alloc(a, 0, 1, NULL);
    fp_store64_release(&ctl->gen, gen_of(a, x));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        child_prologue();
        fp_store32_release(&ctl->ready, 1);
        while (!fp_load32_acquire(&ctl->stop)) {
            uint64_t g = fp_load64_acquire(&ctl->gen);
            if (t_ref(a, 1, x, g) != FP_OK)
                continue;
            fp_add64_relaxed(&ctl->refs_ok, 1);
            /* The parent writes a new stamp into the data each time alloc hands the
             * block out: under our reference it must never change. */
            fp_a64 *stamp =
                (fp_a64 *)((unsigned char *)fp_arena_block(a, x) + fp_arena_hdr_size(a->nprocs));
            uint64_t d0 = fp_load64_acquire(stamp);
            for (int k = 0; k < 64; k++)
                if (fp_load64_acquire(stamp) != d0) {
                    fp_add64_relaxed(&ctl->violations, 1);
                    break;
                }
            fp_arena_unref(a, 1, x);
        }
        _exit(0);
    }
    while (!fp_load32_acquire(&ctl->ready))
        sleep_ns(MS / 20);
    int64_t end = now_ns() + RACE_NS;
    uint64_t reuses = 0;
    while (now_ns() < end && fp_load64_relaxed(&ctl->violations) == 0) {
        for (int k = 0; k < 1000; k++) {
            fp_arena_unref(a, 0, x);
            uint64_t off = 0, fo = 0, fl = 0;
            int rc;
            while ((rc = t_alloc(a, 0, 1, &off, &fo, &fl)) == FP_NOSPACE)
                fp_cpu_relax(); /* the child holds it: wait */
            CHECK_EQ(rc, FP_OK);
            CHECK_EQ(off, x);
            fp_add64_relaxed(
                (fp_a64 *)((unsigned char *)fp_arena_block(a, x) + fp_arena_hdr_size(a->nprocs)),
                1);
            fp_store64_release(&ctl->gen, gen_of(a, x));
            reuses++;
        }
    }
    fp_store32_release(&ctl->stop, 1);
    int status = reap(pid, 5000 * MS);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %#x", status);
    uint64_t v = fp_load64_relaxed(&ctl->violations);
    printf("[%llu reuses, %llu refs taken, %llu reused under a reference] ",
           (unsigned long long)reuses, (unsigned long long)fp_load64_relaxed(&ctl->refs_ok),
           (unsigned long long)v);
    CHECKF(v == 0,
           "%llu times the block was handed out again while process 1 held a reference "
           "it took with the then-current gen",
           (unsigned long long)v);
    munmap(ctl, sizeof(rctl_t));
    arena_free(a, size);
}

/* ------------------------------------------------------------------ damage */

/* Every worker maps the arena read-write, so any header word may be garbage.
 * Each claim below writes one kind of garbage and checks that every call that
 * walks or trusts that word returns FP_CORRUPT at once, naming the region, the
 * offset and the reason, and that nothing outside the damaged region changes.
 * A hang would fail the test through test_native.py's timeout. */

#define DR 1u /* the damaged region */

typedef struct {
    fp_arena_view_t *a;
    uint64_t size;
    uint64_t base;  /* region DR's first byte */
    uint64_t b[3];  /* region DR: held by DR, free, held by DR and by process 2 */
    uint64_t g[3];
    uint64_t o[NPROCS]; /* one block in every other region, referenced by process 2 */
} dfix_t;

static dfix_t dfix(void)
{
    dfix_t f;
    f.a = arena_new(NPROCS, REGION, REGION * NPROCS, &f.size);
    f.base = fp_arena_region(f.a, DR);
    for (int i = 0; i < 3; i++) {
        f.b[i] = must_alloc(f.a, DR, 3000u + 5000u * (uint64_t)i, NULL);
        f.g[i] = gen_of(f.a, f.b[i]);
        memset(data_of(f.a, f.b[i]), 0x60 + i, 3000);
    }
    fp_arena_unref(f.a, DR, f.b[1]);
    CHECK_EQ(t_ref(f.a, 2, f.b[2], f.g[2]), FP_OK);
    for (uint32_t r = 0; r < NPROCS; r++) {
        if (r == DR)
            continue;
        f.o[r] = must_alloc(f.a, r, 7000, NULL);
        memset(data_of(f.a, f.o[r]), 0x70 + (int)r, 7000);
        CHECK_EQ(t_ref(f.a, 2, f.o[r], gen_of(f.a, f.o[r])), FP_OK);
    }
    return f;
}

/* The other regions are whole, their data untouched, and (reclaimed) process
 * 2's references in them dropped by a reclaim that also reported the damage. */
static void others_whole(dfix_t *f, int reclaimed)
{
    for (uint32_t r = 0; r < NPROCS; r++) {
        if (r == DR)
            continue;
        uint64_t n = 0;
        fp_arena_damage_t d;
        CHECK_EQ(fp_arena_check_region(f->a, r, &n, &d), FP_OK);
        for (int k = 0; k < 7000; k++)
            CHECK_EQ(data_of(f->a, f->o[r])[k], 0x70 + (int)r);
        /* o[2] is process 2's own */
        CHECK_EQ(t_count(f->a, 2, f->o[r]), reclaimed ? 0 : 1 + (r == 2));
        if (r != 2)
            CHECK_EQ(t_count(f->a, r, f->o[r]), 1);
    }
}

/* Every walk over region DR reports (why, at); nothing else is affected. */
static void expect_damage(dfix_t *f, int why, uint64_t at, uint64_t value)
{
    fp_arena_view_t *a = f->a;
    fp_arena_damage_t d;
    uint64_t n = 0, l = 0, i = 0, nl = 0, fl = 0, held = 0, top = top_of(a, DR);
#define CHECK_DMG()                                                                                \
    do {                                                                                           \
        CHECK_EQ(d.region, DR);                                                                    \
        CHECKF(d.why == why, "why %d (%s), expected %d", d.why, fp_arena_damage_text(d.why), why); \
        CHECK_EQ(d.at, at);                                                                        \
        CHECK_EQ(d.value, value);                                                                  \
        memset(&d, 0, sizeof(d));                                                                  \
    } while (0)
    CHECK_EQ(fp_arena_check_region(a, DR, &n, &d), FP_CORRUPT);
    CHECK_DMG();
    CHECK_EQ(fp_arena_usage(a, &l, &i, &nl, &d), FP_CORRUPT);
    CHECK_DMG();
    fp_arena_blk_t blk = {0, 0, 0};
    /* the region's owner, asking for more than b1 holds, so the walk reaches any damage */
    CHECK_EQ(fp_arena_alloc(a, DR, 3 * PAGE, &blk, &fl, NULL, &d), FP_CORRUPT);
    CHECK_DMG();
    CHECK_EQ(fl, 0);
    CHECK_EQ(top_of(a, DR), top); /* a refused alloc writes nothing */
    CHECK_EQ(fp_arena_reclaim(a, 2, &held, &d), FP_CORRUPT);
    CHECK_DMG();
    /* twice: same report, nothing left to drop */
    CHECK_EQ(fp_arena_reclaim(a, 2, &held, &d), FP_CORRUPT);
    CHECK_DMG();
    CHECK_EQ(held, at > f->b[2] - f->base ? 1 : 0); /* region DR only up to the damage */
    others_whole(f, 1);
    /* the other owners still allocate */
    for (uint32_t r = 0; r < NPROCS; r++)
        if (r != DR)
            fp_arena_unref(a, r, must_alloc(a, r, 100, NULL));
#undef CHECK_DMG
}

TEST(arena_damage_top_past_the_region_end_or_unaligned)
{
    static const uint64_t tops[] = {REGION + PAGE, UINT64_MAX, UINT64_MAX - PAGE + 1, PAGE + 1,
                                    3 * PAGE - 8};
    for (unsigned k = 0; k < sizeof(tops) / sizeof(tops[0]); k++) {
        dfix_t f = dfix();
        fp_store64_release(fp_arena_top(f.a, DR), tops[k]);
        expect_damage(&f, FP_ARENA_BAD_TOP, 0, tops[k]);
        arena_free(f.a, f.size);
    }
}

TEST(arena_damage_block_size_zero)
{
    dfix_t f = dfix();
    fp_store64_release(&fp_arena_block(f.a, f.b[1])->size, 0); /* a self-loop, were it trusted */
    expect_damage(&f, FP_ARENA_BAD_SIZE, f.b[1] - f.base, 0);
    arena_free(f.a, f.size);
}

TEST(arena_damage_block_size_under_a_header)
{
    dfix_t f = dfix();
    fp_store64_release(&fp_arena_block(f.a, f.b[0])->size, 1);
    expect_damage(&f, FP_ARENA_BAD_SIZE, 0, 1);
    arena_free(f.a, f.size);
    /* with 1024 processes a header takes more than a page: one page is too small */
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(FP_ARENA_MAX_PROCS, 16 * PAGE, 16 * PAGE, &size);
    uint64_t x = must_alloc(a, 5, 1, NULL);
    CHECK_EQ(size_of(a, x), 2 * PAGE);
    fp_store64_release(&fp_arena_block(a, x)->size, PAGE);
    /* consistent with the size: only the size is wrong */
    fp_store64_release(fp_arena_top(a, 5), PAGE);
    uint64_t n = 0;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_check_region(a, 5, &n, &d), FP_CORRUPT);
    CHECK_EQ(d.why, FP_ARENA_BAD_SIZE);
    fp_arena_blk_t b;
    CHECK_EQ(fp_arena_ref(a, 0, x, gen_of(a, x), &b, &d), FP_CORRUPT);
    CHECK_EQ(d.why, FP_ARENA_BAD_SIZE);
    arena_free(a, size);
}

TEST(arena_damage_block_size_not_a_page_multiple)
{
    dfix_t f = dfix();
    uint64_t s = size_of(f.a, f.b[1]) + 8;
    fp_store64_release(&fp_arena_block(f.a, f.b[1])->size, s);
    expect_damage(&f, FP_ARENA_BAD_ALIGN, f.b[1] - f.base, s);
    arena_free(f.a, f.size);
}

/* The size that made fp_arena_reclaim loop for ever: off + s wraps to off - PAGE. */
TEST(arena_damage_block_size_2_64_minus_a_page)
{
    dfix_t f = dfix();
    uint64_t s = UINT64_MAX - PAGE + 1;
    fp_store64_release(&fp_arena_block(f.a, f.b[1])->size, s);
    expect_damage(&f, FP_ARENA_BAD_PAST_TOP, f.b[1] - f.base, s);
    arena_free(f.a, f.size);
}

/* Sizes whose sum wraps around to an earlier block (a cycle through the
 * chain), to the arena's header, and a size that runs past the top. */
TEST(arena_damage_wrapping_sizes_and_cycles)
{
    dfix_t f = dfix();
    uint64_t back = (uint64_t)0 - (f.b[2] - f.b[0]); /* b2 + back == b0 */
    fp_store64_release(&fp_arena_block(f.a, f.b[2])->size, back);
    expect_damage(&f, FP_ARENA_BAD_PAST_TOP, f.b[2] - f.base, back);
    arena_free(f.a, f.size);

    f = dfix();
    uint64_t to_zero = (uint64_t)0 - f.b[0]; /* b0 + s == 0: the arena header */
    fp_store64_release(&fp_arena_block(f.a, f.b[0])->size, to_zero);
    expect_damage(&f, FP_ARENA_BAD_PAST_TOP, 0, to_zero);
    arena_free(f.a, f.size);

    f = dfix();
    /* one page past the top, inside the region */
    uint64_t past = top_of(f.a, DR) - (f.b[2] - f.base) + PAGE;
    fp_store64_release(&fp_arena_block(f.a, f.b[2])->size, past);
    expect_damage(&f, FP_ARENA_BAD_PAST_TOP, f.b[2] - f.base, past);
    arena_free(f.a, f.size);
}

/* Counts are not structure: garbage there leaks blocks (never reused while
 * nonzero) and cannot make a walk fail or run long. */
TEST(arena_garbage_counts_leak_blocks_but_break_nothing)
{
    dfix_t f = dfix();
    fp_arena_view_t *a = f.a;
    for (int i = 0; i < 3; i++)
        for (uint32_t p = 0; p < NPROCS; p++)
            fp_store32_release(&fp_block_counts(fp_arena_block(a, f.b[i]))[p], 0xFFFFFFFFu - p);
    uint64_t n = 0, l = 0, idle = 0, nl = 0, held = 0;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_check_region(a, DR, &n, &d), FP_OK);
    CHECK_EQ(n, 3);
    t_usage(a, &l, &idle, &nl);
    CHECK_EQ(nl, 3 + NPROCS - 1); /* all three look held */
    uint64_t top = top_of(a, DR);
    uint64_t x = must_alloc(a, DR, 1, NULL); /* the "free" b1 is not reused: a bump */
    CHECK_EQ(x, f.base + top);
    CHECK_EQ(fp_arena_reclaim(a, 2, &held, &d), FP_OK);
    CHECK_EQ(held, 3 + NPROCS - 1);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(t_count(a, 2, f.b[i]), 0);
    CHECK_EQ(fp_arena_unref(a, 3, f.b[0]), FP_OK); /* decrements, never wraps below zero */
    CHECK_EQ(t_count(a, 3, f.b[0]), 0xFFFFFFFFu - 3 - 1);
    arena_free(a, size_of(a, 0) ? f.size : f.size);
}

/* A header whose magic was overwritten: the chain still walks (sizes are
 * intact), but no one references, reuses or reclaims through that header. */
TEST(arena_damage_magic_is_refused_by_ref_and_never_reused)
{
    dfix_t f = dfix();
    fp_arena_view_t *a = f.a;
    fp_arena_block(a, f.b[1])->magic = 0x1234;
    fp_arena_block(a, f.b[2])->magic = 0;
    uint64_t n = 0;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_check_region(a, DR, &n, &d), FP_OK);
    fp_arena_blk_t b;
    CHECK_EQ(fp_arena_ref(a, 3, f.b[1], f.g[1], &b, &d), FP_CORRUPT);
    CHECK_EQ(d.why, FP_ARENA_BAD_MAGIC);
    CHECK_EQ(d.at, f.b[1] - f.base);
    CHECK_EQ(t_count(a, 3, f.b[1]), 0);
    uint64_t top = top_of(a, DR);
    CHECK_EQ(must_alloc(a, DR, 1, NULL), f.base + top); /* free b1 is not reused */
    uint64_t held = 0;
    CHECK_EQ(fp_arena_reclaim(a, 2, &held, &d), FP_OK);
    CHECK_EQ(t_count(a, 2, f.b[2]), 1); /* not through a header without magic */
    arena_free(a, f.size);
}

/* A worker enlarges a block's size after the parent took a reference: a new
 * reference refuses the header; the one taken before keeps its own size. */
TEST(arena_ref_takes_the_size_once_and_refuses_an_enlarged_block)
{
    dfix_t f = dfix();
    fp_arena_view_t *a = f.a;
    fp_arena_blk_t before, b;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_ref(a, 0, f.b[0], f.g[0], &before, &d), FP_OK);
    uint64_t s0 = before.size;
    CHECK_EQ(s0, size_of(a, f.b[0]));
    uint64_t bad[] = {REGION, REGION + PAGE, top_of(a, DR) + PAGE, UINT64_MAX - PAGE + 1,
                      s0 + 1, 0};
    int why[] = {FP_ARENA_BAD_PAST_TOP, FP_ARENA_BAD_PAST_TOP, FP_ARENA_BAD_PAST_TOP,
                 FP_ARENA_BAD_PAST_TOP, FP_ARENA_BAD_ALIGN, FP_ARENA_BAD_SIZE};
    for (unsigned k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        fp_store64_release(&fp_arena_block(a, f.b[0])->size, bad[k]);
        CHECK_EQ(fp_arena_ref(a, 0, f.b[0], f.g[0], &b, &d), FP_CORRUPT);
        CHECKF(d.why == why[k] && d.value == bad[k], "size %llu: why %d",
               (unsigned long long)bad[k], d.why);
        CHECK_EQ(t_count(a, 0, f.b[0]), 1); /* `before`'s: a refused ref adds none */
    }
    CHECK_EQ(before.size, s0); /* a private copy: no later header write reaches it */
    /* a top lowered under the block: the block now runs past it */
    fp_store64_release(&fp_arena_block(a, f.b[0])->size, s0);
    fp_store64_release(fp_arena_top(a, DR), s0 - PAGE);
    CHECK_EQ(fp_arena_ref(a, 0, f.b[0], f.g[0], &b, &d), FP_CORRUPT);
    CHECK_EQ(d.why, FP_ARENA_BAD_PAST_TOP);
    arena_free(a, f.size);
}

/* Offsets from a descriptor or a caller that are not block headers: refused
 * before any access (an access at these would fault or land elsewhere). */
TEST(arena_offsets_outside_the_regions_are_refused_before_any_access)
{
    uint64_t size = 0;
    /* 2-page minimum block */
    fp_arena_view_t *a = arena_new(FP_ARENA_MAX_PROCS, 16 * PAGE, 16 * PAGE, &size);
    uint64_t x = must_alloc(a, 3, 1, NULL), g = gen_of(a, x);
    uint64_t bad[] = {0,
                      a->regions_offset - PAGE,
                      a->total_size,
                      a->total_size + PAGE,
                      UINT64_MAX - PAGE + 1,
                      (uint64_t)1 << 63,
                      x + 64, /* not page-aligned */
                      /* the last page: no room for a header */
                      fp_arena_region(a, 3) + 16 * PAGE - PAGE};
    for (unsigned k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        fp_arena_blk_t b;
        fp_arena_damage_t d;
        uint32_t n = 0;
        int fr = 0;
        CHECKF(fp_arena_ref(a, 0, bad[k], g, &b, &d) == FP_CORRUPT && d.why == FP_ARENA_BAD_OFFSET,
               "offset %llu", (unsigned long long)bad[k]);
        CHECK_EQ(fp_arena_unref(a, 0, bad[k]), FP_CORRUPT);
        CHECK_EQ(fp_arena_count(a, 0, bad[k], &n), FP_CORRUPT);
        CHECK_EQ(fp_arena_is_free(a, bad[k], &fr), FP_CORRUPT);
    }
    fp_arena_blk_t b;
    fp_arena_damage_t d;
    uint32_t n = 0;
    CHECK_EQ(fp_arena_ref(a, FP_ARENA_MAX_PROCS, x, g, &b, &d), FP_CORRUPT); /* no such process */
    CHECK_EQ(fp_arena_ref(a, UINT32_MAX, x, g, &b, &d), FP_CORRUPT);
    CHECK_EQ(fp_arena_unref(a, FP_ARENA_MAX_PROCS, x), FP_CORRUPT);
    CHECK_EQ(fp_arena_count(a, UINT32_MAX, x, &n), FP_CORRUPT);
    uint64_t held = 0, fl = 0;
    CHECK_EQ(fp_arena_reclaim(a, FP_ARENA_MAX_PROCS, &held, &d), FP_CORRUPT);
    CHECK_EQ(fp_arena_alloc(a, FP_ARENA_MAX_PROCS, 1, &b, &fl, NULL, &d), FP_CORRUPT);
    CHECK_EQ(fp_arena_check_region(a, FP_ARENA_MAX_PROCS, &held, &d), FP_CORRUPT);
    CHECK_EQ(t_ref(a, 0, x, g), FP_OK);
    arena_free(a, size);
}

/* The owner's private record of its top: a top lowered to a block boundary
 * keeps the chain consistent, so only that record tells the next bump would
 * land on live blocks. */
TEST(arena_owner_notices_a_top_lowered_to_a_block_boundary)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t own = FP_ARENA_TOP_UNKNOWN, fl = 0;
    fp_arena_blk_t b[3];
    fp_arena_damage_t d;
    for (int i = 0; i < 3; i++)
        CHECK_EQ(fp_arena_alloc(a, 0, 5000, &b[i], &fl, &own, &d), FP_OK);
    CHECK_EQ(own, top_of(a, 0));
    /* b1, b2 fall off the chain */
    fp_store64_release(fp_arena_top(a, 0), b[1].off - fp_arena_region(a, 0));
    fp_arena_blk_t c;
    CHECK_EQ(fp_arena_alloc(a, 0, 5000, &c, &fl, &own, &d), FP_CORRUPT);
    CHECK_EQ(d.why, FP_ARENA_BAD_TOP);
    CHECK_EQ(d.value, b[1].off - fp_arena_region(a, 0));
    /* without the record: over b1 */
    CHECK_EQ(fp_arena_alloc(a, 0, 5000, &c, &fl, NULL, &d), FP_OK);
    CHECK_EQ(c.off, b[1].off);
    arena_free(a, size);
}

/* A cap (NumPy's allocations in a worker) limits what a bump may commit, never
 * the reuse of a block the region already has. */
TEST(arena_alloc_capped_stops_bumps_at_the_cap_but_reuses_free_blocks)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(NPROCS, REGION, REGION * NPROCS, &size);
    uint64_t fl = 0, cap = 4 * PAGE;
    fp_arena_blk_t b, c;
    fp_arena_damage_t d;
    /* 3 pages committed */
    CHECK_EQ(fp_arena_alloc_capped(a, 1, 2 * PAGE, cap, &b, &fl, NULL, &d), FP_OK);
    CHECK(fl != 0);
    CHECK_EQ(fp_arena_alloc_capped(a, 1, 2 * PAGE, cap, &c, &fl, NULL, &d), FP_NOSPACE);
    /* the budget itself has room */
    CHECK_EQ(fp_arena_alloc(a, 1, 2 * PAGE, &c, &fl, NULL, &d), FP_OK);
    CHECK_EQ(fp_arena_unref(a, 1, b.off), FP_OK);
    CHECK_EQ(fp_arena_alloc_capped(a, 1, 2 * PAGE, cap, &c, &fl, NULL, &d), FP_OK);
    CHECK_EQ(c.off, b.off);
    CHECK_EQ(fl, 0);
    /* over the budget: the budget */
    CHECK_EQ(fp_arena_alloc_capped(a, 1, 2 * PAGE, UINT64_MAX, &c, &fl, NULL, &d), FP_OK);
    arena_free(a, size);
}

/* ------------------------------------------------------------------- reset */

TEST(arena_reset_of_an_intact_region_changes_nothing)
{
    dfix_t f = dfix();
    uint64_t top = top_of(f.a, DR), q = 1;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_reset_region(f.a, DR, UINT64_MAX, &q, &d), FP_OK);
    CHECK_EQ(q, 0);
    CHECK_EQ(d.why, FP_ARENA_BAD_NONE);
    CHECK_EQ(top_of(f.a, DR), top);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(gen_of(f.a, f.b[i]), f.g[i]);
    CHECK_EQ(must_alloc(f.a, DR, 1, NULL), f.b[1]); /* the free block is reused as before */
    arena_free(f.a, f.size);
}

/* The dead owner's region: b0 is held by the parent, b1 (free) has a garbage
 * size, b2 is held by process 2.  Reset keeps b0, quarantines b1..top (b2's
 * bytes and header included, untouched), and the next owner allocates only
 * past the quarantine. */
TEST(arena_reset_quarantines_from_the_damage_and_keeps_what_others_hold)
{
    dfix_t f = dfix();
    fp_arena_view_t *a = f.a;
    CHECK_EQ(t_ref(a, 0, f.b[0], f.g[0]), FP_OK);
    CHECK_EQ(t_reclaim(a, DR), 2); /* the owner died: its references on b0 and b2 go */
    unsigned char b2_header[64];
    memcpy(b2_header, fp_arena_block(a, f.b[2]), sizeof(b2_header));
    uint64_t top = top_of(a, DR), s0 = size_of(a, f.b[0]);
    fp_store64_release(&fp_arena_block(a, f.b[1])->size, UINT64_MAX - PAGE + 1);
    uint64_t q = 0;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_reset_region(a, DR, UINT64_MAX, &q, &d), FP_OK);
    CHECK_EQ(d.why, FP_ARENA_BAD_PAST_TOP);
    CHECK_EQ(d.at, f.b[1] - f.base);
    CHECK_EQ(q, top - (f.b[1] - f.base));
    uint64_t n = 0;
    CHECK_EQ(fp_arena_check_region(a, DR, &n, &d), FP_OK);
    CHECK_EQ(n, 2); /* b0 and the quarantine */
    CHECK_EQ(size_of(a, f.b[0]), s0);
    CHECK_EQ(gen_of(a, f.b[0]), f.g[0]);
    CHECK_EQ(t_count(a, 0, f.b[0]), 1);
    CHECK(gen_of(a, f.b[1]) != f.g[1]);
    CHECK_EQ(t_count(a, 0, f.b[1]), FP_ARENA_PIN);
    CHECK(memcmp(b2_header, fp_arena_block(a, f.b[2]), sizeof(b2_header)) == 0);
    CHECK_EQ(t_count(a, 2, f.b[2]), 1);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 3000; k++)
            CHECK_EQ(data_of(a, f.b[i])[k], 0x60 + i);
    /* the next owner: b0 is still held, the quarantine never free */
    uint64_t off = 0, fo = 0, fl = 0;
    int rc;
    while ((rc = t_alloc(a, DR, 3 * PAGE, &off, &fo, &fl)) == FP_OK)
        CHECKF(off >= f.base + top, "allocated at +%llu, inside the quarantine",
               (unsigned long long)(off - f.base));
    CHECK_EQ(rc, FP_NOSPACE);
    fp_arena_unref(a, 0, f.b[0]);
    CHECK_EQ(must_alloc(a, DR, 1, NULL), f.b[0]);
    others_whole(&f, 0);
    arena_free(a, f.size);
}

TEST(arena_reset_with_a_garbage_top_keeps_the_chain_that_holds_together)
{
    dfix_t f = dfix();
    fp_arena_view_t *a = f.a;
    t_reclaim(a, DR);
    uint64_t top = top_of(a, DR);
    fp_store64_release(fp_arena_top(a, DR), UINT64_MAX);
    uint64_t q = 0, n = 0;
    fp_arena_damage_t d;
    CHECK_EQ(fp_arena_reset_region(a, DR, UINT64_MAX, &q, &d), FP_OK);
    CHECK_EQ(d.why, FP_ARENA_BAD_TOP);
    CHECK_EQ(q, REGION - top); /* past the last good block nothing can be vouched for */
    CHECK_EQ(top_of(a, DR), REGION);
    CHECK_EQ(fp_arena_check_region(a, DR, &n, &d), FP_OK);
    CHECK_EQ(n, 4);
    CHECK_EQ(must_alloc(a, DR, 1, NULL), f.b[0]); /* free blocks before the damage serve again */
    arena_free(a, f.size);
}

TEST(arena_reset_leaves_no_block_smaller_than_a_header)
{
    uint64_t size = 0;
    /* 2-page minimum */
    fp_arena_view_t *a = arena_new(FP_ARENA_MAX_PROCS, 16 * PAGE, 16 * PAGE, &size);
    uint64_t base = fp_arena_region(a, 7), got[7];
    for (int i = 0; i < 6; i++)
        got[i] = must_alloc(a, 7, 1, NULL); /* 2 pages each */
    got[6] = must_alloc(a, 7, PAGE, NULL);  /* 3 pages: the chain ends at 15 */
    CHECK_EQ(got[6], base + 12 * PAGE);
    CHECK_EQ(top_of(a, 7), 15 * PAGE);
    for (int i = 0; i < 7; i++)
        fp_arena_unref(a, 7, got[i]);
    uint64_t q = 0, n = 0;
    fp_arena_damage_t d;
    fp_store64_release(&fp_arena_block(a, got[6])->size, 3);
    CHECK_EQ(fp_arena_reset_region(a, 7, UINT64_MAX, &q, &d), FP_OK);
    CHECK_EQ(q, 3 * PAGE);
    CHECK_EQ(fp_arena_check_region(a, 7, &n, &d), FP_OK);
    /* a span of one page after the cut grows to a whole block, where the region has room */
    fp_store64_release(&fp_arena_block(a, got[6])->size, 3);
    fp_store64_release(fp_arena_top(a, 7), 13 * PAGE);
    CHECK_EQ(fp_arena_reset_region(a, 7, UINT64_MAX, &q, &d), FP_OK);
    CHECK_EQ(q, 2 * PAGE);
    CHECK_EQ(top_of(a, 7), 14 * PAGE);
    CHECK_EQ(fp_arena_check_region(a, 7, &n, &d), FP_OK);
    /* a cut one page before the region's end: no block fits there, the top moves to it */
    fp_store64_release(&fp_arena_block(a, got[6])->size, 3 * PAGE);
    /* past the chain's end at 15: size 0 there */
    fp_store64_release(fp_arena_top(a, 7), 16 * PAGE);
    CHECK_EQ(fp_arena_reset_region(a, 7, UINT64_MAX, &q, &d), FP_OK);
    CHECK_EQ(d.why, FP_ARENA_BAD_SIZE);
    CHECK_EQ(d.at, 15 * PAGE);
    CHECK_EQ(q, 0);
    CHECK_EQ(top_of(a, 7), 15 * PAGE);
    CHECK_EQ(fp_arena_check_region(a, 7, &n, &d), FP_OK);
    CHECK_EQ(n, 7);
    arena_free(a, size);
}

/* --------------------------------------------------------------- scribbles */

/* Random chains, then random header words overwritten with adversarial values
 * (zero, one, huge, page multiples, wrapping ones), as a task running any C
 * could.  Every call terminates with a status; damage in worker regions never
 * reaches region 0's data; after reclaim and reset of every damaged region
 * every chain walks clean.  Zero is never written into a count: a count zeroed
 * under a held block is indistinguishable from a free block (see _arena.pyx). */
static uint64_t adversarial(uint64_t x, uint64_t here)
{
    switch (x % 12) {
    case 0: return 0;
    case 1: return 1;
    case 2: return UINT64_MAX;
    case 3: return UINT64_MAX - PAGE + 1;
    case 4: return (uint64_t)0 - here;              /* wraps to offset 0 */
    case 5: return (uint64_t)0 - (here - PAGE);     /* wraps to the page before */
    case 6: return PAGE * ((x >> 8) % 64);          /* plausible page multiples */
    case 7: return REGION;
    case 8: return REGION + PAGE;
    case 9: return (x >> 4) | 1;
    case 10: return (uint64_t)1 << 63;
    default: return x >> 3;
    }
}

TEST(arena_random_scribbles_never_hang_crash_or_spread)
{
    uint64_t seed = (uint64_t)now_ns() ^ (uint64_t)getpid();
    printf("[seed %llu] ", (unsigned long long)seed);
    uint64_t x = seed, damaged = 0, quarantined = 0;
    for (int round = 0; round < 400; round++) {
        uint64_t size = 0;
        fp_arena_view_t *a = arena_new(NPROCS, 64 * PAGE, 4 * 64 * PAGE, &size);
        enum { NB = 12 };
        uint64_t blk[NPROCS][NB], gen[NPROCS][NB], nb[NPROCS];
        for (uint32_t r = 0; r < NPROCS; r++) {
            nb[r] = 0;
            for (int i = 0; i < NB; i++) {
                x = splitmix64(x);
                uint64_t off = 0, fo = 0, fl = 0;
                if (t_alloc(a, r, x % (5 * PAGE), &off, &fo, &fl) != FP_OK)
                    break;
                memset(data_of(a, off), 0x30 + (int)r, size_of(a, off) - hdr(a));
                /* region 0's blocks stay held: their data is checked */
                if (x & (1ull << 40) && r != 0)
                    fp_arena_unref(a, r, off);
                else if (x & (1ull << 41))
                    CHECK_EQ(t_ref(a, (uint32_t)((r + 1) % NPROCS), off, gen_of(a, off)), FP_OK);
                blk[r][nb[r]] = off;
                gen[r][nb[r]++] = gen_of(a, off);
            }
        }
        /* scribble: worker regions always, region 0 in one round of four */
        int nscribble = 1 + (int)(splitmix64(x) % 4);
        int hit0 = round % 4 == 0;
        for (int k = 0; k < nscribble; k++) {
            x = splitmix64(x);
            uint32_t r = hit0 && k == 0 ? 0 : 1 + (uint32_t)(x % (NPROCS - 1));
            uint64_t here = nb[r] ? blk[r][(x >> 12) % nb[r]] : fp_arena_region(a, r);
            switch ((x >> 20) % 5) {
            case 0: fp_store64_release(fp_arena_top(a, r), adversarial(x >> 24, 0)); break;
            case 1:
                fp_store64_release(&fp_arena_block(a, here)->size, adversarial(x >> 24, here));
                break;
            case 2: fp_arena_block(a, here)->magic = adversarial(x >> 24, here); break;
            case 3:
                fp_store64_release(&fp_arena_block(a, here)->gen, adversarial(x >> 24, here));
                break;
            default:
                fp_store32_release(&fp_block_counts(fp_arena_block(a, here))[(x >> 24) % NPROCS],
                                   (uint32_t)adversarial(x >> 28, here) | 1u);
            }
        }
        /* every call, on every region and every descriptor */
        fp_arena_damage_t d;
        uint64_t n, l, i, nl, held, fl, q;
        fp_arena_blk_t b;
        fp_arena_usage(a, &l, &i, &nl, &d);
        for (uint32_t r = 0; r < NPROCS; r++) {
            fp_arena_check_region(a, r, &n, &d);
            if (fp_arena_alloc(a, r, 100, &b, &fl, NULL, &d) == FP_OK)
                fp_arena_unref(a, r, b.off);
            for (uint64_t j = 0; j < nb[r]; j++)
                if (fp_arena_ref(a, 0, blk[r][j], gen[r][j], &b, &d) == FP_OK) {
                    CHECK(b.off == blk[r][j] && b.size >= a->min_block && b.size % PAGE == 0);
                    CHECK(b.off - fp_arena_region(a, r) + b.size <= a->region_size);
                    fp_arena_unref(a, 0, b.off);
                }
        }
        /* the dead workers' regions are reclaimed and reset; then all walk clean */
        for (uint32_t r = 1; r < NPROCS; r++) {
            fp_arena_reclaim(a, r, &held, &d);
            if (fp_arena_check_region(a, r, &n, &d) != FP_OK) {
                damaged++;
                CHECK_EQ(fp_arena_reset_region(a, r, UINT64_MAX, &q, &d), FP_OK);
                quarantined += q;
            }
        }
        if (fp_arena_check_region(a, 0, &n, &d) != FP_OK) {
            CHECK(hit0);
            CHECK_EQ(fp_arena_reset_region(a, 0, UINT64_MAX, &q, &d), FP_OK);
        }
        for (uint32_t r = 0; r < NPROCS; r++)
            CHECKF(fp_arena_check_region(a, r, &n, &d) == FP_OK, "round %d region %u: %s", round, r,
                   fp_arena_damage_text(d.why));
        if (!hit0)
            for (uint64_t j = 0; j < nb[0]; j++) {
                unsigned char *p = data_of(a, blk[0][j]);
                uint64_t len = size_of(a, blk[0][j]) - hdr(a);
                for (uint64_t k = 0; k < len; k++)
                    CHECKF(p[k] == 0x30, "round %d: region 0 block %llu byte %llu changed", round,
                           (unsigned long long)j, (unsigned long long)k);
            }
        arena_free(a, size);
    }
    printf("[%llu damaged regions reset, %llu bytes quarantined] ", (unsigned long long)damaged,
           (unsigned long long)quarantined);
    CHECK(damaged > 0);
}

/* A garbage top over a whole chain: the parent's own account of the furthest
 * block anyone else may hold bounds the quarantine, instead of the region's end. */
TEST(reset_with_a_garbage_top_quarantines_only_what_others_may_hold)
{
    uint64_t size = 0;
    fp_arena_view_t *a = arena_new(3, 1 << 20, 1 << 22, &size);
    uint64_t off = must_alloc(a, 1, 3 * PAGE, NULL);
    uint64_t chain_end = off + size_of(a, off) - fp_arena_region(a, 1);
    fp_store64_release(fp_arena_top(a, 1), UINT64_MAX - 4095); /* page-aligned, past the end */
    uint64_t q = 1;
    fp_arena_damage_t d;
    /* nobody else holds anything past the chain: no quarantine, the top is the chain's end */
    CHECK_EQ(fp_arena_reset_region(a, 1, 0, &q, &d), FP_OK);
    CHECK_EQ(q, 0);
    CHECK_EQ(top_of(a, 1), chain_end);
    /* the same damage, with a block handed out up to chain_end + 8 pages: only that span */
    fp_store64_release(fp_arena_top(a, 1), UINT64_MAX - 4095);
    CHECK_EQ(fp_arena_reset_region(a, 1, chain_end + 8 * PAGE, &q, &d), FP_OK);
    CHECK_EQ(q, 8 * PAGE);
    CHECK_EQ(top_of(a, 1), chain_end + 8 * PAGE);
    arena_free(a, size);
}

int main(int argc, char **argv) { return check_main(argc, argv); }
