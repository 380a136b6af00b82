/* Claims about fp_board: init/check, the layout, and the waits that live in
 * fp_board.h (the parent's wait for results, a worker's wait for data/space). */
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>
#include <time.h>

#include "check.h"
#include "fp_board.h"

#define MS 1000000LL

static void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* A zero-filled shared mapping, as the memfd gives the pool. */
static fp_board_t *board_map(uint32_t nslots, uint64_t cap, uint64_t *size)
{
    *size = fp_board_size(nslots, cap);
    void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

static fp_board_t *board_new(uint32_t nslots, uint64_t cap, uint64_t *size)
{
    fp_board_t *b = board_map(nslots, cap, size);
    CHECK_EQ(fp_board_init(b, nslots, cap), FP_OK);
    return b;
}

TEST(init_refuses_bad_geometry)
{
    uint64_t size = 0;
    fp_board_t *b = board_map(2, 8192, &size);
    CHECK_EQ(fp_board_init(b, 0, 8192), FP_CORRUPT);
    CHECK_EQ(fp_board_init(b, 2, 4088), FP_CORRUPT); /* under 4096 */
    CHECK_EQ(fp_board_init(b, 2, 8196), FP_CORRUPT); /* not a multiple of 8 */
    CHECK_EQ(b->magic, 0);                          /* a refused init publishes nothing */
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    munmap(b, size);
}

TEST(check_accepts_a_fresh_board)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(3, 8192, &size);
    CHECK_EQ(b->magic, FP_BOARD_MAGIC);
    CHECK_EQ(b->version, FP_BOARD_VERSION);
    CHECK_EQ(b->total_size, size);
    CHECK_EQ(fp_board_check(b, size), FP_OK);
    CHECK_EQ(fp_board_check(b, size + 4096), FP_OK); /* a larger mapping is fine */
    munmap(b, size);
}

TEST(check_refuses_mismatches)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(3, 8192, &size);
    CHECK_EQ(fp_board_check(b, size - 1), FP_CORRUPT);              /* mapping shorter than the board */
    CHECK_EQ(fp_board_check(b, sizeof(fp_board_t) - 1), FP_CORRUPT); /* shorter than the header */
    CHECK_EQ(fp_board_check(b, 0), FP_CORRUPT);

    b->magic ^= 1;
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    b->magic ^= 1;
    b->version += 1;
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    b->version -= 1;
    b->total_size -= 4096;
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    b->total_size += 4096;
    b->nslots += 1; /* the recorded size no longer matches the geometry */
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    b->nslots -= 1;
    b->ring_capacity *= 2;
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    b->ring_capacity /= 2;
    CHECK_EQ(fp_board_check(b, size), FP_OK);
    munmap(b, size);
}

TEST(check_refuses_a_zero_filled_segment)
{
    uint64_t size = 0;
    fp_board_t *b = board_map(1, 4096, &size);
    CHECK_EQ(fp_board_check(b, size), FP_CORRUPT);
    munmap(b, size);
}

/* Every slot block and ring lies inside the board, rings start on a page,
 * and no two regions overlap. */
TEST(slots_and_rings_are_disjoint_and_page_aligned)
{
    static const uint32_t slot_counts[] = {1, 2, 15, 16, 17, 64};
    static const uint64_t caps[] = {4096, 4104, 65536};
    for (size_t n = 0; n < sizeof(slot_counts) / sizeof(slot_counts[0]); n++) {
        for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
            uint32_t nslots = slot_counts[n];
            uint64_t cap = caps[c], size = 0;
            fp_board_t *b = board_new(nslots, cap, &size);
            unsigned char *base = (unsigned char *)b;
            CHECK_EQ(size % FP_PAGE, 0);
            uint64_t rings_at = fp_board_rings_offset(nslots);
            CHECK_EQ(rings_at % FP_PAGE, 0);
            for (uint32_t i = 0; i < nslots; i++) {
                uint64_t s = (uint64_t)((unsigned char *)fp_board_slot(b, i) - base);
                CHECK_EQ(s, FP_PAGE + (uint64_t)i * sizeof(fp_slot_t));
                CHECK(s + sizeof(fp_slot_t) <= rings_at);
            }
            uint64_t prev_end = rings_at;
            for (uint32_t i = 0; i < nslots; i++) {
                for (int dir = 0; dir < 2; dir++) {
                    fp_ring_t *r = fp_board_ring(b, i, dir);
                    uint64_t off = (uint64_t)((unsigned char *)r - base);
                    CHECKF(off % FP_PAGE == 0, "slot %u dir %d at %llu", i, dir, (unsigned long long)off);
                    CHECKF(off >= prev_end, "slot %u dir %d overlaps the region before", i, dir);
                    prev_end = off + sizeof(fp_ring_t) + cap;
                    CHECK(prev_end <= size);
                    CHECK_EQ(r->capacity, cap);
                    CHECK(fp_ring_empty(r));
                }
            }
            /* the last byte of the last ring is mapped and writable */
            fp_ring_t *last = fp_board_ring(b, nslots - 1, 1);
            fp_ring_data(last)[cap - 1] = 1;
            munmap(b, size);
        }
    }
}

/* Rings are usable where the board puts them, and independent. */
TEST(each_ring_carries_its_own_records)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(4, 4096, &size);
    for (uint32_t i = 0; i < 4; i++)
        for (int dir = 0; dir < 2; dir++) {
            uint64_t tag = i * 2u + (uint64_t)dir;
            unsigned char payload[2024];
            memset(payload, (int)tag, sizeof(payload));
            CHECK_EQ(fp_ring_push(fp_board_ring(b, i, dir), 1, tag, 0, payload, sizeof(payload)), FP_OK);
        }
    for (uint32_t i = 0; i < 4; i++)
        for (int dir = 0; dir < 2; dir++) {
            uint64_t tag = i * 2u + (uint64_t)dir, next = 0;
            fp_rec_t *rec = NULL;
            CHECK_EQ(fp_ring_peek(fp_board_ring(b, i, dir), &rec, &next), FP_OK);
            CHECK_EQ(rec->task_id, tag);
            for (uint32_t k = 0; k < rec->len; k++)
                CHECK_EQ(((unsigned char *)(rec + 1))[k], tag);
        }
    CHECK_EQ(fp_board_check(b, size), FP_OK); /* the rings did not write over the header */
    munmap(b, size);
}

TEST(parent_has_work_for_results_or_attention)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(3, 4096, &size);
    CHECK_EQ(fp_board_parent_has_work(b), 0);
    CHECK_EQ(fp_ring_push(fp_board_ring(b, 1, 0), 1, 1, 0, NULL, 0), FP_OK);
    CHECK_EQ(fp_board_parent_has_work(b), 0); /* a task ring is the workers' business */
    fp_ring_t *res = fp_board_ring(b, 2, 1);
    CHECK_EQ(fp_ring_push(res, 1, 2, 0, NULL, 0), FP_OK);
    CHECK_EQ(fp_board_parent_has_work(b), 1);
    fp_rec_t *rec = NULL;
    uint64_t next = 0;
    CHECK_EQ(fp_ring_peek(res, &rec, &next), FP_OK);
    fp_ring_release(res, next);
    CHECK_EQ(fp_board_parent_has_work(b), 0);
    fp_store32_release(&b->attention, 1);
    CHECK_EQ(fp_board_parent_has_work(b), 1);
    fp_store32_release(&b->attention, 0);
    CHECK_EQ(fp_board_parent_has_work(b), 0);
    munmap(b, size);
}

static void check_times_out(fp_board_t *b, int64_t timeout_ns, int64_t spin_ns)
{
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_board_wait_results(b, timeout_ns, spin_ns), 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took >= timeout_ns && took < timeout_ns + 480 * MS, "timeout %lld spin %lld took %lld ns",
           (long long)timeout_ns, (long long)spin_ns, (long long)took);
    CHECK_EQ(fp_load32_relaxed(&b->done.waiters), 0); /* finish always runs */
}

TEST(wait_results_times_out_within_bounds)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(2, 4096, &size);
    check_times_out(b, 20 * MS, 0);
    check_times_out(b, 20 * MS, 5 * MS);
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_board_wait_results(b, 0, 0), 0);
    CHECK_EQ(fp_board_wait_results(b, -5 * MS, 0), 0);
    CHECK(fp_now_ns() - t0 < 50 * MS);
    munmap(b, size);
}

TEST(wait_results_returns_at_once_when_work_is_pending)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(2, 4096, &size);
    CHECK_EQ(fp_ring_push(fp_board_ring(b, 1, 1), 1, 1, 0, NULL, 0), FP_OK);
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_board_wait_results(b, 5000 * MS, 0), 1);
    CHECK_EQ(fp_board_wait_results(b, 5000 * MS, 1 * MS), 1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    munmap(b, size);
}

typedef struct {
    fp_board_t *b;
    int attention; /* 0: push a result and notify; 1: raise attention and kick */
} poker_t;

static void *poker(void *arg)
{
    poker_t *p = arg;
    sleep_ns(30 * MS);
    if (p->attention) {
        fp_store32_release(&p->b->attention, 1);
        fp_event_kick(&p->b->done);
    } else {
        CHECK_EQ(fp_ring_push(fp_board_ring(p->b, 1, 1), 1, 42, 0, "x", 1), FP_OK);
        fp_board_notify_parent(p->b);
    }
    return NULL;
}

static void check_woken_early(int attention, int64_t spin_ns)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(2, 4096, &size);
    poker_t p = {b, attention};
    pthread_t t;
    int64_t t0 = fp_now_ns();
    CHECK(pthread_create(&t, NULL, poker, &p) == 0);
    CHECK_EQ(fp_board_wait_results(b, 5000 * MS, spin_ns), 1);
    int64_t took = fp_now_ns() - t0;
    CHECK(pthread_join(t, NULL) == 0);
    CHECKF(took >= 25 * MS && took < 1000 * MS, "attention %d took %lld ns", attention, (long long)took);
    CHECK_EQ(fp_load32_relaxed(&b->done.waiters), 0);
    munmap(b, size);
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
    uint64_t size = 0;
    fp_board_t *b = board_new(1, 4096, &size);
    fp_ring_t *r = fp_board_ring(b, 0, 0);
    fp_a32 stop = 0;
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_ring_wait_data(r, &stop, 20 * MS, 0), 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took >= 20 * MS && took < 500 * MS, "took %lld ns", (long long)took);
    CHECK_EQ(fp_ring_push(r, 1, 1, 0, NULL, 0), FP_OK);
    t0 = fp_now_ns();
    CHECK_EQ(fp_ring_wait_data(r, &stop, 5000 * MS, 0), 1);
    CHECK_EQ(fp_ring_wait_data(r, NULL, 5000 * MS, 1 * MS), 1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    CHECK_EQ(fp_load32_relaxed(&r->data.waiters), 0);
    munmap(b, size);
}

typedef struct {
    fp_ring_t *r;
    int release; /* 0: push a record; 1: consume one */
} ring_poker_t;

static void *ring_poker(void *arg)
{
    ring_poker_t *p = arg;
    sleep_ns(30 * MS);
    if (p->release) {
        fp_rec_t *rec = NULL;
        uint64_t next = 0;
        CHECK_EQ(fp_ring_peek(p->r, &rec, &next), FP_OK);
        fp_ring_release(p->r, next);
    } else {
        CHECK_EQ(fp_ring_push(p->r, 1, 7, 0, NULL, 0), FP_OK);
    }
    return NULL;
}

TEST(wait_data_wakes_when_a_record_is_pushed)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(1, 4096, &size);
    ring_poker_t p = {fp_board_ring(b, 0, 0), 0};
    pthread_t t;
    int64_t t0 = fp_now_ns();
    CHECK(pthread_create(&t, NULL, ring_poker, &p) == 0);
    CHECK_EQ(fp_ring_wait_data(p.r, NULL, 5000 * MS, 0), 1);
    int64_t took = fp_now_ns() - t0;
    CHECK(pthread_join(t, NULL) == 0);
    CHECKF(took < 1000 * MS, "took %lld ns", (long long)took);
    munmap(b, size);
}

TEST(wait_data_with_spin_returns_at_once_on_stop)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(1, 4096, &size);
    fp_a32 stop = 1;
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_ring_wait_data(fp_board_ring(b, 0, 0), &stop, 5000 * MS, 1 * MS), 1);
    CHECK(fp_now_ns() - t0 < 100 * MS);
    munmap(b, size);
}

/* The stop word is checked only while spinning.  After fp_event_prepare the
 * re-check looks at the ring alone, so with spin_ns == 0 (or when stop is set,
 * and the event kicked, after the spin phase ended but before prepare read the
 * key) the worker sleeps out its whole timeout and returns 0: a lost wake-up
 * for stop.  Same shape as fp_board_wait_results, whose re-check does include
 * attention/want. */
TEST(wait_data_returns_at_once_when_stop_is_already_set)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(1, 4096, &size);
    fp_ring_t *r = fp_board_ring(b, 0, 0);
    fp_a32 stop = 0;
    fp_store32_release(&stop, 1);
    fp_event_kick(&r->data); /* what a stopper does; it lands before this wait starts */
    int64_t t0 = fp_now_ns();
    int has = fp_ring_wait_data(r, &stop, 300 * MS, 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took < 100 * MS, "a set stop word was ignored: slept %lld ms", (long long)(took / MS));
    CHECK_EQ(has, 1); /* as the spin phase answers for stop */
    munmap(b, size);
}

TEST(wait_space_times_out_and_returns_at_once_when_head_moved)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(1, 4096, &size);
    fp_ring_t *r = fp_board_ring(b, 0, 1);
    int64_t t0 = fp_now_ns();
    CHECK_EQ(fp_ring_wait_space(r, 0, 20 * MS), 0);
    int64_t took = fp_now_ns() - t0;
    CHECKF(took >= 20 * MS && took < 500 * MS, "took %lld ns", (long long)took);
    t0 = fp_now_ns();
    CHECK_EQ(fp_ring_wait_space(r, 12345, 5000 * MS), 1); /* head is not where the caller last saw it */
    CHECK(fp_now_ns() - t0 < 100 * MS);
    CHECK_EQ(fp_load32_relaxed(&r->space.waiters), 0);
    munmap(b, size);
}

TEST(wait_space_wakes_when_the_consumer_releases)
{
    uint64_t size = 0;
    fp_board_t *b = board_new(1, 4096, &size);
    ring_poker_t p = {fp_board_ring(b, 0, 1), 1};
    static unsigned char payload[1000];
    while (fp_ring_push(p.r, 1, 1, 0, payload, sizeof(payload)) == FP_OK)
        ;
    uint64_t seen = fp_load64_acquire(&p.r->head);
    pthread_t t;
    int64_t t0 = fp_now_ns();
    CHECK(pthread_create(&t, NULL, ring_poker, &p) == 0);
    CHECK_EQ(fp_ring_wait_space(p.r, seen, 5000 * MS), 1);
    int64_t took = fp_now_ns() - t0;
    CHECK(pthread_join(t, NULL) == 0);
    CHECKF(took < 1000 * MS, "took %lld ns", (long long)took);
    CHECK_EQ(fp_ring_push(p.r, 1, 2, 0, payload, sizeof(payload)), FP_OK);
    munmap(b, size);
}

int main(int argc, char **argv) { return check_main(argc, argv); }
