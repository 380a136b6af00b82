# The board's C contract for the other extensions (_dispatch, _serve): csrc's
# ring and board views, opaque where an accessor will do, and the Board class
# whose C-level methods the hot paths call without a Python frame.
from libc.stdint cimport int64_t, uint32_t, uint64_t

cdef extern from "fp_futex.h" nogil:
    int64_t fp_now_ns()
    uint32_t fp_cpu_tag()

cdef extern from "fp_ring.h" nogil:
    ctypedef struct fp_ringv_t:
        pass
    ctypedef struct fp_recv_t:           # a record as the consumer copied it (process memory)
        uint32_t kind
        uint32_t len
        uint64_t task_id
        uint64_t aux
        const unsigned char *payload
        uint64_t next
    uint64_t FP_RING_MAX_CAPACITY
    uint64_t fp_ring_max_record_for(uint64_t cap)
    void fp_ringv_reset(fp_ringv_t *v)
    int fp_ringv_empty(fp_ringv_t *v)
    uint64_t fp_ringv_head(fp_ringv_t *v)
    void *fp_boardv_ring_header "fp_ringv_header"(fp_ringv_t *v)
    int fp_ringv_push2(fp_ringv_t *v, uint32_t kind, uint64_t task_id, uint64_t aux,
                       const void *a, uint64_t alen, const void *b, uint64_t blen, int notify)
    void fp_ringv_notify(fp_ringv_t *v)
    int fp_ringv_peek(fp_ringv_t *v, fp_recv_t *out)
    void fp_ringv_release(fp_ringv_t *v, uint64_t next)
    int fp_ringv_wait_data(fp_ringv_t *v, void *stop, int64_t timeout_ns, int64_t spin_ns,
                           int peer)
    int fp_ringv_wait_space(fp_ringv_t *v, uint64_t seen_head, int64_t timeout_ns)

cdef extern from "fp_board.h" nogil:
    ctypedef struct fp_board_t:
        pass
    ctypedef struct fp_slot_t:
        pass
    ctypedef struct fp_boardv_t:
        pass
    int FP_SLOT_EMPTY, FP_SLOT_STARTING, FP_SLOT_READY, FP_SLOT_EXITING
    uint32_t FP_BOARD_MAX_SLOTS
    uint64_t fp_board_size(uint32_t nslots, uint64_t cap)
    int fp_board_init(fp_board_t *b, uint32_t nslots, uint64_t cap)
    int fp_board_check(const fp_board_t *b, uint64_t mapped, uint32_t *nslots, uint64_t *cap)
    int fp_boardv_init(fp_boardv_t *v, fp_board_t *b, uint64_t mapped, uint32_t nslots,
                       uint64_t cap, fp_ringv_t *tasks, fp_ringv_t *results, int parent)
    fp_slot_t *fp_boardv_slot(const fp_boardv_t *v, uint32_t i)
    int fp_boardv_worker_on(const fp_boardv_t *v, uint32_t i, uint32_t mine)
    fp_ringv_t *fp_boardv_tasks(const fp_boardv_t *v, uint32_t i)
    fp_ringv_t *fp_boardv_results(const fp_boardv_t *v, uint32_t i)
    fp_board_t *fp_boardv_board(const fp_boardv_t *v)
    void fp_boardv_restore_header(const fp_boardv_t *v)
    int fp_boardv_parent_has_work(const fp_boardv_t *v)
    int fp_boardv_wait_results(const fp_boardv_t *v, int64_t timeout_ns, int64_t spin_ns)
    int fp_boardv_wait_task(const fp_boardv_t *v, uint32_t slot, int64_t timeout_ns,
                            int64_t spin_ns)
    void fp_board_notify_parent(fp_board_t *b)
    void fp_board_flag_attention(fp_board_t *b)
    int fp_board_take_attention(fp_board_t *b)
    void fp_board_kick(fp_board_t *b)
    void fp_boardv_want(fp_boardv_t *v, int delta)
    int fp_boardv_wanted(fp_boardv_t *v)
    void fp_slot_reset(fp_slot_t *s)
    void fp_slot_info(fp_slot_t *s, uint32_t *state, uint32_t *pid, uint64_t *current,
                      uint64_t *heartbeat, uint64_t *served)
    uint64_t fp_slot_current(fp_slot_t *s)
    void fp_slot_set_state(fp_slot_t *s, uint32_t state, uint32_t pid)
    void fp_slot_beat(fp_slot_t *s)
    int fp_slot_park_beat(fp_slot_t *s, uint64_t served_seen, int64_t timeout_ns)
    int fp_slot_beat_parked(fp_slot_t *s)
    int fp_slot_start(fp_slot_t *s, uint64_t task)
    void fp_slot_finish(fp_slot_t *s, int ran)
    int fp_slot_skip(fp_slot_t *s, uint64_t seq, uint64_t task)
    void fp_slot_request_cancel(fp_slot_t *s, uint64_t task)
    int fp_slot_cancel_requested(fp_slot_t *s)


cdef int check(int rc, str what) except -1


cdef class Board:
    cdef fp_boardv_t *_v       # this process's views: geometry it created or checked once
    cdef fp_ringv_t *_rings    # 2 * nslots ring views, owned here
    cdef void *_base
    cdef size_t _size
    cdef int _fd
    cdef bint _parent
    cdef readonly int nslots
    cdef readonly uint64_t ring_capacity
    cdef readonly uint64_t max_record

    cdef _views(self, uint32_t nslots, uint64_t cap, bint parent)
    cdef _release(self)
    cdef int _ok(self, int slot) except -1
    # parent side: the dispatcher's hot path (no Python frame, no exception)
    cdef int push_task(self, int slot, uint32_t kind, uint64_t task_id, uint64_t aux,
                       const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen) noexcept
    cdef int peek_result(self, int slot, fp_recv_t *out) noexcept
    cdef void release_result(self, int slot, uint64_t nxt) noexcept
    cdef bint results_pending(self, int slot) noexcept
    cdef bint worker_on(self, int slot, uint32_t cpu) noexcept
    cdef uint64_t current_of(self, int slot) noexcept
    cdef int skip_task(self, int slot, uint64_t seq, uint64_t task_id) noexcept
    # worker side: the serving loop's hot path
    cdef int next_task(self, int slot, fp_recv_t *out, int64_t timeout_ns,
                       int64_t spin_ns) noexcept nogil
    cdef bint start_task(self, int slot, uint64_t task_id) noexcept
    cdef void release_task(self, int slot, uint64_t nxt) noexcept
    cdef void finish(self, int slot, bint ran) noexcept
    cdef int put_result(self, int slot, uint32_t kind, uint64_t task_id, uint64_t aux,
                        const char *p, Py_ssize_t n, int64_t timeout_ns) except -1

cdef extern from "fp_proto.h" nogil:
    enum:
        FP_K_CALL, FP_K_CALLKW, FP_K_CHUNK, FP_K_STARCHUNK, FP_K_TASK_LIMIT, FP_K_STOP, FP_K_INIT
        FP_R_OK, FP_R_ERR, FP_R_BAD_RESULT, FP_R_SKIPPED, FP_R_READY, FP_R_INIT_FAILED
    uint32_t FP_AUX_FN_ID(uint64_t aux)
    uint64_t FP_AUX_FN_LEN(uint64_t aux)
    uint64_t FP_AUX_FLUSH
    uint64_t FP_AUX_HANDOFFS
    uint64_t FP_AUX_FN_LEN_MAX
    uint64_t fp_aux_call(uint32_t fn_id, uint64_t fn_len, int flush)
