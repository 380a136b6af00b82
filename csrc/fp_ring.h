/* Single-producer single-consumer ring of variable-length records.
 *
 * One ring carries one direction between the parent and one worker, so every
 * ring has exactly one writer and one reader and needs no lock: a process
 * killed on any instruction leaves at worst an unpublished record, never a
 * held lock (the multiprocessing.Queue / pebble #163 wedge cannot happen).
 *
 * Positions are monotonic byte counts; the byte offset is pos % capacity.
 *
 *   data: | rec | rec | PAD ....... |      record = fp_rec_t header + payload,
 *          ^head       ^tail                padded to 8 bytes
 *
 * A record never wraps: when it does not fit before the end, the producer
 * writes a PAD record (or leaves < 24 bytes, which the consumer skips) and
 * starts at offset 0.  When the ring is empty the producer also jumps back
 * to offset 0, so a steady stream of small records keeps touching the same
 * few pages (first touch of fresh shared pages is what costs, not the copy).
 * Records are limited to capacity/2 so that an empty ring always fits one.
 */
#ifndef FP_RING_H
#define FP_RING_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fp_atomic.h"
#include "fp_futex.h"
#include "fp_status.h"

#define FP_REC_PAD 0xFFFFFFFFu

typedef struct {
    uint32_t len;     /* payload bytes, unpadded */
    uint32_t kind;    /* FP_REC_PAD or a caller-defined kind */
    uint64_t task_id;
    uint64_t aux;     /* caller-defined: run time, flags */
} fp_rec_t;
static_assert(sizeof(fp_rec_t) == 24, "record header is 24 bytes");

typedef struct {
    fp_a64 head; /* consumer-owned */
    char _pad0[56];
    fp_a64 tail; /* producer-owned */
    char _pad1[56];
    fp_event_t data;  /* the consumer parks here, waiting for records */
    fp_event_t space; /* the producer parks here, waiting for room */
    char _pad2[48];
    uint64_t capacity; /* bytes in data[], a multiple of 8 */
    uint64_t pushed;   /* producer-private counter, for stats */
    char _pad3[48];
} fp_ring_t;
static_assert(sizeof(fp_ring_t) == 256, "ring header is 256 bytes");
static_assert(offsetof(fp_ring_t, tail) == 64, "tail on its own cache line");

static inline unsigned char *fp_ring_data(fp_ring_t *r) { return (unsigned char *)r + sizeof(fp_ring_t); }

static inline uint64_t fp_rec_size(uint64_t len) { return sizeof(fp_rec_t) + ((len + 7u) & ~(uint64_t)7u); }

/* capacity/2 so an empty ring always fits one; UINT32_MAX because len is 32-bit. */
static inline uint64_t fp_ring_max_record(const fp_ring_t *r)
{
    uint64_t m = r->capacity / 2 - sizeof(fp_rec_t);
    return m > UINT32_MAX ? UINT32_MAX : m;
}

/* Only while neither side is running (a fresh board, or a dead peer). */
static inline void fp_ring_init(fp_ring_t *r, uint64_t capacity)
{
    memset(r, 0, sizeof(*r));
    r->capacity = capacity;
}

static inline void fp_ring_reset(fp_ring_t *r)
{
    fp_store64_relaxed(&r->head, 0);
    fp_store64_relaxed(&r->tail, 0);
    fp_store32_relaxed(&r->data.waiters, 0);
    fp_store32_relaxed(&r->space.waiters, 0);
    fp_fence_seqcst();
}

static inline int fp_ring_empty(fp_ring_t *r)
{
    return fp_load64_acquire(&r->tail) == fp_load64_relaxed(&r->head);
}

/* Producer: reserves room for a record of len payload bytes.  On FP_OK,
 * *payload points where the caller writes; fp_ring_commit publishes it. */
typedef struct {
    uint64_t pos;  /* where the record starts (monotonic) */
    uint64_t skip; /* bytes skipped before it (PAD) */
    uint32_t len;
} fp_resv_t;

static inline int fp_ring_reserve(fp_ring_t *r, uint64_t len, fp_resv_t *out, unsigned char **payload)
{
    uint64_t cap = r->capacity;
    if (len > fp_ring_max_record(r))
        return FP_TOOBIG;
    uint64_t need = fp_rec_size(len);
    uint64_t tail = fp_load64_relaxed(&r->tail);
    uint64_t head = fp_load64_acquire(&r->head);
    uint64_t off = tail % cap;
    uint64_t to_end = cap - off;
    uint64_t skip = 0;
    if (need > to_end)
        skip = to_end;
    else if (head == tail && off != 0 && need <= off)
        skip = to_end; /* empty: restart at offset 0, where the pages are warm */
    if (tail + skip + need - head > cap)
        return FP_AGAIN;
    out->pos = tail + skip;
    out->skip = skip;
    out->len = (uint32_t)len;
    *payload = fp_ring_data(r) + (out->pos % cap) + sizeof(fp_rec_t);
    return FP_OK;
}

static inline void fp_ring_commit(fp_ring_t *r, const fp_resv_t *res, uint32_t kind, uint64_t task_id,
                                  uint64_t aux)
{
    uint64_t cap = r->capacity;
    unsigned char *data = fp_ring_data(r);
    if (res->skip >= sizeof(fp_rec_t)) {
        fp_rec_t *pad = (fp_rec_t *)(data + (res->pos - res->skip) % cap);
        pad->len = (uint32_t)(res->skip - sizeof(fp_rec_t));
        pad->kind = FP_REC_PAD;
        pad->task_id = 0;
        pad->aux = 0;
    }
    fp_rec_t *rec = (fp_rec_t *)(data + res->pos % cap);
    rec->len = res->len;
    rec->kind = kind;
    rec->task_id = task_id;
    rec->aux = aux;
    r->pushed++;
    fp_store64_release(&r->tail, res->pos + fp_rec_size(res->len)); /* publish */
    fp_event_notify(&r->data);
}

static inline int fp_ring_push(fp_ring_t *r, uint32_t kind, uint64_t task_id, uint64_t aux,
                               const void *payload, uint64_t len)
{
    fp_resv_t res;
    unsigned char *dst;
    int rc = fp_ring_reserve(r, len, &res, &dst);
    if (rc != FP_OK)
        return rc;
    if (len)
        memcpy(dst, payload, len);
    fp_ring_commit(r, &res, kind, task_id, aux);
    return FP_OK;
}

/* Consumer: finds the next record without consuming it.  *next is the
 * position to hand to fp_ring_release once the payload has been read. */
static inline int fp_ring_peek(fp_ring_t *r, fp_rec_t **rec, uint64_t *next)
{
    uint64_t cap = r->capacity;
    uint64_t head = fp_load64_relaxed(&r->head);
    uint64_t tail = fp_load64_acquire(&r->tail);
    while (head < tail) {
        uint64_t off = head % cap;
        if (cap - off < sizeof(fp_rec_t)) {
            head += cap - off;
            continue;
        }
        fp_rec_t *h = (fp_rec_t *)(fp_ring_data(r) + off);
        uint64_t size = fp_rec_size(h->len);
        if (size > cap - off || head + size > tail)
            return FP_CORRUPT;
        if (h->kind == FP_REC_PAD) {
            head += size;
            continue;
        }
        *rec = h;
        *next = head + size;
        return FP_OK;
    }
    return FP_AGAIN;
}

static inline void fp_ring_release(fp_ring_t *r, uint64_t next)
{
    fp_store64_release(&r->head, next);
    fp_event_notify(&r->space);
}

#endif /* FP_RING_H */
