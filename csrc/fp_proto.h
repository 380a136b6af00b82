/* What the pool's records mean: the kinds on the task and result rings and the
 * layout of a call's aux word.  The rings themselves carry any kind; this is
 * the protocol between the parent's dispatcher and a worker's serving loop. */
#ifndef FP_PROTO_H
#define FP_PROTO_H

#include <stdint.h>

/* Task ring.  Kinds below 16 are tasks: the worker records them in
 * slot.current (fp_slot_start) before it consumes the record. */
enum {
    /* fn(*args): payload = [fn pickle] + pickled args tuple (empty: no args) */
    FP_K_CALL = 1,
    FP_K_CALLKW = 2,      /* fn(*args, **kwargs): [fn pickle] + pickled (args, kwargs) */
    FP_K_CHUNK = 3,       /* [fn(x) for x in items]: [fn pickle] + pickled items list */
    FP_K_STARCHUNK = 4,   /* [fn(*x) for x in items] */
    FP_K_TASK_LIMIT = 16,
    FP_K_STOP = 16,       /* exit between tasks */
    FP_K_INIT = 17,       /* the initializer and the worker's settings */
};

/* Result ring. */
enum {
    FP_R_OK = 1,          /* payload: the pickled result; empty means None */
    FP_R_ERR = 2,         /* payload: an encoded exception */
    FP_R_BAD_RESULT = 3,  /* the result could not be pickled; the worker is fine */
    FP_R_SKIPPED = 4,     /* dropped before it started, as the parent asked (fp_slot_skip) */
    FP_R_READY = 16,      /* aux: the worker's pid */
    FP_R_INIT_FAILED = 17,
};

/* A call's aux word: which function, and whether its pickle rides along.
 * The parent sends a function's pickle to a worker once; later calls name
 * it by id.  bit 63 asks the worker to forget every function it knows (the
 * parent's registry was reset). */
#define FP_AUX_FN_ID(aux) ((uint32_t)((aux) & 0xFFFFFFFFu))
#define FP_AUX_FN_LEN(aux) ((uint64_t)(((aux) >> 32) & 0x7FFFFFFFu))
#define FP_AUX_FLUSH ((uint64_t)1 << 63)
#define FP_AUX_FN_LEN_MAX 0x7FFFFFFFu
static inline uint64_t fp_aux_call(uint32_t fn_id, uint64_t fn_len, int flush)
{
    return (uint64_t)fn_id | (fn_len << 32) | (flush ? FP_AUX_FLUSH : 0);
}

/* A result's aux word is its run time in ns; this bit says its payload ends with
 * the list of blocks the worker handed over with it (see _codec.with_handoffs),
 * so the parent can take them back even if the result cannot be decoded. */
#define FP_AUX_HANDOFFS ((uint64_t)1 << 62)

#endif /* FP_PROTO_H */
