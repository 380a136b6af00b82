# The arena's contract: csrc/fp_arena.h as Cython sees it, and the Arena and
# Block classes other extensions may cimport.  fp_arena_t and fp_block_t stay
# opaque: only fp_arena_* functions touch shared fields, through the private
# view each Arena keeps.
from libc.stdint cimport uint8_t, uint32_t, uint64_t

cdef extern from "fp_arena.h" nogil:
    int FP_NOSPACE, FP_STALE
    uint64_t FP_ARENA_PAGE, FP_ARENA_MAX_BYTES, FP_ARENA_PIN
    uint32_t FP_ARENA_MAX_PROCS
    int FP_ARENA_BAD_NONE
    ctypedef struct fp_arena_t:
        pass
    ctypedef struct fp_arena_view_t:
        unsigned char *base
        uint64_t total_size
        uint64_t regions_offset
        uint64_t region_size
        uint64_t budget
        uint64_t token
        uint64_t hdr
        uint64_t min_block
        uint32_t nprocs
    ctypedef struct fp_arena_blk_t:
        uint64_t off
        uint64_t size
        uint64_t gen
    ctypedef struct fp_arena_damage_t:
        uint32_t region
        int why
        uint64_t at
        uint64_t value
    ctypedef struct fp_arena_walk_t:
        pass
    const char *fp_arena_damage_text(int why)
    uint64_t fp_arena_size(uint32_t nprocs, uint64_t region_size)
    uint64_t fp_arena_align(uint64_t n, uint64_t a)
    int fp_arena_init(void *base, uint64_t mapped, uint32_t nprocs, uint64_t region_size,
                      uint64_t budget, uint64_t token, fp_arena_view_t *v)
    int fp_arena_check(const fp_arena_t *head, uint64_t file_size)
    int fp_arena_attach(const fp_arena_t *head, void *base, uint64_t mapped, fp_arena_view_t *v)
    int fp_arena_walk_begin(fp_arena_walk_t *w, const fp_arena_view_t *v, uint32_t r)
    int fp_arena_walk_next(fp_arena_walk_t *w, uint64_t *off, uint64_t *size)
    uint64_t FP_ARENA_TOP_UNKNOWN
    int fp_arena_alloc(const fp_arena_view_t *v, uint32_t p, uint64_t nbytes, fp_arena_blk_t *out,
                       uint64_t *fresh_len, uint64_t *own_top, fp_arena_damage_t *dmg)
    int fp_arena_alloc_capped(const fp_arena_view_t *v, uint32_t p, uint64_t nbytes, uint64_t cap,
                              fp_arena_blk_t *out, uint64_t *fresh_len, uint64_t *own_top,
                              fp_arena_damage_t *dmg)
    void fp_arena_unbump(const fp_arena_view_t *v, uint32_t p, const fp_arena_blk_t *blk,
                         uint64_t *own_top)
    int fp_arena_ref(const fp_arena_view_t *v, uint32_t p, uint64_t off, uint64_t gen,
                     fp_arena_blk_t *out, fp_arena_damage_t *dmg)
    int fp_arena_unref(const fp_arena_view_t *v, uint32_t p, uint64_t off)
    int fp_arena_count(const fp_arena_view_t *v, uint32_t p, uint64_t off, uint32_t *out)
    int fp_arena_is_free(const fp_arena_view_t *v, uint64_t off, int *out)
    int fp_arena_check_region(const fp_arena_view_t *v, uint32_t r, uint64_t *nblocks,
                              fp_arena_damage_t *dmg)
    int fp_arena_reclaim(const fp_arena_view_t *v, uint32_t p, uint64_t *held,
                         fp_arena_damage_t *dmg)
    int fp_arena_held(const fp_arena_view_t *v, uint32_t p, uint64_t *bytes, fp_arena_damage_t *dmg)
    int fp_arena_usage(const fp_arena_view_t *v, uint64_t *live, uint64_t *idle, uint64_t *nlive,
                       fp_arena_damage_t *dmg)
    int fp_arena_claim_free(const fp_arena_view_t *v, uint32_t p, uint64_t off)
    void fp_arena_add_returned(const fp_arena_view_t *v, uint64_t n)
    uint64_t fp_arena_returned(const fp_arena_view_t *v)
    int fp_arena_reset_region(const fp_arena_view_t *v, uint32_t r, uint64_t keep_below,
                              uint64_t *quarantined, fp_arena_damage_t *dmg)


cdef extern from "fp_pages.h" nogil:
    int fp_pages_commit(int fd, unsigned char *base, uint64_t off, uint64_t length)
    int fp_pages_recommit(int fd, const fp_arena_view_t *v, uint64_t own_base, uint8_t *punched,
                          uint64_t *npunched, uint64_t off, uint64_t size)
    void fp_pages_punch_free(const fp_arena_view_t *v, uint32_t r, int fd)
    void fp_pages_trim(const fp_arena_view_t *v, uint32_t p, int fd, uint64_t own_base,
                       uint8_t *punched, uint64_t *npunched, uint64_t reserve, uint64_t *given,
                       uint64_t *live)


cdef int recommit(Arena a, uint64_t off, uint64_t size) noexcept


cdef class Arena:
    cdef fp_arena_view_t _v      # private geometry, checked once; base NULL once unmapped
    cdef void *_ro               # a read-only mapping for readonly blocks, made on first use
    cdef uint64_t _own_top       # this process's record of its own region's top (fp_arena_alloc)
    cdef uint32_t *_held         # per page of the own region: Blocks of this process starting
                                 # there (calloc, lazy)
    cdef uint64_t *_seen_end     # per region: where the furthest block this process ever
                                 # referenced ends
    cdef uint8_t *_punched       # per page of the own region: a trim gave it back (calloc, lazy)
    cdef uint64_t _npunched      # pages flagged in _punched
    cdef readonly uint64_t allocs  # blocks this process took in its region (Arena.alloc, hook)
    cdef readonly uint64_t freed   # bytes of its region's blocks this process dropped
    cdef int _wake_fd            # written once freed passes _wake_at (wake_on_free), or -1
    cdef uint64_t _wake_min, _wake_at
    cdef int _fd
    cdef readonly uint32_t proc
    cdef readonly uint64_t token
    cdef readonly bint closed
    cdef Py_ssize_t _blocks      # live Block objects: the mapping outlives close() while any exists
    cdef object __weakref__

    cdef _disown(self)
    cdef void _dropped_own(self, uint64_t nbytes) noexcept
    cdef _unwake(self)
    cdef _punch_free(self)
    cdef _punch_free_region(self, uint32_t r)
    cdef _maybe_unmap(self)
    cdef _unmap(self)
    cdef char *_ro_base(self)
    cdef Block _block(self, fp_arena_blk_t *b, bint readonly)
    cdef uint64_t _own_base(self)
    cdef bint _holds_any(self, uint64_t off, uint64_t size)
    cdef int _usable(self) except -1
    cdef _commit(self, uint64_t off, uint64_t length, uint64_t nbytes)
    cpdef Block alloc(self, uint64_t nbytes)
    cpdef Block ref(self, uint64_t off, uint64_t gen, bint readonly)
    cdef _saw(self, fp_arena_blk_t *b)


cdef int check(Arena a, int rc, const fp_arena_damage_t *d, uint64_t nbytes=*, uint64_t off=*,
               bint held=*) except -1


cdef class Block:
    cdef Arena arena
    cdef readonly uint64_t off
    cdef readonly uint64_t gen
    cdef readonly uint64_t nbytes    # the data bytes, from one checked read: fixed for the
                                     # Block's life
    cdef readonly bint readonly
    cdef readonly bint fresh         # alloc bumped it: never used, its pages zero (the kernel's)
    cdef bint _own                   # in this process's own region: counted in arena._held
    cdef char *data
    cdef Py_ssize_t _shape[1]
    cdef Py_ssize_t _strides[1]
