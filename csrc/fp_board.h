/* The pool's shared segment: one header, one word block per worker slot, and
 * two rings per slot (tasks in, results out).
 *
 *   offset 0      fp_board_t   magic, version, sizes, the parent's eventcount
 *   4096          fp_slot_t[n] one 512-byte block per worker slot
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
#define FP_BOARD_VERSION 4u
#define FP_PAGE 4096u
#define FP_BOARD_MAX_SLOTS 1023u              /* the arena's process table holds 1 + slots */

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
    fp_a32 parent_cpu; /* fp_cpu_tag of the parent's last wait: a spin hint for workers */
    char _pad1[48];
    fp_a64 counters[8];
} fp_board_t;
static_assert(sizeof(fp_board_t) <= FP_PAGE, "board header fits its page");

/* Cancel-before-start requests a slot remembers.  Each queued task gets at
 * most one, but they may come in any order, so the latest 2 * depth - 1
 * requests must all still be there: 32 covers the deepest prefetch (16). */
#define FP_SKIP_WORDS 32u

typedef struct {
    fp_a32 state;
    fp_a32 pid;
    fp_a32 generation; /* bumped by the parent each time the slot is reset */
    fp_a32 cpu;        /* fp_cpu_tag of the worker's last take or wait: a spin hint only */
    fp_a64 current;    /* task being run, 0 when idle; set BEFORE the ring advances */
    fp_a64 heartbeat;  /* bumped by the worker's heartbeat thread */
    fp_a64 served;     /* tasks completed by this process */
    fp_a64 cancel_id;  /* a cooperative cancel request for the running task */
    fp_a64 skip_seq;   /* cancel-before-start requests so far (0: none ever) */
    fp_a64 skip[FP_SKIP_WORDS]; /* the latest requests, by task */
    fp_a32 beat_parked; /* the worker's heartbeat thread sleeps on it while the worker idles */
    fp_a32 _r0;
    char _pad[192];
} fp_slot_t;
static_assert(sizeof(fp_slot_t) == 512, "slot block is 512 bytes");

/* Slot words: every access goes through these, so Cython never names a field. */
static inline void fp_slot_reset(fp_slot_t *s)
{
    fp_store64_release(&s->current, 0);
    fp_store64_release(&s->cancel_id, 0);
    fp_store64_release(&s->served, 0);
    fp_store64_release(&s->heartbeat, 0);
    fp_store64_release(&s->skip_seq, 0);
    for (uint32_t i = 0; i < FP_SKIP_WORDS; i++)
        fp_store64_release(&s->skip[i], 0);
    fp_store32_release(&s->pid, 0);
    fp_store32_relaxed(&s->cpu, 0);
    fp_store32_relaxed(&s->beat_parked, 0);
    fp_store32_release(&s->state, FP_SLOT_EMPTY);
    fp_add32_seqcst(&s->generation, 1);
}

static inline void fp_slot_info(fp_slot_t *s, uint32_t *state, uint32_t *pid, uint64_t *current,
                                uint64_t *heartbeat, uint64_t *served)
{
    *state = fp_load32_acquire(&s->state);
    *pid = fp_load32_acquire(&s->pid);
    *current = fp_load64_acquire(&s->current);
    *heartbeat = fp_load64_acquire(&s->heartbeat);
    *served = fp_load64_acquire(&s->served);
}

static inline uint64_t fp_slot_current(fp_slot_t *s) { return fp_load64_seqcst(&s->current); }

static inline void fp_slot_set_state(fp_slot_t *s, uint32_t state, uint32_t pid)
{
    if (pid)
        fp_store32_release(&s->pid, pid);
    fp_store32_release(&s->state, state);
}

static inline void fp_slot_beat(fp_slot_t *s) { fp_add64_relaxed(&s->heartbeat, 1); }

/* The worker takes a task: current first (seq_cst, the Dekker half that pairs
 * with fp_slot_skip), then the skip requests.  Returns 1 when the parent asked
 * to drop this task before it started: the caller must not run it. */
static inline int fp_slot_start(fp_slot_t *s, uint64_t task)
{
    fp_store32_relaxed(&s->cpu, fp_cpu_tag()); /* where the parent's wait will look */
    fp_store64_seqcst(&s->current, task);
    if (fp_load32_seqcst(&s->beat_parked)) { /* Dekker with fp_slot_park_beat */
        fp_store32_release(&s->beat_parked, 0);
        fp_futex_wake(&s->beat_parked, 1);
    }
    if (fp_load64_seqcst(&s->skip_seq) == 0)
        return 0;
    for (uint32_t i = 0; i < FP_SKIP_WORDS; i++)
        if (fp_load64_seqcst(&s->skip[i]) == task)
            return 1;
    return 0;
}

/* The worker's heartbeat thread, while its worker idles: sleeps until the
 * worker takes a task (fp_slot_start wakes it) or timeout_ns, so an idle worker
 * wakes nobody.  It parks only if no task is current and served is still what
 * it saw (a task that came and went since then: beat again first).  Returns
 * 1 if it slept.  The parent times heartbeats only while a task is held, from
 * the moment it saw that task (see _watch.liveness_kill). */
static inline int fp_slot_park_beat(fp_slot_t *s, uint64_t served_seen, int64_t timeout_ns)
{
    int slept = 0;
    fp_add32_seqcst(&s->beat_parked, 1); /* then current: pairs with fp_slot_start */
    if (fp_load64_seqcst(&s->current) == 0 && fp_load64_acquire(&s->served) == served_seen) {
        fp_futex_wait(&s->beat_parked, 1, timeout_ns);
        slept = 1;
    }
    fp_store32_release(&s->beat_parked, 0);
    return slept;
}

/* Whether the worker's heartbeat thread sleeps now (diagnostics, tests). */
static inline int fp_slot_beat_parked(fp_slot_t *s)
{
    return fp_load32_acquire(&s->beat_parked) != 0;
}

/* The task is over (run or skipped): idle again. */
static inline void fp_slot_finish(fp_slot_t *s, int ran)
{
    if (ran)
        fp_add64_relaxed(&s->served, 1);
    fp_store64_release(&s->current, 0);
}

/* The parent asks the worker to drop a task it holds but may not have started.
 * seq is the parent's own count of requests to this slot (never read back from
 * shared memory).  Returns 0 if the worker is running the task now.  Returns 1
 * otherwise: the worker has not started it and will skip it, or it finished
 * already (its result is published before current changes, so the caller
 * tells the two apart by the record it reads for the task: SKIPPED or not). */
static inline int fp_slot_skip(fp_slot_t *s, uint64_t seq, uint64_t task)
{
    fp_store64_seqcst(&s->skip[seq % FP_SKIP_WORDS], task);
    fp_store64_seqcst(&s->skip_seq, seq + 1);
    return fp_load64_seqcst(&s->current) != task;
}

static inline void fp_slot_request_cancel(fp_slot_t *s, uint64_t task)
{
    fp_store64_release(&s->cancel_id, task);
}

static inline int fp_slot_cancel_requested(fp_slot_t *s)
{
    uint64_t c = fp_load64_acquire(&s->cancel_id);
    return c != 0 && c == fp_load64_acquire(&s->current);
}

static inline uint64_t fp_align_page(uint64_t n)
{
    return (n + FP_PAGE - 1) & ~(uint64_t)(FP_PAGE - 1);
}

static inline uint64_t fp_board_ring_stride(uint64_t cap)
{
    return fp_align_page(sizeof(fp_ring_t) + cap);
}

static inline uint64_t fp_board_rings_offset(uint32_t nslots)
{
    return fp_align_page(FP_PAGE + (uint64_t)nslots * sizeof(fp_slot_t));
}

/* 0 when the geometry is out of range (so no size can wrap). */
static inline uint64_t fp_board_size(uint32_t nslots, uint64_t cap)
{
    if (nslots == 0 || nslots > FP_BOARD_MAX_SLOTS || !fp_ring_capacity_ok(cap) ||
        cap > FP_RING_MAX_CAPACITY)
        return 0;
    return fp_board_rings_offset(nslots) + 2ull * nslots * fp_board_ring_stride(cap);
}

/* One process's private view of a board: the geometry it created or checked
 * once at attach, and a ring view per slot and direction, all in process
 * memory.  Nothing below re-reads a size, a count or an offset from the
 * shared segment. */
typedef struct {
    fp_board_t *b;
    uint64_t size;
    uint32_t nslots;
    uint64_t cap;
    fp_ringv_t *tasks;   /* [nslots]: the parent produces, the worker consumes */
    fp_ringv_t *results; /* [nslots]: the worker produces, the parent consumes */
    fp_a32 want;         /* parent threads driving now: the collector thread stays away.
                          * Private: a word in the segment, one stray write away from a
                          * count that never returns to 0, stalled the collector for good
                          *. */
} fp_boardv_t;

static inline fp_slot_t *fp_boardv_slot(const fp_boardv_t *v, uint32_t i)
{
    return (fp_slot_t *)((unsigned char *)v->b + FP_PAGE) + i;
}

static inline fp_ringv_t *fp_boardv_tasks(const fp_boardv_t *v, uint32_t i) { return &v->tasks[i]; }
static inline fp_ringv_t *fp_boardv_results(const fp_boardv_t *v, uint32_t i)
{
    return &v->results[i];
}
static inline fp_board_t *fp_boardv_board(const fp_boardv_t *v) { return v->b; }

/* Non-ring work for the parent (a death, a kick), and (in the parent's own view)
 * the parent threads that drive now: the collector thread stays away while any does. */
static inline void fp_board_flag_attention(fp_board_t *b)
{
    fp_store32_release(&b->attention, 1);
    fp_event_kick(&b->done);
}
static inline int fp_board_take_attention(fp_board_t *b)
{
    return fp_xchg32_acqrel(&b->attention, 0) != 0;
}
/* A kick is sticky (attention): a thread that checked its loop's condition (the pool
 * torn down, shut down) just before the kick, and parks just after it, sees it in
 * has_work and returns at once instead of sleeping out its timeout (the collector's
 * idle park is 30 s: teardown's join of it gave up after 5 s and left the board mapped). */
static inline void fp_board_kick(fp_board_t *b) { fp_board_flag_attention(b); }
static inline void fp_boardv_want(fp_boardv_t *v, int delta)
{
    if (delta > 0)
        fp_add32_seqcst(&v->want, 1);
    else
        fp_sub32_seqcst(&v->want, 1);
}
static inline int fp_boardv_wanted(fp_boardv_t *v) { return fp_load32_acquire(&v->want) != 0; }

static inline fp_ring_t *fp_board_ring_at(fp_board_t *b, uint32_t nslots, uint64_t cap, uint32_t i,
                                          int dir)
{
    uint64_t off =
        fp_board_rings_offset(nslots) + (2ull * i + (uint64_t)dir) * fp_board_ring_stride(cap);
    return (fp_ring_t *)((unsigned char *)b + off);
}

/* Fills v from geometry this process knows (tasks/results arrays supplied by
 * the caller, nslots each).  parent: 1 in the pool's process, 0 in a worker. */
static inline int fp_boardv_init(fp_boardv_t *v, fp_board_t *b, uint64_t mapped, uint32_t nslots,
                                 uint64_t cap, fp_ringv_t *tasks, fp_ringv_t *results, int parent)
{
    uint64_t size = fp_board_size(nslots, cap);
    if (size == 0 || size > mapped)
        return FP_CORRUPT;
    v->b = b;
    v->size = size;
    v->nslots = nslots;
    v->cap = cap;
    v->tasks = tasks;
    v->results = results;
    fp_store32_relaxed(&v->want, 0);
    for (uint32_t i = 0; i < nslots; i++) {
        if (fp_ringv_init(&tasks[i], fp_board_ring_at(b, nslots, cap, i, 0), cap,
                          parent) != FP_OK ||
            fp_ringv_init(&results[i], fp_board_ring_at(b, nslots, cap, i, 1), cap,
                          !parent) != FP_OK)
            return FP_CORRUPT;
    }
    return FP_OK;
}

/* On a zero-filled mapping of fp_board_size(nslots, cap) bytes. */
static inline int fp_board_init(fp_board_t *b, uint32_t nslots, uint64_t cap)
{
    uint64_t size = fp_board_size(nslots, cap);
    if (size == 0)
        return FP_CORRUPT;
    b->nslots = nslots;
    b->ring_capacity = cap;
    b->total_size = size;
    b->version = FP_BOARD_VERSION;
    for (uint32_t i = 0; i < nslots; i++) {
        fp_ring_init(fp_board_ring_at(b, nslots, cap, i, 0), cap);
        fp_ring_init(fp_board_ring_at(b, nslots, cap, i, 1), cap);
    }
    fp_fence_seqcst();
    b->magic = FP_BOARD_MAGIC; /* last: an attach never sees a half-made board */
    return FP_OK;
}

/* The parent rewrites the header from its own geometry before each worker
 * starts: a worker that scribbled over it cannot keep its replacements from
 * attaching. */
static inline void fp_boardv_restore_header(const fp_boardv_t *v)
{
    fp_board_t *b = v->b;
    b->nslots = v->nslots;
    b->ring_capacity = v->cap;
    b->total_size = v->size;
    b->version = FP_BOARD_VERSION;
    fp_fence_seqcst();
    b->magic = FP_BOARD_MAGIC;
}

/* A worker's attach: the header is read once into *nslots and *cap, and the
 * copy is what gets checked (and used from then on). */
static inline int fp_board_check(const fp_board_t *b, uint64_t mapped, uint32_t *nslots,
                                 uint64_t *cap)
{
    const volatile fp_board_t *h = (const volatile fp_board_t *)b;
    if (mapped < sizeof(fp_board_t))
        return FP_CORRUPT;
    uint64_t magic = h->magic;
    uint32_t version = h->version, n = h->nslots;
    uint64_t c = h->ring_capacity, total = h->total_size;
    if (magic != FP_BOARD_MAGIC || version != FP_BOARD_VERSION)
        return FP_CORRUPT;
    uint64_t size = fp_board_size(n, c);
    if (size == 0 || total != size || size > mapped)
        return FP_CORRUPT;
    *nslots = n;
    *cap = c;
    return FP_OK;
}

/* Any result ring non-empty, or non-ring work flagged for the parent. */
static inline int fp_boardv_parent_has_work(const fp_boardv_t *v)
{
    if (fp_load32_acquire(&v->b->attention))
        return 1;
    for (uint32_t i = 0; i < v->nslots; i++)
        if (!fp_ringv_empty(&v->results[i]))
            return 1;
    return 0;
}

/* Where the workers the parent waits for (those running or holding a task)
 * last ran, against the parent's CPU now, which it publishes for the workers'
 * waits.  The slot words are the workers' to write: a wrong one only makes the
 * parent spin or park when it should not (time, never correctness). */
static inline int fp_boardv_parent_peer(const fp_boardv_t *v)
{
    uint32_t mine = fp_cpu_tag();
    int where = FP_PEER_UNKNOWN;
    fp_store32_relaxed(&v->b->parent_cpu, mine);
    for (uint32_t i = 0; i < v->nslots; i++) {
        fp_slot_t *s = fp_boardv_slot(v, i);
        if (fp_load64_relaxed(&s->current) == 0 && fp_ringv_head(&v->tasks[i]) == v->tasks[i].pos)
            continue; /* idle: the parent does not wait for it */
        int w = fp_peer_where(mine, fp_load32_relaxed(&s->cpu));
        if (w == FP_PEER_OTHER)
            return w; /* one busy worker elsewhere can answer while we spin */
        if (w == FP_PEER_SAME)
            where = w;
    }
    return where;
}

/* Did slot i's worker last run on CPU tag mine (the caller's, from fp_cpu_tag)?
 * A task pushed to it then wakes it where it preempts the caller.  The word is
 * the worker's: a wrong one only sends a task to a worse place (time only). */
static inline int fp_boardv_worker_on(const fp_boardv_t *v, uint32_t i, uint32_t mine)
{
    return mine != 0 && fp_load32_relaxed(&fp_boardv_slot(v, i)->cpu) == mine;
}

/* The parent's wait for results: spin up to spin_ns, then park on the
 * board's eventcount until timeout_ns.  Returns 1 if there is work. */
static inline int fp_boardv_wait_results(const fp_boardv_t *v, int64_t timeout_ns, int64_t spin_ns)
{
    fp_spin_t sp;
    fp_spin_init(&sp, spin_ns > 0 ? fp_boardv_parent_peer(v) : FP_PEER_UNKNOWN);
    int64_t start = sp.start;
    while (sp.now - start < spin_ns) {
        if (fp_boardv_parent_has_work(v))
            return 1;
        fp_spin_step(&sp);
    }
    fp_event_t *done = &v->b->done;
    uint32_t key = fp_event_prepare(done);
    int has = fp_boardv_parent_has_work(v);
    if (!has) {
        int64_t left = timeout_ns - (fp_now_ns() - start);
        if (left > 0)
            fp_event_wait(done, key, left);
        has = fp_boardv_parent_has_work(v);
    }
    fp_event_finish(done);
    return has;
}

/* The worker's wait for its next task: publishes its CPU, reads the parent's
 * (a hint: see fp_boardv_parent_peer), and waits as fp_ringv_wait_data. */
static inline int fp_boardv_wait_task(const fp_boardv_t *v, uint32_t slot, int64_t timeout_ns,
                                      int64_t spin_ns)
{
    int peer = FP_PEER_UNKNOWN;
    if (spin_ns > 0) {
        uint32_t mine = fp_cpu_tag();
        fp_store32_relaxed(&fp_boardv_slot(v, slot)->cpu, mine);
        peer = fp_peer_where(mine, fp_load32_relaxed(&v->b->parent_cpu));
    }
    return fp_ringv_wait_data(&v->tasks[slot], NULL, timeout_ns, spin_ns, peer);
}

/* Results are published: wake the parent if it is parked. */
static inline void fp_board_notify_parent(fp_board_t *b) { fp_event_notify(&b->done); }

#endif /* FP_BOARD_H */
