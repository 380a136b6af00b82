/* Claims about one fp_ring shared by two processes: a producer child and a
 * consumer child on a MAP_SHARED board, each attaching as a worker does
 * (fp_board_check, then its own fp_ringv_t view of the ring) and parking on
 * the ring's eventcounts (fp_ringv_wait_space / fp_ringv_wait_data).  Every
 * record arrives once, in order, intact; a producer SIGKILLed mid-stream
 * leaves only whole records behind, and the parent can reset the ring and use
 * it again. */
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "fp_board.h"

#define MS 1000000LL
#define KIND 3u
#define CAP (64u * 1024u)
#define PARK_NS (1000 * MS) /* long: with a live peer, a wait that runs out is a lost wake-up */
#define RUN_DEADLINE_NS (60000 * MS)

typedef struct {
    fp_a32 producer_dead; /* set by the parent after it reaped the producer */
    fp_a32 slow_consumer; /* crash runs: let the ring fill so the producer parks */
    fp_a64 published;     /* producer: records committed so far (stored after the commit) */
    fp_a64 consumed;      /* consumer: records verified and released so far */
    fp_a64 producer_parks, producer_timeouts;
    fp_a64 consumer_parks, consumer_timeouts;
} ctl_t;

static fp_board_t *board;
static uint64_t board_bytes;
static ctl_t *ctl;

static void setup(void)
{
    board_bytes = fp_board_size(1, CAP);
    board = mmap(NULL, board_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(board != MAP_FAILED);
    CHECK_EQ(fp_board_init(board, 1, CAP), FP_OK);
    ctl = mmap(NULL, sizeof(ctl_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(ctl != MAP_FAILED);
}

static void teardown(void)
{
    munmap(board, board_bytes);
    munmap(ctl, sizeof(ctl_t));
}

static fp_ring_t *ring(void) { return fp_board_ring_at(board, 1, CAP, 0, 0); }

/* A child's view of the ring, from the geometry its own attach check read
 * (never the parent's constant): producer 1 for the producer's view. */
static void attach(fp_ringv_t *v, int producer)
{
    uint32_t nslots = 0;
    uint64_t cap = 0;
    CHECK_EQ(fp_board_check(board, board_bytes, &nslots, &cap), FP_OK);
    CHECK_EQ(nslots, 1);
    CHECK_EQ(cap, CAP);
    CHECK_EQ(fp_ringv_init(v, fp_board_ring_at(board, nslots, cap, 0, 0), cap, producer), FP_OK);
}

/* The parent's own consumer view, taken when no child runs: from the
 * position the last consumer published. */
static fp_ringv_t parent_view(void)
{
    fp_ringv_t v;
    CHECK_EQ(fp_ringv_init(&v, ring(), CAP, 0), FP_OK);
    return v;
}

/* Mostly small records, some empty, a few at the ring's limit. */
static uint64_t len_of(uint64_t seq, uint64_t max)
{
    uint64_t h = splitmix64(seq ^ 0x5eed);
    uint64_t k = h % 64;
    if (k == 0)
        return max - (h >> 32) % 64;
    if (k < 8)
        return (h >> 32) % 17;
    return (h >> 32) % 1500;
}

static void fill(unsigned char *p, uint64_t len, uint64_t seq)
{
    uint64_t x = splitmix64(seq);
    for (uint64_t i = 0; i < len; i++)
        p[i] = (unsigned char)((x >> ((i & 7u) * 8u)) + (i >> 3));
}

static uint64_t checksum(const unsigned char *p, uint64_t len, uint64_t seq)
{
    uint64_t h = 0xcbf29ce484222325ull ^ seq; /* FNV-1a, keyed by the sequence number */
    for (uint64_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static void child_prologue(void)
{
    /* a parent that fails a CHECK must not leave a producer running forever */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1)
        _exit(4);
}

/* Writes each record in place between reserve and commit, so a kill often
 * lands with a record reserved and half written but not published. */
static void run_producer(uint64_t n)
{
    child_prologue();
    fp_ringv_t v;
    attach(&v, 1);
    uint64_t max = v.max_record;
    int64_t deadline = fp_now_ns() + RUN_DEADLINE_NS;
    for (uint64_t seq = 0; seq < n; seq++) {
        uint64_t len = len_of(seq, max);
        for (;;) {
            /* before the reserve: no wake-up is missed */
            uint64_t seen = fp_load64_acquire(&v.hdr->head);
            fp_resv_t res;
            unsigned char *p = NULL;
            int rc = fp_ringv_reserve(&v, len, &res, &p);
            if (rc == FP_OK) {
                fill(p, len, seq);
                fp_ringv_commit(&v, &res, KIND, seq, checksum(p, len, seq), 1);
                fp_store64_release(&ctl->published, seq + 1);
                break;
            }
            CHECK_EQ(rc, FP_AGAIN);
            fp_add64_relaxed(&ctl->producer_parks, 1);
            int64_t t0 = fp_now_ns();
            if (!fp_ringv_wait_space(&v, seen, PARK_NS) && fp_now_ns() - t0 >= PARK_NS)
                fp_add64_relaxed(&ctl->producer_timeouts, 1);
            CHECKF(fp_now_ns() < deadline, "producer stuck at record %llu",
                   (unsigned long long)seq);
        }
    }
    _exit(0);
}

static void verify(const fp_recv_t *rec, uint64_t expect, uint64_t max)
{
    CHECKF(rec->task_id == expect, "got record %llu, expected %llu",
           (unsigned long long)rec->task_id, (unsigned long long)expect);
    CHECK_EQ(rec->kind, KIND);
    CHECK_EQ(rec->len, len_of(expect, max));
    CHECKF(checksum(rec->payload, rec->len, expect) == rec->aux, "record %llu damaged",
           (unsigned long long)expect);
}

/* Consumes until n records (n > 0), or, with n == 0, until the parent says
 * the producer is dead and nothing more is left. */
static void run_consumer(uint64_t n)
{
    child_prologue();
    fp_ringv_t v;
    attach(&v, 0);
    uint64_t max = v.max_record, expect = 0;
    int64_t deadline = fp_now_ns() + (n ? RUN_DEADLINE_NS : 10000 * MS);
    for (;;) {
        if (n && expect == n)
            break;
        fp_recv_t rec;
        int rc = fp_ringv_peek(&v, &rec);
        if (rc == FP_OK) {
            verify(&rec, expect, max);
            fp_ringv_release(&v, rec.next);
            expect++;
            fp_store64_release(&ctl->consumed, expect);
            if (fp_load32_relaxed(&ctl->slow_consumer) && expect % 64 == 0)
                sleep_ns(1 * MS);
            continue;
        }
        CHECK_EQ(rc, FP_AGAIN);
        if (!n && fp_load32_acquire(&ctl->producer_dead)) {
            /* the producer is reaped: whatever it published is visible now */
            if (fp_ringv_peek(&v, &rec) == FP_AGAIN)
                break;
            continue;
        }
        CHECKF(fp_now_ns() < deadline, "consumer blocked after %llu records",
               (unsigned long long)expect);
        fp_add64_relaxed(&ctl->consumer_parks, 1);
        if (n) {
            /* a 0 before the timeout is a stale notify (one meant for the
             * previous wait); only a wait that ran out counts */
            int64_t t0 = fp_now_ns();
            if (!fp_ringv_wait_data(&v, NULL, PARK_NS, 0, FP_PEER_UNKNOWN) &&
                fp_now_ns() - t0 >= PARK_NS)
                fp_add64_relaxed(&ctl->consumer_timeouts, 1);
        } else {
            /* short: the producer may be dead */
            fp_ringv_wait_data(&v, &ctl->producer_dead, 20 * MS, 0, FP_PEER_UNKNOWN);
        }
    }
    if (n) { /* and nothing beyond the last record */
        fp_recv_t rec;
        CHECK_EQ(fp_ringv_peek(&v, &rec), FP_AGAIN);
    }
    _exit(0);
}

static pid_t spawn(void (*fn)(uint64_t), uint64_t n)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0)
        fn(n); /* never returns */
    return pid;
}

/* Reaps pid within timeout_ns; a child still running then is killed and
 * reported as a hang. */
static int reap(pid_t pid, int64_t timeout_ns, const char *what)
{
    int status = 0;
    int64_t deadline = fp_now_ns() + timeout_ns;
    for (;;) {
        pid_t got = waitpid(pid, &status, WNOHANG);
        CHECK(got >= 0);
        if (got == pid)
            return status;
        if (fp_now_ns() > deadline) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            CHECKF(0, "%s did not finish within %lld ms", what, (long long)(timeout_ns / MS));
        }
        sleep_ns(1 * MS);
    }
}

static void check_exited_ok(int status, const char *what)
{
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status %#x (exit %d, signal %d)",
           what, status, WIFEXITED(status) ? WEXITSTATUS(status) : -1,
           WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void clear_ctl(void) { memset(ctl, 0, sizeof(*ctl)); }

static void stream(uint64_t n)
{
    clear_ctl();
    int64_t t0 = fp_now_ns();
    pid_t cons = spawn(run_consumer, n);
    pid_t prod = spawn(run_producer, n);
    int ps = reap(prod, RUN_DEADLINE_NS + 5000 * MS, "producer");
    int cs = reap(cons, RUN_DEADLINE_NS + 5000 * MS, "consumer");
    check_exited_ok(ps, "producer");
    check_exited_ok(cs, "consumer");
    printf("[%llu records in %lld ms; producer parked %llu times, consumer %llu times] ",
           (unsigned long long)n, (long long)((fp_now_ns() - t0) / MS),
           (unsigned long long)ctl->producer_parks, (unsigned long long)ctl->consumer_parks);
    CHECK_EQ(fp_load64_acquire(&ctl->consumed), n);
    CHECK_EQ(fp_load64_acquire(&ctl->published), n);
    CHECK_EQ(fp_load64_acquire(&ctl->producer_timeouts), 0);
    CHECK_EQ(fp_load64_acquire(&ctl->consumer_timeouts), 0);
    fp_ringv_t v = parent_view();
    CHECK(fp_ringv_empty(&v));
    CHECK_EQ(fp_load64_acquire(&ring()->head), fp_load64_acquire(&ring()->tail));
    CHECK_EQ(fp_load32_relaxed(&ring()->data.waiters), 0);
    CHECK_EQ(fp_load32_relaxed(&ring()->space.waiters), 0);
}

TEST(every_record_arrives_once_in_order_and_intact)
{
    setup();
    stream(200000);
    teardown();
}

TEST(killed_producer_leaves_whole_records_and_the_ring_is_reusable)
{
    setup();
    uint64_t seed = (uint64_t)fp_now_ns() ^ (uint64_t)getpid();
    printf("[seed %llu] ", (unsigned long long)seed);
    uint64_t total = 0, parked_at_kill = 0;
    for (int iter = 0; iter < 12; iter++) {
        clear_ctl();
        fp_store32_relaxed(&ctl->slow_consumer, (uint32_t)(iter % 3 == 2));
        pid_t cons = spawn(run_consumer, 0);
        pid_t prod = spawn(run_producer, UINT64_MAX);
        /* 0 to 30 ms */
        sleep_ns((int64_t)(splitmix64(seed + (uint64_t)iter) % (30 * 1000)) * 1000);
        CHECK(kill(prod, SIGKILL) == 0);
        int ps = reap(prod, 5000 * MS, "killed producer");
        CHECKF(WIFSIGNALED(ps) && WTERMSIG(ps) == SIGKILL, "producer status %#x, iteration %d", ps,
               iter);
        fp_store32_release(&ctl->producer_dead, 1);
        fp_event_kick(&ring()->data);
        int cs = reap(cons, 15000 * MS, "consumer after the producer died");
        check_exited_ok(cs, "consumer after the producer died");
        /* the consumer saw a prefix 0..consumed-1 (it checks order and every
         * checksum) and nothing the producer published is missing: the kill
         * may fall between a commit and the published store, never before */
        uint64_t published = fp_load64_acquire(&ctl->published),
                 consumed = fp_load64_acquire(&ctl->consumed);
        CHECKF(consumed == published || consumed == published + 1,
               "iteration %d: published %llu consumed %llu", iter, (unsigned long long)published,
               (unsigned long long)consumed);
        fp_ringv_t v = parent_view();
        fp_recv_t rec;
        CHECK_EQ(fp_ringv_peek(&v, &rec), FP_AGAIN);
        total += consumed;
        parked_at_kill += fp_load32_relaxed(&ring()->space.waiters) != 0;
        /* neither side runs now: start the ring over for the next pair */
        fp_ringv_reset(&v);
        CHECK(fp_ringv_empty(&v));
        CHECK_EQ(fp_load64_acquire(&ring()->head), 0);
        CHECK_EQ(fp_load64_acquire(&ring()->tail), 0);
        CHECK_EQ(fp_load32_relaxed(&ring()->data.waiters), 0);
        CHECK_EQ(fp_load32_relaxed(&ring()->space.waiters), 0);
    }
    printf("[%llu records before the kills; producer parked at %llu of 12 kills] ",
           (unsigned long long)total, (unsigned long long)parked_at_kill);
    stream(20000); /* the reset ring carries a full stream again */
    teardown();
}

int main(int argc, char **argv) { return check_main(argc, argv); }
