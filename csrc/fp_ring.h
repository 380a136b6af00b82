/* Single-producer single-consumer ring of variable-length records.
 *
 * One ring carries one direction between the parent and one worker, so every
 * ring has exactly one writer and one reader and needs no lock: a process
 * killed on any instruction leaves at worst an unpublished record, never a
 * held lock (the multiprocessing.Queue / pebble #163 wedge cannot happen).
 *
 * Positions are monotonic 64-bit byte counts; the byte offset is pos % capacity.
 *
 *   data: | rec | rec | PAD ....... |      record = fp_rec_t header + payload,
 *          ^head       ^tail                padded to 8 bytes
 *
 * A record never wraps: when it does not fit before the end, the producer
 * writes a PAD record (or leaves < 24 bytes, which the consumer skips) and
 * starts at offset 0.  A PAD always runs to the end of the data, so the
 * consumer skips to the next multiple of the capacity and never reads the
 * PAD's length: nothing in the format is 32-bit but a record's own length.
 * When the ring is empty and the producer is far into it (fp_ring_restart_bytes)
 * it also jumps back to offset 0, so a steady stream of small records keeps
 * touching the same warm pages (first touch of fresh shared pages is what
 * costs, not the copy).  Records are limited to capacity/2 so that an empty
 * ring always fits one.
 *
 * Trust.  The shared header and data are writable by the other process, which
 * runs arbitrary code.  Each side therefore works through an fp_ringv_t, a
 * view in its own memory: the capacity it was created or attached with, and
 * its own position (the producer's tail, the consumer's head), which it
 * publishes but never reads back.  The other side's position and each record
 * header are read once into locals and checked against the view before use;
 * a check that fails is FP_CORRUPT, never a wild read.
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
#define FP_RING_MAX_CAPACITY (8ull << 30) /* 8 GiB: the largest ring_bytes a pool accepts */

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
    uint64_t capacity; /* bytes in data[], a multiple of 8; read only by an attach check */
    uint64_t pushed;   /* producer-private counter, for stats */
    char _pad3[48];
} fp_ring_t;
static_assert(sizeof(fp_ring_t) == 256, "ring header is 256 bytes");
static_assert(offsetof(fp_ring_t, tail) == 64, "tail on its own cache line");

/* One side's private view of a ring (lives in process memory, never shared). */
typedef struct {
    fp_ring_t *hdr;       /* the shared header */
    unsigned char *data;  /* hdr + sizeof(fp_ring_t) */
    uint64_t cap;         /* the capacity this process created or checked */
    uint64_t max_record;  /* largest payload: cap/2 - header, at most UINT32_MAX */
    uint64_t pos;         /* this side's own position: tail (producer) or head (consumer) */
} fp_ringv_t;

static inline unsigned char *fp_ring_data(fp_ring_t *r)
{
    return (unsigned char *)r + sizeof(fp_ring_t);
}

static inline uint64_t fp_rec_size(uint64_t len)
{
    return sizeof(fp_rec_t) + ((len + 7u) & ~(uint64_t)7u);
}

/* capacity/2 so an empty ring always fits one; UINT32_MAX because len is 32-bit. */
static inline uint64_t fp_ring_max_record_for(uint64_t cap)
{
    uint64_t m = cap / 2 - sizeof(fp_rec_t);
    return m > UINT32_MAX ? UINT32_MAX : m;
}

static inline int fp_ring_capacity_ok(uint64_t cap) { return cap >= 4096 && cap % 8 == 0; }

/* An empty ring restarts at offset 0 only once the producer is this far in:
 * a steady stream of small records then keeps to the first megabyte of warm
 * pages, and the restart (whose skipped bytes stay in use until the consumer
 * passes them) still leaves at least this much room, so a producer can queue
 * many records ahead of its consumer right after one. */
static inline uint64_t fp_ring_restart_bytes(uint64_t cap)
{
    return cap / 2 < (1u << 20) ? cap / 2 : (1u << 20);
}

/* Only while neither side is running (a fresh board, or a dead peer). */
static inline void fp_ring_init(fp_ring_t *r, uint64_t capacity)
{
    memset(r, 0, sizeof(*r));
    r->capacity = capacity;
}

/* A view on a ring of known capacity; pos starts from the shared position of
 * this side (0 on a fresh or reset ring).  dir_producer: 1 for the producer. */
static inline int fp_ringv_init(fp_ringv_t *v, fp_ring_t *r, uint64_t cap, int producer)
{
    if (!fp_ring_capacity_ok(cap))
        return FP_CORRUPT;
    v->hdr = r;
    v->data = fp_ring_data(r);
    v->cap = cap;
    v->max_record = fp_ring_max_record_for(cap);
    v->pos = producer ? fp_load64_acquire(&r->tail) : fp_load64_acquire(&r->head);
    return FP_OK;
}

/* Both positions to zero (only while the peer is dead or not started). */
static inline void fp_ringv_reset(fp_ringv_t *v)
{
    fp_store64_relaxed(&v->hdr->head, 0);
    fp_store64_relaxed(&v->hdr->tail, 0);
    fp_store32_relaxed(&v->hdr->data.waiters, 0);
    fp_store32_relaxed(&v->hdr->space.waiters, 0);
    v->pos = 0;
    fp_fence_seqcst();
}

/* Consumer: is there nothing to read? (tail is the producer's; any change counts) */
static inline int fp_ringv_empty(fp_ringv_t *v)
{
    return fp_load64_acquire(&v->hdr->tail) == v->pos;
}

static inline void *fp_ringv_header(fp_ringv_t *v) { return v->hdr; }

/* Producer: the consumer's head as published (for fp_ringv_wait_space). */
static inline uint64_t fp_ringv_head(fp_ringv_t *v) { return fp_load64_acquire(&v->hdr->head); }

/* Producer: reserves room for a record of len payload bytes.  On FP_OK,
 * *payload points where the caller writes; fp_ringv_commit publishes it. */
typedef struct {
    uint64_t pos;  /* where the record starts (monotonic) */
    uint64_t skip; /* bytes skipped before it (PAD) */
    uint32_t len;
} fp_resv_t;

static inline int fp_ringv_reserve(fp_ringv_t *v, uint64_t len, fp_resv_t *out,
                                   unsigned char **payload)
{
    uint64_t cap = v->cap;
    if (len > v->max_record)
        return FP_TOOBIG;
    uint64_t need = fp_rec_size(len);
    uint64_t tail = v->pos;
    uint64_t head = fp_load64_acquire(&v->hdr->head); /* the consumer's: read once, checked */
    if (tail - head > cap)
        return FP_CORRUPT; /* head ahead of tail, or more than a ring behind it */
    uint64_t off = tail % cap;
    uint64_t to_end = cap - off;
    uint64_t skip = 0;
    if (need > to_end)
        skip = to_end;
    else if (head == tail && off >= fp_ring_restart_bytes(cap) && need <= off / 4)
        skip = to_end; /* empty and far in: restart at offset 0, where the pages are warm */
    if (skip + need > cap - (tail - head))
        return FP_AGAIN;
    out->pos = tail + skip;
    out->skip = skip;
    out->len = (uint32_t)len;
    *payload = v->data + (out->pos % cap) + sizeof(fp_rec_t);
    return FP_OK;
}

/* Publishes a reserved record.  notify: wake a parked consumer now (0 lets the
 * caller batch several records behind one fp_ringv_notify). */
static inline void fp_ringv_commit(fp_ringv_t *v, const fp_resv_t *res, uint32_t kind,
                                   uint64_t task_id, uint64_t aux, int notify)
{
    uint64_t cap = v->cap;
    if (res->skip >= sizeof(fp_rec_t)) {
        fp_rec_t *pad = (fp_rec_t *)(v->data + (res->pos - res->skip) % cap);
        pad->len = 0; /* unused: a PAD always runs to the end of the data */
        pad->kind = FP_REC_PAD;
        pad->task_id = 0;
        pad->aux = 0;
    }
    fp_rec_t *rec = (fp_rec_t *)(v->data + res->pos % cap);
    rec->len = res->len;
    rec->kind = kind;
    rec->task_id = task_id;
    rec->aux = aux;
    v->hdr->pushed++;
    v->pos = res->pos + fp_rec_size(res->len);
    fp_store64_release(&v->hdr->tail, v->pos); /* publish */
    if (notify)
        fp_event_notify(&v->hdr->data);
}

static inline void fp_ringv_notify(fp_ringv_t *v) { fp_event_notify(&v->hdr->data); }

/* Gathers up to two buffers into one record (a function's pickle and its
 * arguments' travel separately, so neither is concatenated in Python). */
static inline int fp_ringv_push2(fp_ringv_t *v, uint32_t kind, uint64_t task_id, uint64_t aux,
                                 const void *a, uint64_t alen, const void *b, uint64_t blen,
                                 int notify)
{
    fp_resv_t res;
    unsigned char *dst;
    if (alen > v->max_record || blen > v->max_record)
        return FP_TOOBIG; /* before the sum: it could wrap */
    int rc = fp_ringv_reserve(v, alen + blen, &res, &dst);
    if (rc != FP_OK)
        return rc;
    if (alen)
        memcpy(dst, a, alen);
    if (blen)
        memcpy(dst + alen, b, blen);
    fp_ringv_commit(v, &res, kind, task_id, aux, notify);
    return FP_OK;
}

static inline int fp_ringv_push(fp_ringv_t *v, uint32_t kind, uint64_t task_id, uint64_t aux,
                                const void *payload, uint64_t len)
{
    return fp_ringv_push2(v, kind, task_id, aux, payload, len, NULL, 0, 1);
}

/* A record as the consumer read it: every field copied once from shared memory. */
typedef struct {
    uint32_t kind;
    uint32_t len;
    uint64_t task_id;
    uint64_t aux;
    const unsigned char *payload; /* len bytes in the ring: the producer could still change them */
    uint64_t next;                /* the position to hand to fp_ringv_release */
} fp_recv_t;

/* Consumer: finds the next record without consuming it.  FP_AGAIN when the
 * ring is empty, FP_CORRUPT when a position or header breaks the format. */
static inline int fp_ringv_peek(fp_ringv_t *v, fp_recv_t *out)
{
    uint64_t cap = v->cap;
    uint64_t head = v->pos;
    uint64_t tail = fp_load64_acquire(&v->hdr->tail); /* the producer's: read once, checked */
    if (tail - head > cap)
        return FP_CORRUPT;
    /* Each step moves head forward by at least a record header or to the
     * next lap, so a ring of 'cap' bytes is crossed in at most 2 steps per
     * record; PADs and short tails are at most one per lap. */
    while (head != tail) {
        uint64_t off = head % cap;
        uint64_t to_end = cap - off;
        if (to_end < sizeof(fp_rec_t)) {
            if (to_end > tail - head)
                return FP_CORRUPT;
            head += to_end;
            continue;
        }
        const volatile fp_rec_t *h = (const volatile fp_rec_t *)(v->data + off);
        uint32_t kind = h->kind;
        if (kind == FP_REC_PAD) {
            if (to_end > tail - head)
                return FP_CORRUPT;
            head += to_end;
            continue;
        }
        uint32_t len = h->len;
        if (len > v->max_record)
            return FP_CORRUPT;
        uint64_t size = fp_rec_size(len);
        if (size > to_end || size > tail - head)
            return FP_CORRUPT;
        out->kind = kind;
        out->len = len;
        out->task_id = h->task_id;
        out->aux = h->aux;
        out->payload = v->data + off + sizeof(fp_rec_t);
        out->next = head + size;
        if (head != v->pos) { /* skipped a PAD: not yet consumed, but never re-read */
            v->pos = head;
        }
        return FP_OK;
    }
    if (head != v->pos) {
        v->pos = head;
        fp_store64_release(&v->hdr->head, head);
    }
    return FP_AGAIN;
}

static inline void fp_ringv_release(fp_ringv_t *v, uint64_t next)
{
    v->pos = next;
    fp_store64_release(&v->hdr->head, next);
    fp_event_notify(&v->hdr->space);
}

/* The consumer's wait for a record (the worker on its task ring): spin up to
 * spin_ns, then park on the data eventcount until timeout_ns.  A non-NULL
 * stop word that becomes non-zero also ends the wait.  peer: where the
 * producer runs (FP_PEER_*, see fp_spin_init).  Returns 1 if there is
 * something to read. */
static inline int fp_ringv_wait_data(fp_ringv_t *v, fp_a32 *stop, int64_t timeout_ns,
                                     int64_t spin_ns, int peer)
{
    fp_spin_t sp;
    fp_spin_init(&sp, peer);
    int64_t start = sp.start;
    while (sp.now - start < spin_ns) {
        if (!fp_ringv_empty(v) || (stop && fp_load32_acquire(stop)))
            return 1;
        fp_spin_step(&sp);
    }
    fp_event_t *ev = &v->hdr->data;
    uint32_t key = fp_event_prepare(ev);
    int has = !fp_ringv_empty(v) || (stop && fp_load32_acquire(stop));
    if (!has) {
        int64_t left = timeout_ns - (fp_now_ns() - start);
        if (left > 0)
            fp_event_wait(ev, key, left);
        has = !fp_ringv_empty(v) || (stop && fp_load32_acquire(stop));
    }
    fp_event_finish(ev);
    return has;
}

/* The producer's wait for room: sleeps until the consumer moves its head off
 * seen_head or timeout_ns passes.  Returns 1 if the head moved. */
static inline int fp_ringv_wait_space(fp_ringv_t *v, uint64_t seen_head, int64_t timeout_ns)
{
    fp_event_t *ev = &v->hdr->space;
    uint32_t key = fp_event_prepare(ev);
    int moved = fp_load64_acquire(&v->hdr->head) != seen_head;
    if (!moved) {
        fp_event_wait(ev, key, timeout_ns);
        moved = fp_load64_acquire(&v->hdr->head) != seen_head;
    }
    fp_event_finish(ev);
    return moved;
}

#endif /* FP_RING_H */
