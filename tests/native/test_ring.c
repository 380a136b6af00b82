/* Claims about fp_ring in one process: order, placement (PAD, wrap, the jump
 * back to offset 0), limits (FP_TOOBIG, FP_AGAIN), and a long random run
 * against a reference queue. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check.h"
#include "fp_ring.h"

#define KIND 7u
#define POISON 0xABu

/* One ring and both sides' private views of it (one process plays both). */
typedef struct {
    fp_ring_t *r;
    fp_ringv_t prod, cons;
} tring_t;

static tring_t *ring_new(uint64_t cap)
{
    void *mem = NULL;
    CHECK(posix_memalign(&mem, 4096, sizeof(fp_ring_t) + cap) == 0);
    tring_t *t = calloc(1, sizeof(*t));
    CHECK(t != NULL);
    t->r = mem;
    fp_ring_init(t->r, cap);
    CHECK_EQ(fp_ringv_init(&t->prod, t->r, cap, 1), FP_OK);
    CHECK_EQ(fp_ringv_init(&t->cons, t->r, cap, 0), FP_OK);
    /* poisoned, so a test can tell the bytes the ring wrote from those it left */
    memset(fp_ring_data(t->r), POISON, cap);
    return t;
}

static void ring_free(tring_t *t)
{
    free(t->r);
    free(t);
}

static void ring_reset(tring_t *t)
{
    fp_ringv_reset(&t->prod);
    t->cons.pos = 0;
}

static unsigned char payload_byte(uint64_t seed, uint64_t i)
{
    return (unsigned char)((splitmix64(seed) >> ((i & 7u) * 8u)) + (i >> 3));
}

static void fill(unsigned char *p, uint64_t len, uint64_t seed)
{
    for (uint64_t i = 0; i < len; i++)
        p[i] = payload_byte(seed, i);
}

static int payload_ok(const unsigned char *p, uint64_t len, uint64_t seed)
{
    for (uint64_t i = 0; i < len; i++)
        if (p[i] != payload_byte(seed, i))
            return 0;
    return 1;
}

static int push_seeded(tring_t *r, uint64_t id, uint64_t len)
{
    static unsigned char buf[65536]; /* one thread per test binary uses it */
    CHECK(len <= sizeof(buf));
    fill(buf, len, id);
    return fp_ringv_push(&r->prod, KIND, id, ~id, buf, len);
}

/* Offset in data[] of the record reserved by res. */
static uint64_t resv_offset(tring_t *r, const fp_resv_t *res) { return res->pos % r->prod.cap; }

static void pop_expect(tring_t *r, uint64_t id, uint64_t len)
{
    fp_recv_t rec;
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_OK);
    CHECK_EQ(rec.task_id, id);
    CHECK_EQ(rec.kind, KIND);
    CHECK_EQ(rec.aux, ~id);
    CHECK_EQ(rec.len, len);
    CHECK(payload_ok(rec.payload, len, id));
    fp_ringv_release(&r->cons, rec.next);
}

static void set_positions(tring_t *r, uint64_t pos)
{
    fp_store64_relaxed(&r->r->head, pos);
    fp_store64_relaxed(&r->r->tail, pos);
    r->prod.pos = r->cons.pos = pos;
}

TEST(empty_ring_peek_is_again)
{
    tring_t *r = ring_new(4096);
    fp_recv_t rec;
    CHECK(fp_ringv_empty(&r->cons));
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_AGAIN);
    ring_free(r);
}

TEST(records_come_out_in_push_order)
{
    tring_t *r = ring_new(4096);
    for (uint64_t id = 1; id <= 20; id++)
        CHECK_EQ(push_seeded(r, id, id * 5), FP_OK);
    for (uint64_t id = 1; id <= 20; id++)
        pop_expect(r, id, id * 5);
    CHECK(fp_ringv_empty(&r->cons));
    CHECK_EQ(r->r->pushed, 20);
    ring_free(r);
}

TEST(peek_does_not_consume_and_release_advances)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 10), FP_OK);
    CHECK_EQ(push_seeded(r, 2, 20), FP_OK);
    fp_recv_t a, b;
    CHECK_EQ(fp_ringv_peek(&r->cons, &a), FP_OK);
    CHECK_EQ(fp_ringv_peek(&r->cons, &b), FP_OK);
    CHECK(a.payload == b.payload);
    uint64_t na = a.next;
    CHECK_EQ(na, b.next);
    CHECK_EQ(na, fp_rec_size(10));
    CHECK_EQ(fp_load64_acquire(&r->r->head), 0); /* peeking moved nothing */
    fp_ringv_release(&r->cons, na);
    CHECK_EQ(fp_load64_acquire(&r->r->head), na);
    pop_expect(r, 2, 20);
    CHECK(fp_ringv_empty(&r->cons));
    ring_free(r);
}

TEST(reserved_record_is_invisible_until_commit)
{
    tring_t *r = ring_new(4096);
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&r->prod, 100, &res, &p), FP_OK);
    fill(p, 100, 9);
    fp_recv_t rec;
    CHECK(fp_ringv_empty(&r->cons));
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_AGAIN);
    fp_ringv_commit(&r->prod, &res, KIND, 9, ~9ull, 1);
    CHECK(!fp_ringv_empty(&r->cons));
    pop_expect(r, 9, 100);
    ring_free(r);
}

TEST(zero_length_record_takes_only_a_header)
{
    tring_t *r = ring_new(4096);
    for (uint64_t id = 0; id < 10; id++) {
        CHECK_EQ(fp_ringv_push(&r->prod, KIND, id, ~id, NULL, 0), FP_OK);
        CHECK_EQ(fp_load64_acquire(&r->r->tail), (id + 1) * sizeof(fp_rec_t));
    }
    for (uint64_t id = 0; id < 10; id++)
        pop_expect(r, id, 0);
    CHECK(fp_ringv_empty(&r->cons));
    ring_free(r);
}

TEST(record_above_capacity_half_is_toobig)
{
    static const uint64_t caps[] = {4096, 4104, 65536};
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        tring_t *r = ring_new(caps[c]);
        uint64_t max = caps[c] / 2 - 24;
        CHECK_EQ(r->prod.max_record, max);
        CHECK_EQ(push_seeded(r, 1, max + 1), FP_TOOBIG);
        fp_resv_t res;
        unsigned char *p = NULL;
        /* no overflow in the size sum */
        CHECK_EQ(fp_ringv_reserve(&r->prod, UINT64_MAX, &res, &p), FP_TOOBIG);
        CHECK(fp_ringv_empty(&r->cons)); /* a refused record leaves nothing behind */
        CHECK_EQ(push_seeded(r, 3, max), FP_OK);
        pop_expect(r, 3, max);
        ring_free(r);
    }
}

/* "Records are limited to capacity/2 so that an empty ring always fits one":
 * at every offset the producer can be at, including capacities that are a
 * multiple of 8 but not of 16, where the padded record exceeds capacity/2. */
TEST(max_record_fits_empty_ring_at_every_offset)
{
    static const uint64_t caps[] = {4096, 4104, 4112, 8200};
    for (size_t c = 0; c < sizeof(caps) / sizeof(caps[0]); c++) {
        uint64_t cap = caps[c];
        tring_t *r = ring_new(cap);
        uint64_t max = r->prod.max_record;
        for (uint64_t off = 0; off < cap; off += 8) {
            set_positions(r, 5 * cap + off);
            CHECKF(push_seeded(r, off, max) == FP_OK, "cap %llu off %llu", (unsigned long long)cap,
                   (unsigned long long)off);
            pop_expect(r, off, max);
            CHECK(fp_ringv_empty(&r->cons));
        }
        ring_free(r);
    }
}

TEST(full_ring_returns_again_and_keeps_its_contents)
{
    tring_t *r = ring_new(4096);
    uint64_t n = 0;
    int rc;
    while ((rc = push_seeded(r, n, 100)) == FP_OK)
        n++;
    CHECK_EQ(rc, FP_AGAIN);
    uint64_t need = fp_rec_size(100);
    CHECK_EQ(n, 4096 / need);
    uint64_t tail = fp_load64_acquire(&r->r->tail);
    CHECK(tail - fp_load64_acquire(&r->r->head) + need > 4096);
    CHECK_EQ(push_seeded(r, 999, 100), FP_AGAIN);
    CHECK_EQ(fp_load64_acquire(&r->r->tail), tail); /* a refused push publishes nothing */
    CHECK_EQ(push_seeded(r, 1000, 0), FP_AGAIN); /* not even a bare header */
    pop_expect(r, 0, 100);
    CHECK_EQ(push_seeded(r, n, 100), FP_OK); /* room again: goes to offset 0 */
    for (uint64_t id = 1; id < n; id++)
        pop_expect(r, id, 100);
    pop_expect(r, n, 100);
    CHECK(fp_ringv_empty(&r->cons));
    ring_free(r);
}

/* A record that does not fit before the end goes to offset 0 behind a PAD
 * record covering the rest of the buffer; the consumer skips the PAD. */
TEST(record_that_does_not_fit_before_the_end_goes_behind_a_pad)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 2024), FP_OK); /* [0, 2048) */
    CHECK_EQ(push_seeded(r, 2, 1000), FP_OK); /* [2048, 3072) */
    pop_expect(r, 1, 2024);
    fp_resv_t res;
    unsigned char *p = NULL;
    /* 1528 bytes: only 1024 left before the end */
    CHECK_EQ(fp_ringv_reserve(&r->prod, 1500, &res, &p), FP_OK);
    CHECK_EQ(res.skip, 1024);
    CHECK_EQ(resv_offset(r, &res), 0);
    CHECK_EQ(res.pos, 4096);
    fill(p, 1500, 3);
    fp_ringv_commit(&r->prod, &res, KIND, 3, ~3ull, 1);
    fp_rec_t *pad = (fp_rec_t *)(fp_ring_data(r->r) + 3072);
    CHECK_EQ(pad->kind, FP_REC_PAD);
    CHECK_EQ(pad->len, 0); /* unused: the consumer skips to the end of the data */
    CHECK_EQ(fp_load64_acquire(&r->r->tail), 4096 + fp_rec_size(1500));
    pop_expect(r, 2, 1000);
    pop_expect(r, 3, 1500); /* the PAD is skipped, never returned */
    CHECK(fp_ringv_empty(&r->cons));
    ring_free(r);
}

/* A gap under 24 bytes cannot hold a PAD header: the producer leaves it
 * untouched and the consumer skips it by arithmetic alone. */
TEST(gap_under_a_header_is_skipped_without_a_pad)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 2024), FP_OK); /* [0, 2048) */
    CHECK_EQ(push_seeded(r, 2, 2008), FP_OK); /* [2048, 4080): 16 bytes left */
    pop_expect(r, 1, 2024);
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&r->prod, 0, &res, &p), FP_OK);
    CHECK_EQ(res.skip, 16);
    CHECK_EQ(resv_offset(r, &res), 0);
    fp_ringv_commit(&r->prod, &res, KIND, 3, ~3ull, 1);
    for (int i = 4080; i < 4096; i++)
        CHECK_EQ(fp_ring_data(r->r)[i], POISON);
    pop_expect(r, 2, 2008);
    pop_expect(r, 3, 0);
    CHECK(fp_ringv_empty(&r->cons));
    ring_free(r);
}

TEST(record_exactly_filling_to_the_end_needs_no_pad)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 2024), FP_OK); /* [0, 2048) */
    CHECK_EQ(push_seeded(r, 2, 1000), FP_OK); /* [2048, 3072) */
    pop_expect(r, 1, 2024);
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&r->prod, 1000, &res, &p), FP_OK); /* [3072, 4096) exactly */
    CHECK_EQ(res.skip, 0);
    CHECK_EQ(resv_offset(r, &res), 3072);
    CHECK(p + 1000 == fp_ring_data(r->r) + 4096);
    fill(p, 1000, 3);
    fp_ringv_commit(&r->prod, &res, KIND, 3, ~3ull, 1);
    CHECK_EQ(fp_load64_acquire(&r->r->tail), 4096);
    CHECK_EQ(push_seeded(r, 4, 200), FP_OK); /* next lap starts at 0 with nothing skipped */
    CHECK_EQ(fp_load64_acquire(&r->r->tail), 4096 + fp_rec_size(200));
    pop_expect(r, 2, 1000);
    pop_expect(r, 3, 1000);
    pop_expect(r, 4, 200);
    CHECK(fp_ringv_empty(&r->cons));
    ring_free(r);
}

/* An empty ring the producer is far into restarts at offset 0 (warm pages),
 * behind a PAD. */
TEST(empty_ring_restarts_at_offset_zero)
{
    tring_t *r = ring_new(4096);
    uint64_t far = fp_ring_restart_bytes(4096);
    CHECK_EQ(far, 2048);
    CHECK_EQ(push_seeded(r, 1, far - sizeof(fp_rec_t)), FP_OK); /* the producer is now at 2048 */
    pop_expect(r, 1, far - sizeof(fp_rec_t));
    CHECK(fp_ringv_empty(&r->cons));
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&r->prod, 50, &res, &p), FP_OK); /* 80 bytes, well under 2048 / 4 */
    CHECK_EQ(resv_offset(r, &res), 0);
    CHECK_EQ(res.skip, 4096 - far);
    CHECK(p == fp_ring_data(r->r) + sizeof(fp_rec_t));
    fill(p, 50, 2);
    fp_ringv_commit(&r->prod, &res, KIND, 2, ~2ull, 1);
    pop_expect(r, 2, 50);
    /* and again and again: a steady small stream keeps to the first half */
    for (uint64_t id = 3; id < 1000; id++) {
        CHECK_EQ(fp_ringv_reserve(&r->prod, 40, &res, &p), FP_OK);
        CHECK(resv_offset(r, &res) < far + fp_rec_size(40));
        fill(p, 40, id);
        fp_ringv_commit(&r->prod, &res, KIND, id, ~id, 1);
        pop_expect(r, id, 40);
    }
    ring_free(r);
}

/* A ring emptied near its start does not restart: the restart's skipped bytes
 * would stay in use until the consumer passed them, leaving room for one record
 * (a worker could then hold one prefetched task, not sixteen). */
TEST(an_emptied_ring_still_queues_a_ring_full_of_records)
{
    tring_t *r = ring_new(65536);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    pop_expect(r, 1, 100);
    uint64_t n = 0;
    while (push_seeded(r, 2 + n, 100) == FP_OK)
        n++;
    CHECKF(n >= 65536 / fp_rec_size(100) - 1, "only %llu records fit", (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        pop_expect(r, 2 + i, 100);
    ring_free(r);
}

TEST(nonempty_ring_does_not_restart)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    CHECK_EQ(push_seeded(r, 2, 100), FP_OK);
    pop_expect(r, 1, 100);
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&r->prod, 50, &res, &p), FP_OK);
    CHECK_EQ(res.skip, 0);
    CHECK_EQ(resv_offset(r, &res), 2 * fp_rec_size(100));
    ring_free(r);
}

/* Restarting needs the record to fit below the current offset; otherwise it
 * stays where the producer is. */
TEST(empty_ring_stays_put_when_the_record_is_larger_than_the_offset)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 8), FP_OK); /* 32 bytes */
    pop_expect(r, 1, 8);
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&r->prod, 100, &res, &p), FP_OK); /* 128 > 32 */
    CHECK_EQ(res.skip, 0);
    CHECK_EQ(resv_offset(r, &res), 32);
    ring_free(r);
}

TEST(bad_record_length_is_corrupt)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    fp_rec_t *h = (fp_rec_t *)fp_ring_data(r->r);
    h->len = 200; /* claims more than was published */
    fp_recv_t rec;
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_CORRUPT);
    h->len = 5000; /* runs past the end of the buffer */
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_CORRUPT);
    h->len = 100;
    pop_expect(r, 1, 100);
    ring_free(r);
}

TEST(reset_empties_the_ring_and_clears_waiters)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    CHECK_EQ(push_seeded(r, 2, 100), FP_OK);
    pop_expect(r, 1, 100);
    fp_event_prepare(&r->r->data); /* waiters left behind by a peer that died parked */
    fp_event_prepare(&r->r->space);
    ring_reset(r);
    CHECK(fp_ringv_empty(&r->cons));
    CHECK_EQ(fp_load64_acquire(&r->r->head), 0);
    CHECK_EQ(fp_event_notify(&r->r->data), 0);
    CHECK_EQ(fp_event_notify(&r->r->space), 0);
    fp_recv_t rec;
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_AGAIN); /* the old record 2 is gone */
    CHECK_EQ(push_seeded(r, 3, 100), FP_OK);
    pop_expect(r, 3, 100);
    ring_free(r);
}

/* ---- a long random run against a reference queue ---------------------- */

typedef struct {
    uint64_t id, len, end; /* end: the position the record's release hands back */
} model_rec_t;

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static uint64_t random_len(uint64_t *s, uint64_t max)
{
    uint64_t k = rng_next(s) % 100;
    if (k < 25)
        return rng_next(s) % 17;
    if (k < 65)
        return rng_next(s) % 257;
    if (k < 88)
        return rng_next(s) % 1025; /* max is at least 2024 */
    if (k < 97)
        return max - rng_next(s) % 64;
    return max + 1 + rng_next(s) % 64; /* FP_TOOBIG */
}

static void random_run(uint64_t cap, uint64_t seed, int ops)
{
    tring_t *r = ring_new(cap);
    uint64_t max = r->prod.max_record;
    size_t qcap = cap / sizeof(fp_rec_t) + 1;
    model_rec_t *q = calloc(qcap, sizeof(*q));
    CHECK(q != NULL);
    size_t qh = 0, qn = 0;
    uint64_t head = 0, tail = 0, next_id = 1, rng = seed, jumps = 0, pads = 0, fulls = 0;
    unsigned char *data = fp_ring_data(r->r);

    for (int op = 0; op < ops; op++) {
        uint64_t k = rng_next(&rng) % 100;
        if (k < 3) { /* drain: exercises the empty-ring restart */
            while (qn) {
                pop_expect(r, q[qh].id, q[qh].len);
                head = q[qh].end;
                qh = (qh + 1) % qcap;
                qn--;
            }
        } else if (k < 55) {
            uint64_t len = random_len(&rng, max);
            uint64_t need = fp_rec_size(len), off = tail % cap, to_end = cap - off;
            int empty = head == tail;
            int fits =
                need <= to_end && !(empty && off >= fp_ring_restart_bytes(cap) && need <= off / 4)
                    ? tail + need - head <= cap
                    : tail + to_end + need - head <= cap;
            fp_resv_t res = {0};
            unsigned char *p = NULL;
            int rc = fp_ringv_reserve(&r->prod, len, &res, &p);
            if (len > max) {
                CHECKF(rc == FP_TOOBIG, "seed %llu op %d", (unsigned long long)seed, op);
                continue;
            }
            CHECKF(!empty || rc == FP_OK, "an empty ring refused %llu bytes, seed %llu op %d",
                   (unsigned long long)len, (unsigned long long)seed, op);
            CHECKF(rc == (fits ? FP_OK : FP_AGAIN), "rc %d fits %d seed %llu op %d", rc, fits,
                   (unsigned long long)seed, op);
            if (rc != FP_OK) {
                fulls++;
                continue;
            }
            uint64_t at = (uint64_t)(p - data) - sizeof(fp_rec_t);
            CHECKF(at + need <= cap, "record wraps, seed %llu op %d", (unsigned long long)seed, op);
            CHECK(at == off || at == 0);
            int restart = empty && off >= fp_ring_restart_bytes(cap) && need <= off / 4;
            if (restart && need <= to_end)
                CHECKF(at == 0, "empty ring did not restart at 0, seed %llu op %d",
                       (unsigned long long)seed, op);
            if (at != off) {
                CHECK(need > to_end || restart);
                jumps += empty && need <= to_end;
                pads += to_end >= sizeof(fp_rec_t);
            }
            uint64_t id = next_id++;
            if (rng_next(&rng) & 1) {
                fill(p, len, id);
                fp_ringv_commit(&r->prod, &res, KIND, id, ~id, 1);
            } else { /* same placement through fp_ring_push */
                CHECK_EQ(push_seeded(r, id, len), FP_OK);
            }
            tail = (at == off ? tail : tail + to_end) + need;
            CHECK_EQ(fp_load64_acquire(&r->r->tail), tail);
            CHECK(qn < qcap);
            q[(qh + qn) % qcap] = (model_rec_t){id, len, tail};
            qn++;
        } else if (qn) {
            pop_expect(r, q[qh].id, q[qh].len);
            CHECK_EQ(fp_load64_acquire(&r->r->head), q[qh].end);
            head = q[qh].end;
            qh = (qh + 1) % qcap;
            qn--;
        } else {
            fp_recv_t rec;
            CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_AGAIN);
        }
        CHECK_EQ(fp_ringv_empty(&r->cons), qn == 0);
        CHECK(tail - head <= cap);
    }
    /* the run must have reached the corners it exists for */
    CHECKF(jumps > 0 && pads > 0 && fulls > 0, "jumps %llu pads %llu fulls %llu",
           (unsigned long long)jumps, (unsigned long long)pads, (unsigned long long)fulls);
    free(q);
    ring_free(r);
}

TEST(random_sizes_match_a_reference_queue)
{
    random_run(4096, 1, 100000);
    random_run(4104, 2, 100000);
    random_run(65536, 3, 100000);
}

/* fp_rec_t.len is 32 bits, but fp_ring_max_record() is capacity/2 - 24 with
 * no 4 GiB clamp, and fp_board_init accepts any capacity >= 4096.  Above
 * 8 GiB of capacity, fp_ring_reserve accepts a record longer than UINT32_MAX,
 * stores (uint32_t)len in the reservation, and fp_ring_commit then publishes
 * only fp_rec_size(len mod 2^32) bytes: the caller writes 4 GiB+ of payload
 * over space the ring hands out again. */
TEST(record_longer_than_u32_is_refused_not_truncated)
{
    void *mem = NULL;
    /* only the first record header is touched */
    CHECK(posix_memalign(&mem, 4096, sizeof(fp_ring_t) + 4096) == 0);
    fp_ring_t *r = mem;
    fp_ring_init(r, 1ull << 34);
    fp_ringv_t v;
    CHECK_EQ(fp_ringv_init(&v, r, 1ull << 34, 1), FP_OK);
    CHECK_EQ(v.max_record, UINT32_MAX);
    uint64_t len = (1ull << 32) + 8;
    fp_resv_t res;
    unsigned char *p = NULL;
    int rc = fp_ringv_reserve(&v, len, &res, &p);
    if (rc == FP_OK) {
        fp_ringv_commit(&v, &res, KIND, 1, 0, 1); /* header at offset 0: inside the allocation */
        CHECK_EQ(fp_load64_acquire(&r->tail), fp_rec_size(len));
    }
    CHECK_EQ(rc, FP_TOOBIG);
    static unsigned char two[16];
    volatile uint64_t huge = UINT64_MAX - 4; /* opaque to the compiler's memcpy bound check */
    /* no wrap in the sum */
    CHECK_EQ(fp_ringv_push2(&v, KIND, 1, 0, two, huge, two, 16, 1), FP_TOOBIG);
    free(mem);
}

/* ---- the other side writes garbage: read once, checked, never trusted ----- */

TEST(capacity_the_view_cannot_use_is_refused)
{
    fp_ring_t hdr;
    fp_ringv_t v;
    static const uint64_t bad[] = {0, 8, 4095, 4097, 4100};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK_EQ(fp_ringv_init(&v, &hdr, bad[i], 0), FP_CORRUPT);
}

/* The shared header's capacity is never read after the view exists: a peer
 * that sets it to 0 (SIGFPE in a '% capacity') or 2^63 changes nothing. */
TEST(shared_capacity_changes_nothing)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    r->r->capacity = 0;
    pop_expect(r, 1, 100);
    r->r->capacity = 1ull << 63;
    CHECK_EQ(push_seeded(r, 2, 100), FP_OK);
    pop_expect(r, 2, 100);
    ring_free(r);
}

TEST(tail_beyond_a_lap_or_behind_head_is_corrupt)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    static const uint64_t bad[] = {4096 + 8, UINT64_MAX, UINT64_MAX - 7, 1ull << 63};
    fp_recv_t rec;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fp_store64_release(&r->r->tail, bad[i]);
        CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_CORRUPT);
    }
    set_positions(r, 10 * 4096);
    fp_store64_release(&r->r->tail, 10 * 4096 - 8); /* behind the consumer */
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_CORRUPT);
    ring_free(r);
}

/* The producer reads the consumer's head once and checks it: a head ahead of
 * the tail, or more than a lap behind it, is corrupt, not "room". */
TEST(head_the_consumer_cannot_have_written_is_corrupt)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    uint64_t tail = fp_load64_acquire(&r->r->tail);
    static const uint64_t bad_delta[] = {8, 4096, 1ull << 40};
    for (size_t i = 0; i < sizeof(bad_delta) / sizeof(bad_delta[0]); i++) {
        fp_store64_release(&r->r->head, tail + bad_delta[i]);
        CHECK_EQ(push_seeded(r, 2, 10), FP_CORRUPT);
    }
    fp_store64_release(&r->r->head, 0);
    CHECK_EQ(push_seeded(r, 2, 10), FP_OK);
    ring_free(r);
}

/* The consumer's own position is private: a peer that rewinds the shared
 * head cannot make it read a record twice. */
TEST(consumer_position_is_private)
{
    tring_t *r = ring_new(4096);
    CHECK_EQ(push_seeded(r, 1, 100), FP_OK);
    CHECK_EQ(push_seeded(r, 2, 100), FP_OK);
    pop_expect(r, 1, 100);
    fp_store64_release(&r->r->head, 0);
    pop_expect(r, 2, 100);
    fp_recv_t rec;
    CHECK_EQ(fp_ringv_peek(&r->cons, &rec), FP_AGAIN);
    ring_free(r);
}

/* Every header value a peer can write, adversarial and random, in the record
 * the consumer reads next: FP_CORRUPT or a record inside what was published. */
TEST(scribbled_record_headers_never_escape_the_published_bytes)
{
    static const uint32_t lens[] = {0, 1, 100, 2024, 2025, 4095, 4096, 0x7FFFFFFFu, 0xFFFFFFFFu};
    static const uint32_t kinds[] = {0, KIND, FP_REC_PAD, 0xFFFFFFFEu};
    uint64_t rng = 42;
    for (int round = 0; round < 2000; round++) {
        tring_t *r = ring_new(4096);
        CHECK_EQ(push_seeded(r, 1, 2024), FP_OK);
        pop_expect(r, 1, 2024);
        CHECK_EQ(push_seeded(r, 2, 500), FP_OK); /* at 2048 */
        uint64_t tail = fp_load64_acquire(&r->r->tail);
        fp_rec_t *h = (fp_rec_t *)(fp_ring_data(r->r) + 2048);
        if (round < 36) {
            h->len = lens[round % 9];
            h->kind = kinds[round / 9];
        } else {
            h->len = (uint32_t)rng_next(&rng);
            h->kind = (uint32_t)rng_next(&rng) % 3 == 0 ? FP_REC_PAD : (uint32_t)rng_next(&rng);
        }
        fp_recv_t rec;
        for (int n = 0; n < 4; n++) {
            int rc = fp_ringv_peek(&r->cons, &rec);
            if (rc != FP_OK) {
                CHECK(rc == FP_CORRUPT || rc == FP_AGAIN);
                break;
            }
            CHECK(rec.payload >= fp_ring_data(r->r) &&
                  rec.payload + rec.len <= fp_ring_data(r->r) + 4096);
            CHECK(rec.next <= tail);
            fp_ringv_release(&r->cons, rec.next);
        }
        ring_free(r);
    }
}

/* The largest ring_bytes accepted (8 GiB, sparse: only touched pages cost),
 * with positions past 4 GiB: the PAD before a wrap spans more than 32 bits
 * of bytes, and the consumer still lands on the next record. */
TEST(eight_gib_ring_wraps_past_four_gib)
{
    uint64_t cap = FP_RING_MAX_CAPACITY;
    void *mem = mmap(NULL, sizeof(fp_ring_t) + cap, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    CHECK(mem != MAP_FAILED);
    tring_t t = {.r = mem};
    fp_ring_init(t.r, cap);
    CHECK_EQ(fp_ringv_init(&t.prod, t.r, cap, 1), FP_OK);
    CHECK_EQ(fp_ringv_init(&t.cons, t.r, cap, 0), FP_OK);
    /* Both sides at 3 GiB into a lap, ring empty: the next record restarts at
     * offset 0 behind a PAD of 5 GiB, more than a 32-bit length can say. */
    uint64_t start = 3 * cap + (3ull << 30);
    set_positions(&t, start);
    static unsigned char big[1 << 16];
    fill(big, sizeof(big), 8);
    fp_resv_t res;
    unsigned char *p = NULL;
    CHECK_EQ(fp_ringv_reserve(&t.prod, sizeof(big), &res, &p), FP_OK);
    CHECK_EQ(res.pos % cap, 0);
    CHECK_EQ(res.skip, 5ull << 30);
    CHECK(res.skip > UINT32_MAX);
    memcpy(p, big, sizeof(big));
    fp_ringv_commit(&t.prod, &res, KIND, 8, ~8ull, 1);
    fp_recv_t rec;
    CHECK_EQ(fp_ringv_peek(&t.cons, &rec), FP_OK);
    CHECK_EQ(rec.task_id, 8);
    CHECK_EQ(rec.len, sizeof(big));
    CHECK(rec.payload == fp_ring_data(t.r) + sizeof(fp_rec_t));
    CHECK(memcmp(rec.payload, big, sizeof(big)) == 0);
    fp_ringv_release(&t.cons, rec.next);
    CHECK(fp_ringv_empty(&t.cons));
    /* under 4 GiB: fits the 32-bit length */
    CHECK_EQ(t.prod.max_record, cap / 2 - sizeof(fp_rec_t));
    munmap(mem, sizeof(fp_ring_t) + cap);
}

int main(int argc, char **argv) { return check_main(argc, argv); }
