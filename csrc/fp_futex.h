/* Bounded wait/wake on a shared 32-bit word, and the eventcount built on it.
 *
 * The eventcount lets a producer skip the wake system call unless a consumer
 * is actually parked: a consumer registers (waiters++), reads the sequence,
 * re-checks its condition and only then sleeps on the sequence word; a
 * producer publishes, fences, and wakes only if waiters > 0.  Either the
 * producer sees the waiter or the consumer sees the data (Dekker). */
#ifndef FP_FUTEX_H
#define FP_FUTEX_H

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

#include "fp_atomic.h"
#include "fp_status.h"

#include <sched.h>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

static inline int64_t fp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Sleeps while *word == expected, at most timeout_ns (always bounded).
 * Shared futex (no FUTEX_PRIVATE_FLAG): the word lives in a MAP_SHARED segment. */
static inline int fp_futex_wait(fp_a32 *word, uint32_t expected, int64_t timeout_ns)
{
#ifdef __linux__
    if (timeout_ns < 0)
        timeout_ns = 0;
    struct timespec ts = {(time_t)(timeout_ns / 1000000000LL), (long)(timeout_ns % 1000000000LL)};
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
    if (rc == 0)
        return FP_OK;
    if (errno == EAGAIN)
        return FP_OK; /* the word had already changed */
    if (errno == ETIMEDOUT)
        return FP_TIMEOUT;
    if (errno == EINTR)
        return FP_INTR;
    return FP_ERRNO;
#else
    (void)word; (void)expected;
    struct timespec ts = {0, timeout_ns > 1000000 ? 1000000 : (long)timeout_ns};
    nanosleep(&ts, NULL);
    return FP_TIMEOUT;
#endif
}

static inline int fp_futex_wake(fp_a32 *word, int n)
{
#ifdef __linux__
    long rc = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, n, NULL, NULL, 0);
    return rc < 0 ? FP_ERRNO : FP_OK;
#else
    (void)word; (void)n;
    return FP_OK;
#endif
}

/* A spinning waiter.  Every 64 steps (a microsecond or two) it reads the clock
 * and yields the CPU.  On an idle machine the yield returns at once.  When the
 * thread it waits for shares its core (likely on two cores: a pool's parent and
 * a worker), the yield hands that thread the core at once; without it each hop
 * waited for a time slice to end (measured here: ~40 us round trips instead
 * of ~3 us, or ~15 us when parent and worker share a core).
 *
 * The yield does not always hand the core over: on a busy host (measured on a
 * 2-vCPU VM under load 7, kernel 6.18) a parent and a worker placed on the same
 * vCPU each spun their whole budget before parking, 80 + 60 us per hop, in
 * about half of the fresh-process rounds.  So the spin adapts, per thread: a
 * spin that ends in a park was wasted and halves this thread's cap (down to no
 * spin at all); a spin that finds its data within the cap keeps it or widens it
 * to twice what it took.  A thread that stopped spinning probes with a short
 * spin every FP_SPIN_PROBE_EVERY waits, so it spins again once the waits get
 * short again (the other side moved to another core, a burst of small tasks).
 * Both spin loops (fp_ringv_wait_data, fp_boardv_wait_results) go to
 * fp_event_prepare when their spin ends without data: that is the miss signal.
 *
 * The adaptive cap cannot tell a wasted spin (partner on this CPU) from a wait
 * that was merely long (a 60 us task, 100 us of parent bookkeeping between
 * tasks): both decayed to no spin, and every hop paid a futex wake.  So each
 * side publishes the CPU it runs on (fp_cpu_tag, a vDSO/rseq read) and a
 * waiter that knows where its partner last ran decides by that instead:
 * FP_PEER_OTHER spins the caller's whole budget, FP_PEER_SAME yields once (the
 * partner may be runnable right here) and parks.  Only FP_PEER_UNKNOWN (no
 * partner has published yet) uses the adaptive cap.  A stale or forged tag
 * costs time, never correctness: the wait after the spin is the same.
 *
 * Where the partner ran does not say whether it runs now, nor whether this
 * thread keeps its own CPU while it spins.  On a busy host (two CPU-bound
 * processes on 2 vCPUs) every spin's yield handed the vCPU to the other
 * process for its whole slice, and a thread that spins is no longer a sleeper
 * the scheduler lets preempt it at wakeup: round trips read 2-4 ms, against
 * 16-46 us with no spin at all.  So a spin that finds the clock jumped between
 * two of its steps (FP_SPIN_PREEMPT_NS: it was off its CPU, someone else's
 * work ran there) stops, and this thread parks at once, without spinning or
 * yielding, for FP_SPIN_CALM_MIN_NS; each spin after that which is preempted
 * again doubles the spell (up to FP_SPIN_CALM_MAX_NS), and a spin that steps
 * without losing its CPU ends it (mutex_spin_on_owner() likewise stops the
 * moment the owner is not on a CPU, and it spins only while it holds its own). */
#define FP_SPIN_FREE INT64_MAX        /* cap: the caller's budget decides */
#define FP_SPIN_MIN_NS 2000           /* a cap below this is no spin */
#define FP_SPIN_WIDE_NS 200000        /* a cap above this is the caller's budget */
#define FP_SPIN_PROBE_NS 10000
#define FP_SPIN_PROBE_EVERY 16u
#define FP_SPIN_MISS_WINDOW_NS 20000  /* a park this soon after a spin step ends that spin */
#ifndef FP_SPIN_PREEMPT_NS /* a test on a loaded machine sets it out of reach */
#define FP_SPIN_PREEMPT_NS 50000 /* a step (64 pauses, a yield: 1-3 us) this long was off-CPU */
#endif
#define FP_SPIN_CALM_MIN_NS 2000000   /* after a preempted spin: no spin for 2 ms, */
#define FP_SPIN_CALM_MAX_NS 64000000  /* doubling while probes are preempted too */

enum { FP_PEER_UNKNOWN = 0, FP_PEER_SAME = 1, FP_PEER_OTHER = 2 };
#define FP_SPIN_YIELD_ONCE (-1)       /* cap: one sched_yield, then park */

/* The CPU this thread runs on now, plus one: 0 means unknown. */
static inline uint32_t fp_cpu_tag(void)
{
#ifdef __linux__
    int c = sched_getcpu();
    return c < 0 ? 0u : (uint32_t)c + 1u;
#else
    return 0u;
#endif
}

/* Where the partner of this thread ran, by the tag it published last. */
static inline int fp_peer_where(uint32_t mine, uint32_t theirs)
{
    if (mine == 0 || theirs == 0)
        return FP_PEER_UNKNOWN;
    return mine == theirs ? FP_PEER_SAME : FP_PEER_OTHER;
}

typedef struct {
    int64_t start, now;
    int64_t cap; /* this spin's limit */
    unsigned steps;
} fp_spin_t;

typedef struct {
    int64_t cap;       /* this thread's learned limit; FP_SPIN_FREE at first */
    int64_t start;     /* of the spin in progress */
    int64_t last;      /* the clock at its last read */
    unsigned active;   /* a spin began and has not parked yet */
    unsigned stepped;  /* ...and it stepped at least once */
    unsigned since_probe;
    int64_t calm_until; /* no spin before this clock: the last spins lost their CPU */
    int64_t calm_ns;    /* the spell the next preempted spin starts (0: none so far) */
} fp_spin_state_t;

static _Thread_local fp_spin_state_t fp_spin_state = {FP_SPIN_FREE, 0, 0, 0, 0, 0, 0, 0};

/* This thread's spin was preempted at clock now: park without spinning for a spell. */
static inline void fp_spin_preempted(fp_spin_state_t *t, int64_t now)
{
    int64_t spell = t->calm_ns ? 2 * t->calm_ns : FP_SPIN_CALM_MIN_NS;
    t->calm_ns = spell > FP_SPIN_CALM_MAX_NS ? FP_SPIN_CALM_MAX_NS : spell;
    t->calm_until = now + t->calm_ns;
}

static inline void fp_spin_learn(fp_spin_state_t *t, int hit)
{
    int64_t took = t->last - t->start;
    if (!t->stepped)
        return; /* the data was there at once: says nothing about spinning */
    if (hit) {
        int64_t want = 2 * took + FP_SPIN_MIN_NS;
        if (t->cap != FP_SPIN_FREE && want > t->cap)
            t->cap = want > FP_SPIN_WIDE_NS ? FP_SPIN_FREE : want;
        t->since_probe = 0;
    } else {
        int64_t half = (t->cap == FP_SPIN_FREE ? took : t->cap) / 2;
        t->cap = half < FP_SPIN_MIN_NS ? 0 : half;
    }
}

static inline void fp_spin_init(fp_spin_t *s, int peer)
{
    fp_spin_state_t *t = &fp_spin_state;
    s->start = s->now = fp_now_ns();
    s->steps = 0;
    if (t->active)
        fp_spin_learn(t, 1); /* the last spin returned without parking */
    if (s->start < t->calm_until) { /* this CPU is someone else's too: park at once */
        t->active = 0;
        s->cap = 0;
        return;
    }
    if (peer != FP_PEER_UNKNOWN) { /* the partner's CPU decides; nothing to learn */
        t->active = 0;
        s->cap = peer == FP_PEER_SAME ? FP_SPIN_YIELD_ONCE : FP_SPIN_FREE;
        return;
    }
    t->active = 1;
    t->stepped = 0;
    t->start = t->last = s->start;
    s->cap = t->cap;
    if (s->cap == 0 && ++t->since_probe >= FP_SPIN_PROBE_EVERY) {
        t->since_probe = 0;
        s->cap = FP_SPIN_PROBE_NS;
    }
}

/* Ends the caller's spin loop (while (now - start < spin_ns)) at once. */
static inline void fp_spin_stop(fp_spin_t *s) { s->now = s->start + (INT64_MAX / 2); }

static inline void fp_spin_step(fp_spin_t *s)
{
    fp_spin_state.stepped = 1;
    if (s->cap <= 0) { /* fp_spin_state.last is still the clock read at init */
        if (s->cap == FP_SPIN_YIELD_ONCE) {
            sched_yield();
            int64_t now = fp_now_ns();
            if (now - s->now >= FP_SPIN_PREEMPT_NS) /* the yield ran more than our partner */
                fp_spin_preempted(&fp_spin_state, now);
        }
        fp_spin_stop(s);
        return;
    }
    fp_cpu_relax();
    if ((++s->steps & 63u) == 0) {
        int64_t before = s->now;
        sched_yield();
        s->now = fp_spin_state.last = fp_now_ns();
        if (s->now - before >= FP_SPIN_PREEMPT_NS) {
            fp_spin_preempted(&fp_spin_state, s->now);
            fp_spin_stop(s);
        } else {
            fp_spin_state.calm_ns = 0; /* a step that kept its CPU: spinning works here now */
            if (s->now - s->start >= s->cap)
                fp_spin_stop(s);
        }
    }
}

typedef struct {
    fp_a32 seq;     /* bumped on every notify that found a waiter */
    fp_a32 waiters; /* consumers between prepare and finish */
} fp_event_t;

/* Consumer, step 1: register, and take the key to sleep on. */
static inline uint32_t fp_event_prepare(fp_event_t *e)
{
    fp_spin_state_t *t = &fp_spin_state;
    if (t->active) {
        /* Just after a spin's last step: that spin ended without its data, wasted.
         * Later (a wait for ring space after a spin that found its task) it says
         * nothing either way. */
        t->active = 0;
        if (t->stepped && fp_now_ns() - t->last < FP_SPIN_MISS_WINDOW_NS)
            fp_spin_learn(t, 0);
    }
    fp_add32_seqcst(&e->waiters, 1);
    return fp_load32_seqcst(&e->seq);
}

/* Consumer, step 2 (only if the condition is still false after prepare). */
static inline int fp_event_wait(fp_event_t *e, uint32_t key, int64_t timeout_ns)
{
    return fp_futex_wait(&e->seq, key, timeout_ns);
}

/* Consumer, step 3: always, whether it slept or not. */
static inline void fp_event_finish(fp_event_t *e) { fp_sub32_seqcst(&e->waiters, 1); }

/* Producer, after publishing with a release store. */
static inline int fp_event_notify(fp_event_t *e)
{
    fp_fence_seqcst();
    if (fp_load32_seqcst(&e->waiters) == 0)
        return 0;
    fp_add32_seqcst(&e->seq, 1);
    fp_futex_wake(&e->seq, INT_MAX);
    return 1;
}

/* Wakes every waiter whether or not it registered a condition: a kick. */
static inline void fp_event_kick(fp_event_t *e)
{
    fp_add32_seqcst(&e->seq, 1);
    fp_futex_wake(&e->seq, INT_MAX);
}

#endif /* FP_FUTEX_H */
