/* The only file that names a memory order.  Every cross-process word in the
 * board is one of these types and is touched only through these functions. */
#ifndef FP_ATOMIC_H
#define FP_ATOMIC_H

#include <assert.h>
#include <stdatomic.h>
#include <stdint.h>

/* A non-lock-free atomic falls back to a lock table private to each
 * process, which silently breaks atomicity across processes. */
static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");
static_assert(ATOMIC_INT_LOCK_FREE == 2, "32-bit atomics must be lock-free");

typedef _Atomic uint32_t fp_a32;
typedef _Atomic uint64_t fp_a64;

static inline uint32_t fp_load32_acquire(fp_a32 *p)
{
    return atomic_load_explicit(p, memory_order_acquire);
}
static inline uint32_t fp_load32_relaxed(fp_a32 *p)
{
    return atomic_load_explicit(p, memory_order_relaxed);
}
static inline uint32_t fp_load32_seqcst(fp_a32 *p)
{
    return atomic_load_explicit(p, memory_order_seq_cst);
}
static inline void fp_store32_release(fp_a32 *p, uint32_t v)
{
    atomic_store_explicit(p, v, memory_order_release);
}
static inline void fp_store32_relaxed(fp_a32 *p, uint32_t v)
{
    atomic_store_explicit(p, v, memory_order_relaxed);
}
static inline uint32_t fp_add32_seqcst(fp_a32 *p, uint32_t v)
{
    return atomic_fetch_add_explicit(p, v, memory_order_seq_cst);
}
static inline uint32_t fp_sub32_seqcst(fp_a32 *p, uint32_t v)
{
    return atomic_fetch_sub_explicit(p, v, memory_order_seq_cst);
}
static inline uint32_t fp_xchg32_acqrel(fp_a32 *p, uint32_t v)
{
    return atomic_exchange_explicit(p, v, memory_order_acq_rel);
}
static inline int fp_cas32_acqrel(fp_a32 *p, uint32_t *expected, uint32_t desired)
{
    return atomic_compare_exchange_strong_explicit(p, expected, desired, memory_order_acq_rel,
                                                   memory_order_acquire);
}

static inline uint64_t fp_load64_acquire(fp_a64 *p)
{
    return atomic_load_explicit(p, memory_order_acquire);
}
static inline uint64_t fp_load64_relaxed(fp_a64 *p)
{
    return atomic_load_explicit(p, memory_order_relaxed);
}
static inline void fp_store64_release(fp_a64 *p, uint64_t v)
{
    atomic_store_explicit(p, v, memory_order_release);
}
static inline void fp_store64_relaxed(fp_a64 *p, uint64_t v)
{
    atomic_store_explicit(p, v, memory_order_relaxed);
}
static inline uint64_t fp_add64_relaxed(fp_a64 *p, uint64_t v)
{
    return atomic_fetch_add_explicit(p, v, memory_order_relaxed);
}
static inline uint64_t fp_add64_seqcst(fp_a64 *p, uint64_t v)
{
    return atomic_fetch_add_explicit(p, v, memory_order_seq_cst);
}
static inline uint64_t fp_load64_seqcst(fp_a64 *p)
{
    return atomic_load_explicit(p, memory_order_seq_cst);
}
static inline void fp_store64_seqcst(fp_a64 *p, uint64_t v)
{
    atomic_store_explicit(p, v, memory_order_seq_cst);
}

/* Orders a preceding store before a following load (Dekker): the
 * publish-then-check-waiters half of the eventcount needs it. */
static inline void fp_fence_seqcst(void) { atomic_thread_fence(memory_order_seq_cst); }

static inline void fp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ __volatile__("pause" ::: "memory");
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#else
    atomic_signal_fence(memory_order_seq_cst);
#endif
}

#endif /* FP_ATOMIC_H */
