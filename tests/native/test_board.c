/* Claims about fp_board: size/init/check, the layout, the private views
 * (fp_boardv_t) and what a worker scribbling the shared header cannot do to
 * them, the slot words (the skip protocol among them), and the waits: the
 * parent's wait for results, a worker's wait for data/space. */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "check.h"
#include "fp_board.h"

#define MS 1000000LL
/* PROT_NONE after every board: a read past the end faults, sanitizer or not */
#define GUARD (16ull << 20)

/* A zero-filled shared mapping, as the memfd gives the pool, followed by an
 * inaccessible guard region. */
static fp_board_t *board_map(uint32_t nslots, uint64_t cap, uint64_t *size)
{
    *size = fp_board_size(nslots, cap);
    CHECK(*size != 0);
    void *p = mmap(NULL, *size + GUARD, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(p != MAP_FAILED);
    CHECK(mprotect((unsigned char *)p + *size, GUARD, PROT_NONE) == 0);
    return p;
}

static void board_unmap(fp_board_t *b, uint64_t size) { CHECK(munmap(b, size + GUARD) == 0); }

/* A board and the views of both sides (one process plays the parent and
 * every worker): parent.tasks/worker.results are producers, the other two
 * consumers.  Geometry is what the test created it with, never the header's. */
typedef struct {
    fp_board_t *b;
    uint64_t size;
    uint32_t nslots;
    uint64_t cap;
    fp_boardv_t parent, worker;
} tboard_t;

static void views_init(tboard_t *t)
{
    fp_ringv_t *pt = calloc(t->nslots, sizeof(fp_ringv_t)),
               *pr = calloc(t->nslots, sizeof(fp_ringv_t));
    fp_ringv_t *wt = calloc(t->nslots, sizeof(fp_ringv_t)),
               *wr = calloc(t->nslots, sizeof(fp_ringv_t));
    CHECK(pt && pr && wt && wr);
    CHECK_EQ(fp_boardv_init(&t->parent, t->b, t->size, t->nslots, t->cap, pt, pr, 1), FP_OK);
    CHECK_EQ(fp_boardv_init(&t->worker, t->b, t->size, t->nslots, t->cap, wt, wr, 0), FP_OK);
}

static tboard_t *board_new(uint32_t nslots, uint64_t cap)
{
    tboard_t *t = calloc(1, sizeof(*t));
    CHECK(t != NULL);
    t->b = board_map(nslots, cap, &t->size);
    t->nslots = nslots;
    t->cap = cap;
    CHECK_EQ(fp_board_init(t->b, nslots, cap), FP_OK);
    views_init(t);
    return t;
}

static void board_free(tboard_t *t)
{
    free(t->parent.tasks);
    free(t->parent.results);
    free(t->worker.tasks);
    free(t->worker.results);
    board_unmap(t->b, t->size);
    free(t);
}

/* Consumes one record from a consumer view, checking its id. */
static void pop_expect(fp_ringv_t *v, uint64_t id)
{
    fp_recv_t rec;
    CHECK_EQ(fp_ringv_peek(v, &rec), FP_OK);
    CHECK_EQ(rec.task_id, id);
    fp_ringv_release(v, rec.next);
}

/* ---- geometry: size, init, check ------------------------------------------ */

TEST(size_refuses_geometry_out_of_range)
{
    CHECK_EQ(fp_board_size(0, 8192), 0);
    CHECK_EQ(fp_board_size(FP_BOARD_MAX_SLOTS + 1, 8192), 0);
    CHECK_EQ(fp_board_size(UINT32_MAX, 8192), 0);
    static const uint64_t bad_caps[] = {0, 8, 4088, 4095, 4097, 4100, 8196,
                                        FP_RING_MAX_CAPACITY + 8, FP_RING_MAX_CAPACITY * 2,
                                        1ull << 63, UINT64_MAX & ~7ull, UINT64_MAX};
    for (size_t i = 0; i < sizeof(bad_caps) / sizeof(bad_caps[0]); i++) {
        CHECKF(fp_board_size(1, bad_caps[i]) == 0, "cap %llu", (unsigned long long)bad_caps[i]);
        CHECKF(fp_board_size(FP_BOARD_MAX_SLOTS, bad_caps[i]) == 0, "cap %llu",
               (unsigned long long)bad_caps[i]);
    }
    CHECK(fp_board_size(1, 4096) != 0);
    CHECK(fp_board_size(FP_BOARD_MAX_SLOTS, 4096) != 0);
}

/* The largest geometry accepted gives its exact size, with no wrap: over
 * 2 * slots * capacity and about 16 TiB, well inside 64 bits. */
TEST(size_of_the_largest_board_does_not_wrap)
{
    uint64_t cap = FP_RING_MAX_CAPACITY, n = FP_BOARD_MAX_SLOTS;
    uint64_t size = fp_board_size(FP_BOARD_MAX_SLOTS, cap);
    CHECK_EQ(size, fp_board_rings_offset(FP_BOARD_MAX_SLOTS) + 2 * n * fp_board_ring_stride(cap));
    CHECK_EQ(fp_board_ring_stride(cap), cap + FP_PAGE);
    CHECK(size > 2 * n * cap);
    CHECK(size < (1ull << 45));
    CHECK_EQ(size % FP_PAGE, 0);
    /* and it grows with each slot and each step of capacity: no wrap anywhere */
    CHECK(fp_board_size(FP_BOARD_MAX_SLOTS - 1, cap) < size);
    CHECK(fp_board_size(FP_BOARD_MAX_SLOTS, cap - 4096) < size);
}

TEST(init_refuses_bad_geometry)
{
    uint64_t size = 0;
    fp_board_t *b = board_map(2, 8192, &size);
    CHECK_EQ(fp_board_init(b, 0, 8192), FP_CORRUPT);
    CHECK_EQ(fp_board_init(b, 2, 4088), FP_CORRUPT); /* under 4096 */
    CHECK_EQ(fp_board_init(b, 2, 8196), FP_CORRUPT); /* not a multiple of 8 */
    CHECK_EQ(fp_board_init(b, FP_BOARD_MAX_SLOTS + 1, 8192), FP_CORRUPT);
    CHECK_EQ(fp_board_init(b, 2, FP_RING_MAX_CAPACITY + 8), FP_CORRUPT);
    CHECK_EQ(b->magic, 0); /* a refused init publishes nothing */
    uint32_t n = 77;
    uint64_t c = 88;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    CHECK_EQ(n, 77); /* a refused check leaves the outputs alone */
    CHECK_EQ(c, 88);
    board_unmap(b, size);
}

TEST(check_accepts_a_fresh_board)
{
    tboard_t *t = board_new(3, 8192);
    CHECK_EQ(t->b->magic, FP_BOARD_MAGIC);
    CHECK_EQ(t->b->version, FP_BOARD_VERSION);
    CHECK_EQ(t->b->total_size, t->size);
    uint32_t n = 0;
    uint64_t c = 0;
    CHECK_EQ(fp_board_check(t->b, t->size, &n, &c), FP_OK);
    CHECK_EQ(n, 3);
    CHECK_EQ(c, 8192);
    n = 0;
    c = 0;
    CHECK_EQ(fp_board_check(t->b, t->size + 4096, &n, &c), FP_OK); /* a larger mapping is fine */
    CHECK_EQ(n, 3);
    CHECK_EQ(c, 8192);
    board_free(t);
}

TEST(check_refuses_mismatches)
{
    tboard_t *t = board_new(3, 8192);
    fp_board_t *b = t->b;
    uint64_t size = t->size;
    uint32_t n = 0;
    uint64_t c = 0;
    /* mapping shorter than the board */
    CHECK_EQ(fp_board_check(b, size - 1, &n, &c), FP_CORRUPT);
    /* shorter than the header */
    CHECK_EQ(fp_board_check(b, sizeof(fp_board_t) - 1, &n, &c), FP_CORRUPT);
    CHECK_EQ(fp_board_check(b, 0, &n, &c), FP_CORRUPT);

    b->magic ^= 1;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    b->magic ^= 1;
    b->version += 1;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    b->version -= 1;
    b->total_size -= 4096;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    b->total_size += 4096;
    b->nslots += 1; /* the recorded size no longer matches the geometry */
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    b->nslots -= 1;
    b->ring_capacity *= 2;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    b->ring_capacity /= 2;
    CHECK_EQ(n, 0); /* nothing refused wrote the outputs */
    CHECK_EQ(c, 0);
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_OK);
    CHECK_EQ(n, 3);
    CHECK_EQ(c, 8192);
    board_free(t);
}

/* total_size must be exactly what the header's own geometry gives: neither
 * a page more or less, nor 0 (fp_board_size's "bad geometry" answer). */
TEST(check_refuses_a_total_size_that_does_not_match)
{
    tboard_t *t = board_new(2, 8192);
    fp_board_t *b = t->b;
    uint32_t n = 0;
    uint64_t c = 0;
    static const int64_t deltas[] = {-4096, -8, -1, 1, 8, 4096};
    for (size_t i = 0; i < sizeof(deltas) / sizeof(deltas[0]); i++) {
        b->total_size = t->size + (uint64_t)deltas[i];
        CHECKF(fp_board_check(b, t->size + 8192, &n, &c) == FP_CORRUPT, "delta %lld",
               (long long)deltas[i]);
    }
    b->total_size = 0;
    CHECK_EQ(fp_board_check(b, t->size, &n, &c), FP_CORRUPT);
    b->total_size = UINT64_MAX;
    CHECK_EQ(fp_board_check(b, UINT64_MAX, &n, &c), FP_CORRUPT);
    /* a header of zeros but for magic and version: size 0 == total 0 is no match */
    b->nslots = 0;
    b->ring_capacity = 0;
    b->total_size = 0;
    CHECK_EQ(fp_board_check(b, t->size, &n, &c), FP_CORRUPT);
    /* geometry out of range, with the total its unchecked formula would give */
    b->nslots = FP_BOARD_MAX_SLOTS + 1;
    b->ring_capacity = 8192;
    b->total_size =
        fp_board_rings_offset(FP_BOARD_MAX_SLOTS + 1) + 2ull * (FP_BOARD_MAX_SLOTS + 1) * 12288;
    CHECK_EQ(fp_board_check(b, UINT64_MAX, &n, &c), FP_CORRUPT);
    CHECK_EQ(n, 0);
    CHECK_EQ(c, 0);
    b->nslots = 2;
    b->total_size = t->size;
    CHECK_EQ(fp_board_check(b, t->size, &n, &c), FP_OK);
    board_free(t);
}

TEST(check_refuses_a_zero_filled_segment)
{
    uint64_t size = 0;
    fp_board_t *b = board_map(1, 4096, &size);
    uint32_t n = 0;
    uint64_t c = 0;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_CORRUPT);
    board_unmap(b, size);
}

/* A worker flips nslots and ring_capacity while another attaches: every
 * FP_OK hands out the pair that was checked, never a value read after the
 * check.  (Passes every time with a read-once check; a re-reading one fails
 * when the race lands.) */
typedef struct {
    fp_board_t *b;
    fp_a32 stop;
} flipper_t;

static void *flipper(void *arg)
{
    flipper_t *f = arg;
    volatile fp_board_t *h = (volatile fp_board_t *)f->b;
    for (uint64_t i = 0; !fp_load32_acquire(&f->stop); i++) {
        h->nslots = (i & 1) ? 1u << 20 : 3u;
        h->ring_capacity = (i & 2) ? UINT64_MAX & ~7ull : 8192u;
    }
    h->nslots = 3;
    h->ring_capacity = 8192;
    return NULL;
}

TEST(check_reads_the_geometry_once)
{
    tboard_t *t = board_new(3, 8192);
    flipper_t f = {t->b, 0};
    pthread_t th;
    CHECK(pthread_create(&th, NULL, flipper, &f) == 0);
    uint64_t ok = 0, refused = 0;
    int64_t until = fp_now_ns() + 200 * MS;
    while (fp_now_ns() < until || ok == 0 || refused == 0) {
        uint32_t n = 0;
        uint64_t c = 0;
        int rc = fp_board_check(t->b, t->size, &n, &c);
        if (rc == FP_OK) {
            CHECKF(n == 3 && c == 8192, "FP_OK with nslots %u cap %llu", n, (unsigned long long)c);
            ok++;
        } else {
            CHECK_EQ(rc, FP_CORRUPT);
            refused++;
        }
        CHECK(fp_now_ns() < until + 10000 * MS);
    }
    fp_store32_release(&f.stop, 1);
    CHECK(pthread_join(th, NULL) == 0);
    printf("[%llu accepted, %llu refused] ", (unsigned long long)ok, (unsigned long long)refused);
    board_free(t);
}

/* ---- layout and views ------------------------------------------------------ */

/* Every slot block and ring lies inside the board, rings start on a page,
 * and no two regions overlap. */
TEST(slots_and_rings_are_disjoint_and_page_aligned)
{
    static const uint32_t slot_counts[] = {1, 2, 15, 16, 17, 64, FP_BOARD_MAX_SLOTS};
    static const uint64_t caps[] = {4096, 4104, 65536};
    for (size_t n = 0; n < sizeof(slot_counts) / sizeof(slot_counts[0]); n++) {
        for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
            uint32_t nslots = slot_counts[n];
            uint64_t cap = caps[c];
            tboard_t *t = board_new(nslots, cap);
            unsigned char *base = (unsigned char *)t->b;
            uint64_t size = t->size;
            CHECK_EQ(size % FP_PAGE, 0);
            uint64_t rings_at = fp_board_rings_offset(nslots);
            CHECK_EQ(rings_at % FP_PAGE, 0);
            for (uint32_t i = 0; i < nslots; i++) {
                uint64_t s = (uint64_t)((unsigned char *)fp_boardv_slot(&t->parent, i) - base);
                CHECK_EQ(s, FP_PAGE + (uint64_t)i * sizeof(fp_slot_t));
                CHECK(s + sizeof(fp_slot_t) <= rings_at);
            }
            uint64_t prev_end = rings_at;
            for (uint32_t i = 0; i < nslots; i++) {
                for (int dir = 0; dir < 2; dir++) {
                    fp_ring_t *r = fp_board_ring_at(t->b, nslots, cap, i, dir);
                    uint64_t off = (uint64_t)((unsigned char *)r - base);
                    CHECKF(off % FP_PAGE == 0, "slot %u dir %d at %llu", i, dir,
                           (unsigned long long)off);
                    CHECKF(off >= prev_end, "slot %u dir %d overlaps the region before", i, dir);
                    prev_end = off + sizeof(fp_ring_t) + cap;
                    CHECK(prev_end <= size);
                    CHECK_EQ(r->capacity, cap);
                    CHECK_EQ(fp_load64_acquire(&r->head), 0);
                    CHECK_EQ(fp_load64_acquire(&r->tail), 0);
                    /* the views sit on the same rings, with the same geometry */
                    fp_ringv_t *pv = dir ? &t->parent.results[i] : &t->parent.tasks[i];
                    fp_ringv_t *wv = dir ? &t->worker.results[i] : &t->worker.tasks[i];
                    CHECK(pv->hdr == r && wv->hdr == r);
                    CHECK(pv->data == fp_ring_data(r) && wv->data == fp_ring_data(r));
                    CHECK_EQ(pv->cap, cap);
                    CHECK_EQ(wv->cap, cap);
                    CHECK_EQ(pv->max_record, cap / 2 - sizeof(fp_rec_t));
                    CHECK(fp_ringv_empty(dir ? pv : wv)); /* the consumer's side */
                }
            }
            /* the last byte of the last ring is mapped and writable */
            fp_ring_t *last = fp_board_ring_at(t->b, nslots, cap, nslots - 1, 1);
            fp_ring_data(last)[cap - 1] = 1;
            CHECK((unsigned char *)fp_ring_data(last) + cap <= base + size);
            board_free(t);
        }
    }
}

TEST(boardv_init_refuses_bad_geometry_or_a_short_mapping)
{
    tboard_t *t = board_new(2, 8192);
    fp_ringv_t tv[4], rv[4];
    fp_boardv_t v;
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size - 1, 2, 8192, tv, rv, 1), FP_CORRUPT);
    /* 3 slots need more */
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size, 3, 8192, tv, rv, 1), FP_CORRUPT);
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size, 0, 8192, tv, rv, 1), FP_CORRUPT);
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size, 2, 8196, tv, rv, 1), FP_CORRUPT);
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size, 2, 0, tv, rv, 0), FP_CORRUPT);
    /* fewer slots than mapped: fine */
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size, 1, 8192, tv, rv, 0), FP_OK);
    CHECK_EQ(fp_boardv_init(&v, t->b, t->size, 2, 8192, tv, rv, 0), FP_OK);
    CHECK_EQ(v.nslots, 2);
    CHECK_EQ(v.cap, 8192);
    CHECK_EQ(v.size, t->size);
    board_free(t);
}

/* Rings are usable where the board puts them, and independent: the parent
 * writes tasks, each worker results, through their own views. */
/* The parent looks only at the workers it waits for (running a task, or holding
 * one in their ring), and a forged CPU word only steers its spin: the wait that
 * follows still finds the result or times out. */
TEST(parent_spin_hint_reads_only_busy_workers_and_is_only_a_hint)
{
    tboard_t *t = board_new(2, 4096);
    fp_slot_t *s0 = fp_boardv_slot(&t->parent, 0), *s1 = fp_boardv_slot(&t->parent, 1);
    fp_store32_relaxed(&s1->cpu, 0xffffffffu); /* no CPU's tag, and slot 1 is idle */
    CHECK_EQ(fp_boardv_parent_peer(&t->parent), FP_PEER_UNKNOWN);
    CHECK(fp_load32_relaxed(&t->b->parent_cpu) != 0); /* published for the workers */
    CHECK_EQ(fp_ringv_push(&t->parent.tasks[1], 1, 7, 0, "x", 1), FP_OK);
    CHECK_EQ(fp_boardv_parent_peer(&t->parent), FP_PEER_OTHER); /* now it holds a task */
    CHECK_EQ(fp_slot_start(s0, 9), 0); /* a worker takes a task: publishes where */
    CHECK(fp_load32_relaxed(&s0->cpu) != 0);
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 20 * MS, 1 * MS), 0);
    CHECK(fp_now_ns() - t0 >= 20 * MS); /* the forged hint spun, then parked to time */
    CHECK_EQ(fp_ringv_push(&t->worker.results[0], 1, 9, 0, "y", 1), FP_OK);
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, 1 * MS), 1);
    fp_slot_reset(s0);
    CHECK_EQ(fp_load32_relaxed(&s0->cpu), 0); /* the next worker inherits no hint */
    board_free(t);
}

TEST(each_ring_carries_its_own_records)
{
    tboard_t *t = board_new(4, 4096);
    for (uint32_t i = 0; i < 4; i++)
        for (int dir = 0; dir < 2; dir++) {
            uint64_t tag = i * 2u + (uint64_t)dir;
            unsigned char payload[2024];
            memset(payload, (int)tag, sizeof(payload));
            fp_ringv_t *prod = dir ? &t->worker.results[i] : &t->parent.tasks[i];
            CHECK_EQ(fp_ringv_push(prod, 1, tag, 0, payload, sizeof(payload)), FP_OK);
        }
    for (uint32_t i = 0; i < 4; i++)
        for (int dir = 0; dir < 2; dir++) {
            uint64_t tag = i * 2u + (uint64_t)dir;
            fp_ringv_t *cons = dir ? &t->parent.results[i] : &t->worker.tasks[i];
            fp_recv_t rec;
            CHECK_EQ(fp_ringv_peek(cons, &rec), FP_OK);
            CHECK_EQ(rec.task_id, tag);
            CHECK_EQ(rec.len, 2024);
            for (uint32_t k = 0; k < rec.len; k++)
                CHECK_EQ(rec.payload[k], tag);
            fp_ringv_release(cons, rec.next);
            CHECK(fp_ringv_empty(cons));
        }
    uint32_t n = 0;
    uint64_t c = 0;
    /* the rings did not write over the header */
    CHECK_EQ(fp_board_check(t->b, t->size, &n, &c), FP_OK);
    board_free(t);
}

/* A worker attaching later takes each ring's shared positions as its start. */
TEST(a_late_worker_view_starts_where_the_rings_are)
{
    tboard_t *t = board_new(1, 4096);
    CHECK_EQ(fp_ringv_push(&t->parent.tasks[0], 1, 1, 0, NULL, 0), FP_OK);
    pop_expect(&t->worker.tasks[0], 1);
    CHECK_EQ(fp_ringv_push(&t->parent.tasks[0], 1, 2, 0, NULL, 0), FP_OK);
    CHECK_EQ(fp_ringv_push(&t->worker.results[0], 1, 3, 0, NULL, 0), FP_OK);
    fp_ringv_t tv, rv;
    fp_boardv_t late;
    uint32_t n = 0;
    uint64_t c = 0;
    CHECK_EQ(fp_board_check(t->b, t->size, &n, &c), FP_OK);
    CHECK_EQ(fp_boardv_init(&late, t->b, t->size, n, c, &tv, &rv, 0), FP_OK);
    pop_expect(&late.tasks[0], 2); /* not record 1 again */
    CHECK(fp_ringv_empty(&late.tasks[0]));
    /* after record 3, not over it */
    CHECK_EQ(fp_ringv_push(&late.results[0], 1, 4, 0, NULL, 0), FP_OK);
    pop_expect(&t->parent.results[0], 3);
    pop_expect(&t->parent.results[0], 4);
    board_free(t);
}

TEST(a_board_at_the_largest_capacity_is_usable)
{
    uint64_t cap = FP_RING_MAX_CAPACITY;
    uint64_t size = fp_board_size(1, cap);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    CHECK(p != MAP_FAILED);
    fp_board_t *b = p;
    CHECK_EQ(fp_board_init(b, 1, cap), FP_OK);
    uint32_t n = 0;
    uint64_t c = 0;
    CHECK_EQ(fp_board_check(b, size, &n, &c), FP_OK);
    CHECK_EQ(c, cap);
    fp_ringv_t pt, pr, wt, wr;
    fp_boardv_t parent, worker;
    CHECK_EQ(fp_boardv_init(&parent, b, size, n, c, &pt, &pr, 1), FP_OK);
    CHECK_EQ(fp_boardv_init(&worker, b, size, n, c, &wt, &wr, 0), FP_OK);
    CHECK_EQ(fp_ringv_push(&worker.results[0], 1, 5, 0, "abc", 3), FP_OK);
    CHECK_EQ(fp_boardv_parent_has_work(&parent), 1);
    pop_expect(&parent.results[0], 5);
    CHECK_EQ(fp_boardv_parent_has_work(&parent), 0);
    munmap(p, size);
}

TEST(parent_has_work_for_results_or_attention)
{
    tboard_t *t = board_new(3, 4096);
    fp_board_t *b = t->b;
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0);
    CHECK_EQ(fp_ringv_push(&t->parent.tasks[1], 1, 1, 0, NULL, 0), FP_OK);
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0); /* a task ring is the workers' business */
    CHECK_EQ(fp_ringv_push(&t->worker.results[2], 1, 2, 0, NULL, 0), FP_OK);
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 1);
    pop_expect(&t->parent.results[2], 2);
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0);
    fp_store32_release(&b->attention, 1);
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 1);
    fp_store32_release(&b->attention, 0);
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0);
    board_free(t);
}

TEST(a_kick_before_the_park_is_not_lost)
{
    tboard_t *t = board_new(2, 4096);
    fp_board_kick(t->b); /* nobody parked yet: the next park must still see it */
    /* 1: it returned for the kick; a lost kick parks the whole 5 s and returns 0 */
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, 0), 1);
    CHECK_EQ(fp_board_take_attention(t->b), 1);
    CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0);
    board_free(t);
}

/* ---- a worker scribbles the shared header: the parent's views hold --------- */

/* The header's geometry is read only by an attach check.  A worker that sets
 * nslots to 0 or 2^20, or ring_capacity to 0 (a '% capacity' would be SIGFPE)
 * or 2^63, changes nothing for the parent: has_work and wait_results walk the
 * parent's own ring views, so no slot is missed and none past the board read
 * (the guard region after the board faults on any such read, and ASan
 * reports it). */
TEST(parent_views_survive_a_scribbled_header)
{
    static const uint32_t bad_n[] = {0, 1u << 20, UINT32_MAX, 3};
    static const uint64_t bad_cap[] = {0, 1ull << 63, UINT64_MAX, 8};
    for (size_t k = 0; k < 4; k++) {
        tboard_t *t = board_new(3, 4096);
        fp_board_t *b = t->b;
        b->nslots = bad_n[k];
        b->ring_capacity = bad_cap[k];
        b->total_size = k & 1 ? 0 : UINT64_MAX;
        for (uint32_t i = 0; i < 3; i++) { /* and each ring's own copy */
            fp_board_ring_at(b, 3, 4096, i, 0)->capacity = bad_cap[k];
            fp_board_ring_at(b, 3, 4096, i, 1)->capacity = bad_cap[k];
        }

        CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0);
        int64_t t0 = fp_now_ns();
        CHECK_EQ(fp_boardv_wait_results(&t->parent, 20 * MS, 1 * MS), 0);
        CHECK(fp_now_ns() - t0 >= 20 * MS);

        /* a result in the last slot is still seen (nslots 0 would hide it) */
        CHECK_EQ(fp_ringv_push(&t->worker.results[2], 1, 9, 0, "r", 1), FP_OK);
        CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 1);
        CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, 0), 1);
        pop_expect(&t->parent.results[2], 9);
        CHECK_EQ(fp_boardv_parent_has_work(&t->parent), 0);

        /* tasks still go out and come back in every slot */
        for (uint32_t i = 0; i < 3; i++) {
            CHECK_EQ(fp_ringv_push(&t->parent.tasks[i], 1, 100 + i, 0, "t", 1), FP_OK);
            pop_expect(&t->worker.tasks[i], 100 + i);
            CHECK_EQ(fp_ringv_push(&t->worker.results[i], 1, 200 + i, 0, NULL, 0), FP_OK);
            CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, 0), 1);
            pop_expect(&t->parent.results[i], 200 + i);
        }
        /* a worker attaching now refuses the board; the parent is unharmed */
        uint32_t n = 0;
        uint64_t c = 0;
        CHECK_EQ(fp_board_check(b, t->size, &n, &c), FP_CORRUPT);
        board_free(t);
    }
}

/* The count of parent threads that drive lives in the parent's view: no word of
 * the segment, written to anything, changes what the collector decides (issue 15, 7). */
TEST(drivers_are_counted_in_the_parents_view_not_the_segment)
{
    tboard_t *t = board_new(2, 4096);
    CHECK_EQ(fp_boardv_wanted(&t->parent), 0);
    memset((unsigned char *)t->b + offsetof(fp_board_t, parent_cpu), 0xff, sizeof(fp_a32));
    memset(t->b->_pad1, 0xff, sizeof(t->b->_pad1));
    CHECK_EQ(fp_boardv_wanted(&t->parent), 0);
    fp_boardv_want(&t->parent, 1);
    fp_boardv_want(&t->parent, 1);
    memset((unsigned char *)t->b + offsetof(fp_board_t, parent_cpu), 0, sizeof(fp_a32));
    CHECK_EQ(fp_boardv_wanted(&t->parent), 1);
    fp_boardv_want(&t->parent, -1);
    CHECK_EQ(fp_boardv_wanted(&t->parent), 1);
    fp_boardv_want(&t->parent, -1);
    CHECK_EQ(fp_boardv_wanted(&t->parent), 0);
    board_free(t);
}

/* ---- slot words -------------------------------------------------------------- */

TEST(slot_info_state_beat_and_served)
{
    tboard_t *t = board_new(2, 4096);
    fp_slot_t *s = fp_boardv_slot(&t->parent, 1);
    uint32_t state = 9, pid = 9;
    uint64_t cur = 9, hb = 9, served = 9;
    fp_slot_info(s, &state, &pid, &cur, &hb, &served);
    CHECK(state == FP_SLOT_EMPTY && pid == 0 && cur == 0 && hb == 0 && served == 0);
    fp_slot_set_state(s, FP_SLOT_STARTING, 4321);
    fp_slot_set_state(s, FP_SLOT_READY, 0); /* pid 0: keeps the pid */
    fp_slot_beat(s);
    fp_slot_beat(s);
    CHECK_EQ(fp_slot_start(s, 7), 0);
    CHECK_EQ(fp_slot_current(s), 7);
    fp_slot_info(s, &state, &pid, &cur, &hb, &served);
    CHECK(state == FP_SLOT_READY && pid == 4321 && cur == 7 && hb == 2 && served == 0);
    fp_slot_finish(s, 1);
    CHECK_EQ(fp_slot_current(s), 0);
    CHECK_EQ(fp_slot_start(s, 8), 0);
    fp_slot_finish(s, 0); /* skipped: not served */
    fp_slot_info(s, &state, &pid, &cur, &hb, &served);
    CHECK(cur == 0 && served == 1);
    /* slot 0 untouched */
    fp_slot_info(fp_boardv_slot(&t->parent, 0), &state, &pid, &cur, &hb, &served);
    CHECK(state == FP_SLOT_EMPTY && pid == 0 && cur == 0 && hb == 0 && served == 0);
    board_free(t);
}

TEST(slot_reset_clears_the_task_words_and_bumps_generation)
{
    tboard_t *t = board_new(1, 4096);
    fp_slot_t *s = fp_boardv_slot(&t->parent, 0);
    uint32_t gen = fp_load32_acquire(&s->generation);
    fp_slot_set_state(s, FP_SLOT_READY, 55);
    for (uint64_t i = 0; i < FP_SKIP_WORDS + 3; i++)
        CHECK_EQ(fp_slot_skip(s, i, 1000 + i), 1);
    CHECK_EQ(fp_slot_start(s, 11), 0);
    fp_slot_request_cancel(s, 11);
    CHECK_EQ(fp_slot_cancel_requested(s), 1);
    fp_slot_reset(s);
    CHECK_EQ(fp_load32_acquire(&s->generation), gen + 1);
    CHECK_EQ(fp_slot_current(s), 0);
    CHECK_EQ(fp_load64_acquire(&s->cancel_id), 0);
    CHECK_EQ(fp_load64_acquire(&s->skip_seq), 0);
    for (uint32_t i = 0; i < FP_SKIP_WORDS; i++)
        CHECK_EQ(fp_load64_acquire(&s->skip[i]), 0);
    uint32_t state = 9, pid = 9;
    uint64_t cur = 9, hb = 0, served = 0;
    fp_slot_info(s, &state, &pid, &cur, &hb, &served);
    CHECK(state == FP_SLOT_EMPTY && pid == 0 && cur == 0);
    /* the next worker inherits neither the skips nor the cancel */
    for (uint64_t i = 0; i < FP_SKIP_WORDS + 3; i++) {
        CHECK_EQ(fp_slot_start(s, 1000 + i), 0);
        fp_slot_finish(s, 1);
    }
    CHECK_EQ(fp_slot_start(s, 11), 0);
    CHECK_EQ(fp_slot_cancel_requested(s), 0);
    fp_slot_finish(s, 1);
    fp_slot_reset(s);
    CHECK_EQ(fp_load32_acquire(&s->generation), gen + 2);
    board_free(t);
}

TEST(cancel_is_requested_only_for_the_running_task)
{
    tboard_t *t = board_new(1, 4096);
    fp_slot_t *s = fp_boardv_slot(&t->parent, 0);
    CHECK_EQ(fp_slot_cancel_requested(s), 0);
    fp_slot_request_cancel(s, 5);
    CHECK_EQ(fp_slot_cancel_requested(s), 0); /* idle */
    CHECK_EQ(fp_slot_start(s, 4), 0);
    CHECK_EQ(fp_slot_cancel_requested(s), 0); /* another task */
    fp_slot_finish(s, 1);
    CHECK_EQ(fp_slot_start(s, 5), 0); /* a cancel is not a skip */
    CHECK_EQ(fp_slot_cancel_requested(s), 1);
    fp_slot_finish(s, 1);
    CHECK_EQ(fp_slot_cancel_requested(s), 0);
    fp_slot_request_cancel(s, 0); /* 0 is no task: never matches the idle 0 */
    CHECK_EQ(fp_slot_cancel_requested(s), 0);
    board_free(t);
}

/* The skip protocol, one step at a time. */
TEST(skip_before_start_drops_the_task_and_after_start_does_not)
{
    tboard_t *t = board_new(1, 4096);
    fp_slot_t *s = fp_boardv_slot(&t->parent, 0);
    uint64_t seq = 0;
    CHECK_EQ(fp_slot_start(s, 1), 0); /* no request ever: the fast path */
    fp_slot_finish(s, 1);

    CHECK_EQ(fp_slot_skip(s, seq++, 2), 1); /* not started: the worker will drop it */
    CHECK_EQ(fp_slot_start(s, 2), 1);
    CHECK_EQ(fp_slot_current(s), 2); /* current is set even for a dropped task (Dekker) */
    fp_slot_finish(s, 0);

    CHECK_EQ(fp_slot_start(s, 3), 0);
    CHECK_EQ(fp_slot_skip(s, seq++, 3), 0); /* running now: too late */
    CHECK_EQ(fp_slot_skip(s, seq++, 3), 0); /* and asking again changes nothing */
    fp_slot_finish(s, 1);

    CHECK_EQ(fp_slot_skip(s, seq++, 5), 1); /* a request for 5 does not drop 4 */
    CHECK_EQ(fp_slot_start(s, 4), 0);
    CHECK_EQ(fp_slot_skip(s, seq++, 5), 1); /* 4 is running: 5 has not started */
    fp_slot_finish(s, 1);
    CHECK_EQ(fp_slot_start(s, 5), 1);
    fp_slot_finish(s, 0);

    uint32_t state, pid;
    uint64_t cur, hb, served;
    fp_slot_info(s, &state, &pid, &cur, &hb, &served);
    CHECK_EQ(served, 3); /* 1, 3, 4 */
    CHECK_EQ(cur, 0);
    CHECK_EQ(fp_load64_acquire(&s->skip_seq), seq);
    board_free(t);
}

/* FP_SKIP_WORDS words: with more requests outstanding, the latest FP_SKIP_WORDS hold
 * and the older ones are forgotten (the prefetch depth must stay within). */
TEST(skip_keeps_the_latest_skip_words_requests)
{
    tboard_t *t = board_new(1, 4096);
    fp_slot_t *s = fp_boardv_slot(&t->parent, 0);
    const uint64_t extra = 5, n = FP_SKIP_WORDS + extra;
    for (uint64_t i = 0; i < n; i++)
        CHECK_EQ(fp_slot_skip(s, i, 100 + i), 1);
    for (uint64_t i = 0; i < n; i++) {
        int dropped = fp_slot_start(s, 100 + i);
        CHECKF(dropped == (i >= extra), "task %llu: start said %d", (unsigned long long)(100 + i),
               dropped);
        fp_slot_finish(s, !dropped);
    }
    /* exactly FP_SKIP_WORDS, with seq wrapping the word index around twice */
    for (uint64_t i = n; i < n + 2 * FP_SKIP_WORDS; i++)
        CHECK_EQ(fp_slot_skip(s, i, 1000 + i), 1);
    for (uint64_t i = n; i < n + 2 * FP_SKIP_WORDS; i++) {
        int dropped = fp_slot_start(s, 1000 + i);
        CHECK_EQ(dropped, i >= n + FP_SKIP_WORDS);
        fp_slot_finish(s, !dropped);
    }
    board_free(t);
}

/* The Dekker pair under load: a worker thread starts tasks 1..N in order
 * while a parent thread asks to skip tasks it has not yet seen finish.  The
 * parent takes "skip returned 1" as "not started" unless the task's result
 * was already published when it looked again (a task that finished before
 * the request also reads current != task).  For every task the parent so
 * reports, the worker's fp_slot_start must have returned 1: no task is both
 * reported not-started and run.  Requests stay within a window of 8 tasks
 * past the last result, in random order, so at most 2*8-2 requests follow
 * any live one before its task starts: the skip words never drop a live one. */
#define DEKKER_TASKS 200000u
#define DEKKER_WINDOW 8u

typedef struct {
    fp_slot_t *s;
    fp_a32 parent_running;       /* the worker starts only once the parent thread runs */
    fp_a64 done;                 /* the worker's "result published" for tasks 1..done */
    unsigned char *dropped;      /* [N+1] start returned 1: written by the worker */
    unsigned char *claimed;      /* [N+1] the parent reports not started: written by the parent */
    unsigned char *requested;    /* [N+1] written by the parent */
    uint64_t seed;
    uint64_t refused, raced;     /* skip returned 0; returned 1 but the result was there */
} dekker_t;

static void spin_a_little(uint64_t *rng)
{
    *rng = splitmix64(*rng);
    unsigned n = (unsigned)(*rng % 8u) == 0 ? (unsigned)(*rng >> 40) % 400u : 0u;
    for (unsigned i = 0; i < n; i++)
        fp_cpu_relax();
}

static void *dekker_worker(void *arg)
{
    dekker_t *d = arg;
    uint64_t rng = d->seed ^ 0x77;
    while (!fp_load32_acquire(&d->parent_running))
        sched_yield();
    for (uint64_t task = 1; task <= DEKKER_TASKS; task++) {
        int drop = fp_slot_start(d->s, task);
        d->dropped[task] = (unsigned char)drop;
        if (!drop)
            spin_a_little(&rng); /* runs it */
        fp_store64_release(&d->done, task); /* the result (run or skipped), before finish */
        fp_slot_finish(d->s, !drop);
        spin_a_little(&rng);
    }
    return NULL;
}

static void *dekker_parent(void *arg)
{
    dekker_t *d = arg;
    uint64_t rng = d->seed, seq = 0;
    fp_store32_release(&d->parent_running, 1);
    for (;;) {
        uint64_t done = fp_load64_acquire(&d->done);
        if (done >= DEKKER_TASKS)
            break;
        rng = splitmix64(rng);
        uint64_t task = done + 1 + rng % DEKKER_WINDOW;
        if (task > DEKKER_TASKS || d->requested[task])
            continue;
        d->requested[task] = 1;
        if (fp_slot_skip(d->s, seq++, task)) {
            if (fp_load64_acquire(&d->done) >= task)
                d->raced++; /* it finished first: the parent will read its result */
            else
                d->claimed[task] = 1;
        } else {
            d->refused++;
        }
        spin_a_little(&rng);
    }
    return NULL;
}

TEST(skip_and_start_never_both_claim_a_task)
{
    tboard_t *t = board_new(1, 4096);
    dekker_t d = {0};
    d.s = fp_boardv_slot(&t->parent, 0);
    d.seed = (uint64_t)fp_now_ns();
    printf("[seed %llu] ", (unsigned long long)d.seed);
    d.dropped = calloc(DEKKER_TASKS + 1, 1);
    d.claimed = calloc(DEKKER_TASKS + 1, 1);
    d.requested = calloc(DEKKER_TASKS + 1, 1);
    CHECK(d.dropped && d.claimed && d.requested);
    pthread_t w, p;
    CHECK(pthread_create(&p, NULL, dekker_parent, &d) == 0);
    CHECK(pthread_create(&w, NULL, dekker_worker, &d) == 0);
    CHECK(pthread_join(w, NULL) == 0);
    CHECK(pthread_join(p, NULL) == 0);
    uint64_t claimed = 0, dropped = 0, requested = 0;
    for (uint64_t task = 1; task <= DEKKER_TASKS; task++) {
        CHECKF(!d.claimed[task] || d.dropped[task],
               "task %llu reported not started, but the worker ran it", (unsigned long long)task);
        CHECKF(!d.dropped[task] || d.requested[task], "task %llu dropped without a request",
               (unsigned long long)task);
        claimed += d.claimed[task];
        dropped += d.dropped[task];
        requested += d.requested[task];
    }
    printf("[%llu requests: %llu not started, %llu running, %llu finished first; %llu dropped] ",
           (unsigned long long)requested, (unsigned long long)claimed,
           (unsigned long long)d.refused, (unsigned long long)d.raced, (unsigned long long)dropped);
    CHECK(claimed > 0); /* the run exercised the protocol at all */
    CHECK(dropped >= claimed);
    free(d.dropped);
    free(d.claimed);
    free(d.requested);
    board_free(t);
}

/* ---- the parent's wait ------------------------------------------------------ */

static void check_times_out(tboard_t *t, int64_t timeout_ns, int64_t spin_ns)
{
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_boardv_wait_results(&t->parent, timeout_ns, spin_ns), 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took >= timeout_ns && took < timeout_ns + 480 * MS,
           "timeout %lld spin %lld took %lld ns", (long long)timeout_ns, (long long)spin_ns,
           (long long)took);
    CHECK_EQ(fp_load32_relaxed(&t->b->done.waiters), 0); /* finish always runs */
}

TEST(wait_results_times_out_within_bounds)
{
    tboard_t *t = board_new(2, 4096);
    check_times_out(t, 20 * MS, 0);
    check_times_out(t, 20 * MS, 5 * MS);
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 0, 0), 0);
    CHECK_EQ(fp_boardv_wait_results(&t->parent, -5 * MS, 0), 0);
    CHECK(fp_now_ns() - t0 < 50 * MS);
    board_free(t);
}

TEST(wait_results_returns_at_once_when_work_is_pending)
{
    tboard_t *t = board_new(2, 4096);
    CHECK_EQ(fp_ringv_push(&t->worker.results[1], 1, 1, 0, NULL, 0), FP_OK);
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, 0), 1);
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, 1 * MS), 1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    board_free(t);
}

typedef struct {
    tboard_t *t;
    int attention; /* 0: push a result and notify; 1: raise attention and kick */
} poker_t;

static void *poker(void *arg)
{
    poker_t *p = arg;
    sleep_ns(30 * MS);
    if (p->attention) {
        fp_store32_release(&p->t->b->attention, 1);
        fp_event_kick(&p->t->b->done);
    } else {
        fp_ringv_t *res = &p->t->worker.results[1];
        fp_resv_t rv;
        unsigned char *dst = NULL;
        CHECK_EQ(fp_ringv_reserve(res, 1, &rv, &dst), FP_OK);
        dst[0] = 'x';
        /* no ring notify: the board's is the one the parent parks on */
        fp_ringv_commit(res, &rv, 1, 42, 0, 0);
        fp_board_notify_parent(p->t->b);
    }
    return NULL;
}

static void check_woken_early(int attention, int64_t spin_ns)
{
    tboard_t *t = board_new(2, 4096);
    poker_t p = {t, attention};
    pthread_t th;
    int64_t t0 = fp_now_ns();
    CHECK(pthread_create(&th, NULL, poker, &p) == 0);
    CHECK_EQ(fp_boardv_wait_results(&t->parent, 5000 * MS, spin_ns), 1);
    int64_t took = fp_now_ns() - t0;
    CHECK(pthread_join(th, NULL) == 0);
    CHECKF(took >= 25 * MS && took < 1000 * MS, "attention %d took %lld ns", attention,
           (long long)took);
    CHECK_EQ(fp_load32_relaxed(&t->b->done.waiters), 0);
    board_free(t);
}

TEST(wait_results_returns_early_when_a_result_is_pushed)
{
    check_woken_early(0, 0);
    check_woken_early(0, 1 * MS);
}

TEST(wait_results_returns_early_on_attention)
{
    check_woken_early(1, 0);
}

/* ---- a worker's waits ---------------------------------------------------- */

TEST(wait_data_times_out_and_returns_at_once_on_data)
{
    tboard_t *t = board_new(1, 4096);
    fp_ringv_t *v = &t->worker.tasks[0];
    fp_a32 stop = 0;
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_ringv_wait_data(v, &stop, 20 * MS, 0, FP_PEER_UNKNOWN), 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took >= 20 * MS && took < 500 * MS, "took %lld ns", (long long)took);
    CHECK_EQ(fp_ringv_push(&t->parent.tasks[0], 1, 1, 0, NULL, 0), FP_OK);
    t0 = fp_now_ns();
    CHECK_EQ(fp_ringv_wait_data(v, &stop, 5000 * MS, 0, FP_PEER_UNKNOWN), 1);
    CHECK_EQ(fp_ringv_wait_data(v, NULL, 5000 * MS, 1 * MS, FP_PEER_UNKNOWN), 1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    CHECK_EQ(fp_load32_relaxed(&v->hdr->data.waiters), 0);
    board_free(t);
}

typedef struct {
    fp_ringv_t *v;
    int release; /* 0: push a record (v is a producer); 1: consume one (v is a consumer) */
} ring_poker_t;

static void *ring_poker(void *arg)
{
    ring_poker_t *p = arg;
    sleep_ns(30 * MS);
    if (p->release) {
        fp_recv_t rec;
        CHECK_EQ(fp_ringv_peek(p->v, &rec), FP_OK);
        fp_ringv_release(p->v, rec.next);
    } else {
        CHECK_EQ(fp_ringv_push(p->v, 1, 7, 0, NULL, 0), FP_OK);
    }
    return NULL;
}

TEST(wait_data_wakes_when_a_record_is_pushed)
{
    tboard_t *t = board_new(1, 4096);
    ring_poker_t p = {&t->parent.tasks[0], 0};
    pthread_t th;
    int64_t t0 = fp_now_ns();
    CHECK(pthread_create(&th, NULL, ring_poker, &p) == 0);
    CHECK_EQ(fp_ringv_wait_data(&t->worker.tasks[0], NULL, 5000 * MS, 0, FP_PEER_UNKNOWN), 1);
    int64_t took = fp_now_ns() - t0;
    CHECK(pthread_join(th, NULL) == 0);
    CHECKF(took < 1000 * MS, "took %lld ns", (long long)took);
    pop_expect(&t->worker.tasks[0], 7);
    board_free(t);
}

TEST(wait_data_with_spin_returns_at_once_on_stop)
{
    tboard_t *t = board_new(1, 4096);
    fp_a32 stop = 1;
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_ringv_wait_data(&t->worker.tasks[0], &stop, 5000 * MS, 1 * MS, FP_PEER_UNKNOWN),
             1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    board_free(t);
}

/* With no spin phase, a stop word set (and the event kicked) before the wait
 * starts must still end it at once: the re-check after fp_event_prepare looks
 * at stop as well as the ring.  (The first fp_ring_wait_data re-checked the
 * ring alone, and a worker slept out its whole timeout: a lost wake-up for
 * stop.  Kept as a regression claim.) */
TEST(wait_data_returns_at_once_when_stop_is_already_set)
{
    tboard_t *t = board_new(1, 4096);
    fp_ringv_t *v = &t->worker.tasks[0];
    fp_a32 stop = 0;
    fp_store32_release(&stop, 1);
    fp_event_kick(&v->hdr->data); /* what a stopper does; it lands before this wait starts */
    int64_t t0 = fp_now_ns();
    int has = fp_ringv_wait_data(v, &stop, 300 * MS, 0, FP_PEER_UNKNOWN);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took < 100 * MS, "a set stop word was ignored: slept %lld ms", (long long)(took / MS));
    CHECK_EQ(has, 1); /* as the spin phase answers for stop */
    CHECK_EQ(fp_load32_relaxed(&v->hdr->data.waiters), 0);
    board_free(t);
}

TEST(wait_space_times_out_and_returns_at_once_when_head_moved)
{
    tboard_t *t = board_new(1, 4096);
    fp_ringv_t *v = &t->worker.results[0];
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_ringv_wait_space(v, 0, 20 * MS), 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took >= 20 * MS && took < 500 * MS, "took %lld ns", (long long)took);
    t0 = fp_now_ns();
    /* head is not where the caller last saw it */
    CHECK_EQ(fp_ringv_wait_space(v, 12345, 5000 * MS), 1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    CHECK_EQ(fp_load32_relaxed(&v->hdr->space.waiters), 0);
    board_free(t);
}

TEST(wait_space_wakes_when_the_consumer_releases)
{
    tboard_t *t = board_new(1, 4096);
    fp_ringv_t *prod = &t->worker.results[0];
    ring_poker_t p = {&t->parent.results[0], 1};
    static unsigned char payload[1000];
    while (fp_ringv_push(prod, 1, 1, 0, payload, sizeof(payload)) == FP_OK)
        ;
    CHECK_EQ(fp_ringv_push(prod, 1, 1, 0, payload, sizeof(payload)), FP_AGAIN);
    uint64_t seen = fp_load64_acquire(&prod->hdr->head);
    pthread_t th;
    int64_t t0 = fp_now_ns();
    CHECK(pthread_create(&th, NULL, ring_poker, &p) == 0);
    CHECK_EQ(fp_ringv_wait_space(prod, seen, 5000 * MS), 1);
    int64_t took = fp_now_ns() - t0;
    CHECK(pthread_join(th, NULL) == 0);
    CHECKF(took < 1000 * MS, "took %lld ns", (long long)took);
    CHECK_EQ(fp_ringv_push(prod, 1, 2, 0, payload, sizeof(payload)), FP_OK);
    board_free(t);
}

int main(int argc, char **argv) { return check_main(argc, argv); }
