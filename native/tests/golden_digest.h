/*
 * What the golden-digest tests (test_golden.c for the backward, test_forward_golden.c for the
 * forward) have in common: the integer-only input generator, the output digest, device tensors
 * uploaded through the public ACL path, and the lookup and comparison of a case's two digests
 * with its row of a table.
 *
 * The generator is splitmix64 and the digest 64-bit FNV-1a over the output bytes. FNV-1a is
 * enough here: the outputs are not chosen by an adversary, and any change of output bits
 * escapes detection with probability about 2^-64. tests/forward_model.py implements the same
 * generator and digest for the forward's table, so neither may change on its own.
 */
#ifndef ACL_SWIGLU_TESTS_GOLDEN_DIGEST_H
#define ACL_SWIGLU_TESTS_GOLDEN_DIGEST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "acl/acl.h"
#include "emu_test.h"

static inline uint64_t golden_next_random(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t golden_fnv1a64(const void *data, size_t size)
{
    const unsigned char *p = data;
    uint64_t h = 0xCBF29CE484222325ull;
    for (size_t i = 0; i < size; i++) h = (h ^ p[i]) * 0x100000001B3ull;
    return h;
}

/* ---- the runtime around the cases ---- */

/* aclInit, device 0 and a stream for the cases: 0, or -1 after saying that `test` could not
 * start. */
static inline int golden_open(const char *test, aclrtStream *stream)
{
    *stream = NULL;
    if (aclInit(NULL) != ACL_SUCCESS || aclrtSetDevice(0) != ACL_SUCCESS || aclrtCreateStream(stream) != ACL_SUCCESS) {
        fprintf(stderr, "%s: ACL setup failed\n", test);
        return -1;
    }
    return 0;
}

static inline void golden_close(aclrtStream stream)
{
    aclrtDestroyStream(stream);
    aclrtResetDevice(0);
    aclFinalize();
}

/* ---- device tensors through the public path ---- */

typedef struct {
    void *device;
    aclTensor *tensor;
} golden_tensor;

/* A device copy of `host` (or `bytes` of `fill` when host is NULL) and its ND tensor. */
static inline int golden_upload(golden_tensor *t, const void *host, size_t bytes, int fill, aclDataType dtype,
                                const int64_t *dims, uint64_t ndim)
{
    t->device = NULL;
    t->tensor = NULL;
    if (aclrtMalloc(&t->device, bytes, ACL_MEM_MALLOC_HUGE_FIRST) != ACL_SUCCESS) return -1;
    int status = host != NULL ? aclrtMemcpy(t->device, bytes, host, bytes, ACL_MEMCPY_HOST_TO_DEVICE)
                              : aclrtMemset(t->device, bytes, fill, bytes);
    if (status != ACL_SUCCESS) return -1;
    t->tensor = aclCreateTensor(dims, ndim, dtype, NULL, 0, ACL_FORMAT_ND, dims, ndim, t->device);
    return t->tensor != NULL ? 0 : -1;
}

static inline void golden_release(golden_tensor *t)
{
    if (t->tensor != NULL) aclDestroyTensor(t->tensor);
    if (t->device != NULL) aclrtFree(t->device);
}

/* Prints why a case's call failed, as the runtime reports it. */
static inline void golden_report_failure(const char *test)
{
    const char *message = aclGetRecentErrMsg();
    fprintf(stderr, "%s: the call failed: %s\n", test, message ? message : "(no message)");
}

/* ---- the table ---- */

/* One case's row: its name and the digests of its two outputs. */
typedef struct {
    const char *name;
    uint64_t first;
    uint64_t second;
} golden_digest;

/* A table and the words its test's messages use for it. */
typedef struct {
    const char *test;                  /* the program, for messages */
    const golden_digest *rows;
    size_t count;
    const char *missing_hint;          /* after "no digest for <case> in ", e.g. where the table comes from */
    const char *first_name, *second_name;   /* the two outputs */
    const char *source;                /* what computed the table: "golden", "model" */
} golden_table;

/* Checks the digests of case `name` against its row; a missing row or a difference is a failure
 * that says which case and both values. */
static inline void golden_check(const golden_table *table, const char *name, uint64_t first, uint64_t second)
{
    const golden_digest *row = NULL;
    for (size_t i = 0; i < table->count && row == NULL; i++) {
        if (strcmp(table->rows[i].name, name) == 0) row = &table->rows[i];
    }
    CHECK(row != NULL);
    if (row == NULL) {
        fprintf(stderr, "%s: no digest for \"%s\" in %s\n", table->test, name, table->missing_hint);
        return;
    }
    CHECK(first == row->first);
    CHECK(second == row->second);
    if (first != row->first || second != row->second) {
        fprintf(stderr, "%s: %s: %s 0x%016llx (%s 0x%016llx), %s 0x%016llx (%s 0x%016llx)\n", table->test, name,
                table->first_name, (unsigned long long)first, table->source, (unsigned long long)row->first,
                table->second_name, (unsigned long long)second, table->source, (unsigned long long)row->second);
    }
}

#endif
