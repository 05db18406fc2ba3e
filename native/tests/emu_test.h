/* A few assertion macros for the emulator's C tests: each failure prints where and why and
 * makes the test exit non-zero at the end. */
#ifndef ACL_SWIGLU_EMU_TEST_H
#define ACL_SWIGLU_EMU_TEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bits of a float and the float of some bits, for exact comparisons. */
static inline uint32_t bits_f(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float f_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Counted atomically: some tests check from several threads at once. */
static int emu_test_failures;
static int emu_test_checks;
#define EMU_TEST_COUNT(counter) __atomic_fetch_add(&(counter), 1, __ATOMIC_RELAXED)

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        EMU_TEST_COUNT(emu_test_checks);                                                     \
        if (!(cond)) {                                                                       \
            EMU_TEST_COUNT(emu_test_failures);                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECK_EQ_INT(actual, expected)                                                       \
    do {                                                                                     \
        long long a_ = (long long)(actual), e_ = (long long)(expected);                      \
        EMU_TEST_COUNT(emu_test_checks);                                                     \
        if (a_ != e_) {                                                                      \
            EMU_TEST_COUNT(emu_test_failures);                                               \
            fprintf(stderr, "%s:%d: %s is %lld, expected %lld\n", __FILE__, __LINE__,        \
                    #actual, a_, e_);                                                        \
        }                                                                                    \
    } while (0)

/* The call returns `code` and the thread's message names every fragment given. */
#define CHECK_FAILS(call, code, ...)                                                         \
    do {                                                                                     \
        long long got_ = (long long)(call);                                                  \
        EMU_TEST_COUNT(emu_test_checks);                                                     \
        if (got_ != (long long)(code)) {                                                     \
            EMU_TEST_COUNT(emu_test_failures);                                               \
            fprintf(stderr, "%s:%d: %s returned %lld, expected %lld\n", __FILE__, __LINE__,  \
                    #call, got_, (long long)(code));                                         \
        }                                                                                    \
        emu_check_message(__FILE__, __LINE__, #call, (const char *[]){__VA_ARGS__, NULL});   \
    } while (0)

static inline void emu_check_message(const char *file, int line, const char *what,
                                     const char *const *fragments)
{
    extern const char *aclGetRecentErrMsg(void);
    const char *message = aclGetRecentErrMsg();
    EMU_TEST_COUNT(emu_test_checks);
    if (message == NULL) {
        EMU_TEST_COUNT(emu_test_failures);
        fprintf(stderr, "%s:%d: %s left no error message\n", file, line, what);
        return;
    }
    for (; *fragments != NULL; fragments++) {
        if (strstr(message, *fragments) == NULL) {
            EMU_TEST_COUNT(emu_test_failures);
            fprintf(stderr, "%s:%d: %s: message \"%s\" lacks \"%s\"\n", file, line, what, message,
                    *fragments);
        }
    }
}

static inline int emu_test_finish(const char *name)
{
    int failures = __atomic_load_n(&emu_test_failures, __ATOMIC_RELAXED);
    int checks = __atomic_load_n(&emu_test_checks, __ATOMIC_RELAXED);
    if (failures) {
        fprintf(stderr, "%s: %d of %d checks failed\n", name, failures, checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", name, checks);
    return 0;
}

#endif
