/* A tiny test harness for the csrc C tests, built and run by tests/unit/test_native.py.
 *
 *   TEST(ring_push_then_peek) { ... CHECK(cond); CHECK_EQ(a, b); ... }
 *   int main(int argc, char **argv) { return check_main(argc, argv); }
 *
 * `prog` runs every test, `prog NAME` runs one (pytest runs one per item, so a
 * failing claim is reported by its own name), `prog --list` prints the names.
 * A failed CHECK prints file:line and the expression, then _exit(1): _exit, not
 * exit, because checks also fail inside forked children, where exit handlers
 * (LeakSanitizer among them) belong to the parent. */
#ifndef FP_TEST_CHECK_H
#define FP_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Sleeps ns on CLOCK_MONOTONIC's scale, resuming after a signal. */
static inline void sleep_ns(int64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* splitmix64: a seed or a position to 64 well-mixed bits (fills, lengths, seeds). */
static inline uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

#define CHECK_FAIL_()                                                                              \
    do {                                                                                           \
        fflush(stdout);                                                                            \
        fflush(stderr);                                                                            \
        _exit(1);                                                                                  \
    } while (0)

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);               \
            CHECK_FAIL_();                                                                         \
        }                                                                                          \
    } while (0)

/* CHECKF(cond, fmt, ...): CHECK plus context (a seed, an iteration). */
#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            CHECK_FAIL_();                                                                         \
        }                                                                                          \
    } while (0)

/* Integer equality that prints both sides; status codes are negative, so
 * compare the bits and print them signed. */
#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        unsigned long long check_a_ = (unsigned long long)(a), check_b_ = (unsigned long long)(b); \
        if (check_a_ != check_b_) {                                                                \
            fprintf(stderr, "%s:%d: CHECK_EQ(%s, %s) failed: %lld != %lld\n", __FILE__, __LINE__,  \
                    #a, #b, (long long)check_a_, (long long)check_b_);                             \
            CHECK_FAIL_();                                                                         \
        }                                                                                          \
    } while (0)

typedef struct {
    const char *name;
    void (*fn)(void);
} check_test_t;

enum { CHECK_MAX_TESTS = 128 };
static check_test_t check_tests_[CHECK_MAX_TESTS];
static int check_ntests_;

static inline void check_register_(const char *name, void (*fn)(void))
{
    if (check_ntests_ == CHECK_MAX_TESTS) {
        fprintf(stderr, "check.h: more than %d tests; raise CHECK_MAX_TESTS\n", CHECK_MAX_TESTS);
        _exit(2);
    }
    check_tests_[check_ntests_].name = name;
    check_tests_[check_ntests_].fn = fn;
    check_ntests_++;
}

/* Registration by constructor, so a TEST cannot be written and then left out
 * of a hand-kept list; test_native.py finds the same names with a regex. */
#define TEST(name)                                                                                 \
    static void name(void);                                                                        \
    __attribute__((constructor)) static void name##_register_(void)                                \
    {                                                                                              \
        check_register_(#name, name);                                                              \
    }                                                                                              \
    static void name(void)

static inline int check_main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc > 1 && strcmp(argv[1], "--list") == 0) {
        for (int i = 0; i < check_ntests_; i++)
            printf("%s\n", check_tests_[i].name);
        return 0;
    }
    int ran = 0;
    for (int i = 0; i < check_ntests_; i++) {
        if (argc > 1 && strcmp(argv[1], check_tests_[i].name) != 0)
            continue;
        printf("%s ... ", check_tests_[i].name);
        check_tests_[i].fn();
        printf("ok\n");
        ran++;
    }
    if (ran == 0) {
        fprintf(stderr, "no test named %s\n", argc > 1 ? argv[1] : "(any)");
        return 2;
    }
    return 0;
}

#endif /* FP_TEST_CHECK_H */
