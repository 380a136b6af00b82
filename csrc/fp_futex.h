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
 * of ~3 us, or ~15 us when parent and worker share a core). */
typedef struct {
    int64_t start, now;
    unsigned steps;
} fp_spin_t;

static inline void fp_spin_init(fp_spin_t *s)
{
    s->start = s->now = fp_now_ns();
    s->steps = 0;
}

static inline void fp_spin_step(fp_spin_t *s)
{
    fp_cpu_relax();
    if ((++s->steps & 63u) == 0) {
        sched_yield();
        s->now = fp_now_ns();
    }
}

typedef struct {
    fp_a32 seq;     /* bumped on every notify that found a waiter */
    fp_a32 waiters; /* consumers between prepare and finish */
} fp_event_t;

/* Consumer, step 1: register, and take the key to sleep on. */
static inline uint32_t fp_event_prepare(fp_event_t *e)
{
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
