/* The pool's shared segment: one header, one word block per worker slot, and
 * two rings per slot (tasks in, results out).
 *
 *   offset 0      fp_board_t   magic, version, sizes, the parent's eventcount
 *   4096          fp_slot_t[n] one 256-byte block per worker slot
 *   page-aligned  slot 0: task ring (256 B header + ring_capacity)
 *                         result ring (256 B header + ring_capacity)
 *                 slot 1: ...
 *
 * The segment is a memfd: sparse (untouched ring pages cost nothing), never
 * named in /dev/shm, and gone when the last process that maps it exits, so a
 * crashed parent cannot leak it.  Layout changes bump FP_BOARD_VERSION.
 */
#ifndef FP_BOARD_H
#define FP_BOARD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fp_atomic.h"
#include "fp_futex.h"
#include "fp_ring.h"
#include "fp_status.h"

#define FP_BOARD_MAGIC 0x4c4f4f5054534146ULL /* "FASTPOOL" */
#define FP_BOARD_VERSION 1u
#define FP_PAGE 4096u

/* Worker slot states, written by the worker (and reset by the parent). */
enum { FP_SLOT_EMPTY = 0, FP_SLOT_STARTING = 1, FP_SLOT_READY = 2, FP_SLOT_EXITING = 3 };

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t nslots;
    uint64_t ring_capacity;
    uint64_t total_size;
    char _pad0[32];
    fp_event_t done;  /* the parent parks here for results from any slot */
    fp_a32 attention; /* non-zero: the parent has non-ring work (a death, a kick) */
    fp_a32 want;      /* parent threads driving now: the collector thread stays away */
    char _pad1[48];
    fp_a64 counters[8];
} fp_board_t;
static_assert(sizeof(fp_board_t) <= FP_PAGE, "board header fits its page");

typedef struct {
    fp_a32 state;
    fp_a32 pid;
    fp_a32 generation; /* bumped by the parent each time the slot is reset */
    fp_a32 cancel;     /* task id low bits the parent asked to cancel cooperatively */
    fp_a64 current;    /* task id being run, 0 when idle; set BEFORE the ring advances */
    fp_a64 heartbeat;  /* bumped by the worker's heartbeat thread */
    fp_a64 served;     /* tasks completed by this process */
    fp_a64 cancel_id;  /* full task id of a cooperative cancel request */
    char _pad[208];
} fp_slot_t;
static_assert(sizeof(fp_slot_t) == 256, "slot block is 256 bytes");

static inline uint64_t fp_align_page(uint64_t n) { return (n + FP_PAGE - 1) & ~(uint64_t)(FP_PAGE - 1); }

static inline uint64_t fp_board_ring_stride(uint64_t cap) { return fp_align_page(sizeof(fp_ring_t) + cap); }

static inline uint64_t fp_board_rings_offset(uint32_t nslots)
{
    return fp_align_page(FP_PAGE + (uint64_t)nslots * sizeof(fp_slot_t));
}

static inline uint64_t fp_board_size(uint32_t nslots, uint64_t cap)
{
    return fp_board_rings_offset(nslots) + 2ull * nslots * fp_board_ring_stride(cap);
}

static inline fp_slot_t *fp_board_slot(fp_board_t *b, uint32_t i)
{
    return (fp_slot_t *)((unsigned char *)b + FP_PAGE) + i;
}

/* dir 0: tasks (parent -> worker), dir 1: results (worker -> parent) */
static inline fp_ring_t *fp_board_ring(fp_board_t *b, uint32_t i, int dir)
{
    uint64_t off = fp_board_rings_offset(b->nslots) + (2ull * i + (uint64_t)dir) * fp_board_ring_stride(b->ring_capacity);
    return (fp_ring_t *)((unsigned char *)b + off);
}

/* On a zero-filled mapping of fp_board_size(nslots, cap) bytes. */
static inline int fp_board_init(fp_board_t *b, uint32_t nslots, uint64_t cap)
{
    if (cap < 4096 || cap % 8 != 0 || nslots == 0)
        return FP_CORRUPT;
    b->nslots = nslots;
    b->ring_capacity = cap;
    b->total_size = fp_board_size(nslots, cap);
    b->version = FP_BOARD_VERSION;
    for (uint32_t i = 0; i < nslots; i++) {
        fp_ring_init(fp_board_ring(b, i, 0), cap);
        fp_ring_init(fp_board_ring(b, i, 1), cap);
    }
    fp_fence_seqcst();
    b->magic = FP_BOARD_MAGIC; /* last: an attach never sees a half-made board */
    return FP_OK;
}

static inline int fp_board_check(const fp_board_t *b, uint64_t mapped)
{
    if (mapped < sizeof(fp_board_t) || b->magic != FP_BOARD_MAGIC || b->version != FP_BOARD_VERSION)
        return FP_CORRUPT;
    if (b->total_size != fp_board_size(b->nslots, b->ring_capacity) || b->total_size > mapped)
        return FP_CORRUPT;
    return FP_OK;
}

/* Any result ring non-empty, or non-ring work flagged for the parent. */
static inline int fp_board_parent_has_work(fp_board_t *b)
{
    if (fp_load32_acquire(&b->attention))
        return 1;
    for (uint32_t i = 0; i < b->nslots; i++)
        if (!fp_ring_empty(fp_board_ring(b, i, 1)))
            return 1;
    return 0;
}

/* The parent's wait for results: spin up to spin_ns, then park on the
 * board's eventcount until timeout_ns.  Returns 1 if there is work. */
static inline int fp_board_wait_results(fp_board_t *b, int64_t timeout_ns, int64_t spin_ns)
{
    int64_t start = fp_now_ns();
    int64_t now = start;
    unsigned spins = 0;
    while (now - start < spin_ns) {
        if (fp_board_parent_has_work(b))
            return 1;
        fp_cpu_relax();
        if ((++spins & 63u) == 0)
            now = fp_now_ns();
    }
    uint32_t key = fp_event_prepare(&b->done);
    int has = fp_board_parent_has_work(b);
    if (!has) {
        int64_t left = timeout_ns - (fp_now_ns() - start);
        if (left > 0)
            fp_event_wait(&b->done, key, left);
        has = fp_board_parent_has_work(b);
    }
    fp_event_finish(&b->done);
    return has;
}

/* The worker's wait for a task on its own ring (same shape). */
static inline int fp_ring_wait_data(fp_ring_t *r, fp_a32 *stop, int64_t timeout_ns, int64_t spin_ns)
{
    int64_t start = fp_now_ns();
    int64_t now = start;
    unsigned spins = 0;
    while (now - start < spin_ns) {
        if (!fp_ring_empty(r) || (stop && fp_load32_acquire(stop)))
            return 1;
        fp_cpu_relax();
        if ((++spins & 63u) == 0)
            now = fp_now_ns();
    }
    uint32_t key = fp_event_prepare(&r->data);
    int has = !fp_ring_empty(r) || (stop && fp_load32_acquire(stop));
    if (!has) {
        int64_t left = timeout_ns - (fp_now_ns() - start);
        if (left > 0)
            fp_event_wait(&r->data, key, left);
        has = !fp_ring_empty(r) || (stop && fp_load32_acquire(stop));
    }
    fp_event_finish(&r->data);
    return has;
}

/* The worker's wait for room in its result ring: sleeps until the parent
 * consumes something (head moves past seen_head) or timeout_ns passes. */
static inline int fp_ring_wait_space(fp_ring_t *r, uint64_t seen_head, int64_t timeout_ns)
{
    uint32_t key = fp_event_prepare(&r->space);
    int moved = fp_load64_acquire(&r->head) != seen_head;
    if (!moved) {
        fp_event_wait(&r->space, key, timeout_ns);
        moved = fp_load64_acquire(&r->head) != seen_head;
    }
    fp_event_finish(&r->space);
    return moved;
}

/* Results are published: wake the parent if it is parked. */
static inline void fp_board_notify_parent(fp_board_t *b) { fp_event_notify(&b->done); }

#endif /* FP_BOARD_H */
