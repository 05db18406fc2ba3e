/* The release behaviours the emulator reproduces (docs/emulator.md, Releases): on 9.1.0, 9.1.1
 * and 9.2.0-beta.1 a launch whose groups leave 0 < trunc < min(T, vector cores) rows fails at
 * synchronisation with 507034 (the device would hang) and writes nothing; from 9.2.0-beta.2 it
 * runs. From 9.2.0 a clamp with |c + 1| <= 1e-6 (and NaN) is off; before, only -1.0f is. The
 * release and the core count are read once per process, so each release runs in a child. */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "acl_emu/acl_emu.h"
#include "emu_problem.h"
#include "emu_session.h"

#define CHILD_FLAG "--release-child"
#define CORES 8

static aclrtStream g_stream;
static void *g_workspace;   /* WS_BYTES of device memory */

/* One launch of T rows (H = 8, with weight) and these groups; returns the synchronisation's
 * status. On failure the message must hold `fragment`. */
static int launch_groups(int64_t T, int64_t G, const int64_t *groups, int *outputs_untouched,
                         const char *fragment)
{
    prob p;
    prob_init(&p, T, 8, 1, G, groups, (unsigned)(T * 31 + G), 1);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    int rc = -1;
    if (ex != NULL) {
        CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(g_workspace, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
        rc = aclrtSynchronizeStream(g_stream);
    }
    if (rc != 0) {
        const char *message = aclGetRecentErrMsg();
        CHECK(message != NULL && strstr(message, fragment) != NULL);
        if (message != NULL && strstr(message, fragment) == NULL) fprintf(stderr, "message: %s\n", message);
    }
    *outputs_untouched = all_ff(p.dgx, (size_t)(T * 16) * sizeof(float)) &&
                         all_ff(p.dgw, (size_t)T * sizeof(float));
    if (rc == 0) {
        CHECK_EQ_INT(verify(&p, expected_trunc(groups, G, T), 0, 0.0), 0);
    }
    prob_free(&p);
    return rc;
}

static void check_deadlock_releases(const char *release, int hangs)
{
    static const int64_t three[] = {3}, seven[] = {7}, eight[] = {8}, zero[] = {0}, split[] = {1, 2},
                         wraps_to_two[] = {(int64_t)1 << 32, 2};
    int unwritten = 0;
    char fragment[64];
    snprintf(fragment, sizeof fragment, "CANN %s", release);
    /* T = 16 rows on 8 cores: the kernel runs 8 blocks, so 0 < trunc < 8 deadlocks. */
    const struct {
        int64_t T, G;
        const int64_t *groups;
        int deadlocks;
    } cases[] = {
        {16, 1, three, 1},        {16, 1, seven, 1},  {16, 2, split, 1}, {16, 2, wraps_to_two, 1},
        {16, 1, eight, 0},        {16, 1, zero, 0},   {16, 0, NULL, 0},  {16, -1, NULL, 0},
        {4, 1, three, 1},   /* T = 4 < 8 cores: 4 blocks, trunc 3 < 4 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int rc = launch_groups(cases[i].T, cases[i].G, cases[i].groups, &unwritten,
                               cases[i].deadlocks ? fragment : "");
        int expect = hangs && cases[i].deadlocks;
        CHECK_EQ_INT(rc, expect ? ACL_ERROR_RT_VECTOR_CORE_TIMEOUT : ACL_SUCCESS);
        CHECK_EQ_INT(unwritten, expect);
        if (rc != (expect ? ACL_ERROR_RT_VECTOR_CORE_TIMEOUT : ACL_SUCCESS)) {
            fprintf(stderr, "%s: case %zu gave %d\n", release, i, rc);
        }
    }
    if (!hangs) return;
    /* The message says what happened and why, with the numbers. */
    prob p;
    prob_init(&p, 16, 8, 0, 1, three, 5, 1);
    aclOpExecutor *ex = phase1_ok(&p, -1.0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(g_workspace, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
    CHECK_FAILS(aclrtSynchronizeStream(g_stream), ACL_ERROR_RT_VECTOR_CORE_TIMEOUT, "aclrtSynchronizeStream",
                fragment, "would hang", "trunc = 3 of T = 16", "min(T, 8 vector cores) = 8", "9.2.0-beta.2");
    prob_free(&p);
}

/* The clamp values whose meaning changes with the release: within 1e-6 of -1 in fp32, and NaN. */
static void check_clamp_band(int band)
{
    static const int64_t none[] = {0};
    prob p;
    prob_init(&p, 4, 8, 1, -1, none, 9, 1);
    const double in_band[] = {-1.0000001, -1.0 - 8 * 0x1p-23, -1.0 + 16 * 0x1p-24, NAN};
    for (size_t i = 0; i < sizeof in_band / sizeof in_band[0]; i++) {
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        if (band) {
            CHECK_EQ_INT(phase1(&p, in_band[i], &ws, &ex), ACLNN_SUCCESS);
            if (ex != NULL) {
                CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(g_workspace, WS_BYTES, ex, g_stream), ACLNN_SUCCESS);
                CHECK_EQ_INT(aclrtSynchronizeStream(g_stream), ACL_SUCCESS);
                CHECK_EQ_INT(verify(&p, 4, 0, 0.0), 0);   /* computed without clamp */
            }
        } else {
            CHECK_FAILS(phase1(&p, in_band[i], &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clampLimit",
                        "or -1.0 for off");
            CHECK(ex == NULL);
        }
    }
    /* Just outside the band: refused by every release. */
    const double outside[] = {-1.0 - 9 * 0x1p-23, -1.0 + 17 * 0x1p-24};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++) {
        uint64_t ws = 0;
        aclOpExecutor *ex = NULL;
        CHECK_FAILS(phase1(&p, outside[i], &ws, &ex), ACLNN_ERR_INNER_TILING_ERROR, "clampLimit",
                    band ? "|c + 1| <= 1e-6" : "or -1.0 for off");
    }
    prob_free(&p);
}

typedef struct {
    const char *release;
    int hangs;
    int band;
} release_case;

static const release_case releases[] = {
    {"9.1.0", 1, 0}, {"9.1.1", 1, 0}, {"9.2.0-beta.1", 1, 0}, {"9.2.0-beta.2", 0, 0}, {"9.2.0", 0, 1},
};
#define RELEASES (sizeof releases / sizeof releases[0])

static int child(const release_case *r)
{
    emu_session s = emu_session_begin(EMU_SESSION_DEVICE_STREAM);
    g_stream = s.stream;
    g_workspace = dev_alloc(WS_BYTES);
    check_deadlock_releases(r->release, r->hangs);
    check_clamp_band(r->band);
    CHECK_EQ_INT(aclrtFree(g_workspace), ACL_SUCCESS);
    emu_session_end(&s);
    char name[96];
    snprintf(name, sizeof name, "test_release_emulation (%s)", r->release);
    return emu_test_finish(name);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], CHILD_FLAG) == 0) {
        for (size_t i = 0; i < RELEASES; i++) {
            if (strcmp(argv[2], releases[i].release) == 0) return child(&releases[i]);
        }
        return 4;
    }
    for (size_t i = 0; i < RELEASES; i++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            setenv("ACL_EMU_CANN_VERSION", releases[i].release, 1);
            char cores[16];
            snprintf(cores, sizeof cores, "%d", CORES);
            setenv("ACL_EMU_VECTOR_CORES", cores, 1);
            const char *launcher = getenv("ACL_EMU_TEST_LAUNCHER");
            if (launcher != NULL && launcher[0] != '\0') {
                execlp(launcher, launcher, argv[0], CHILD_FLAG, releases[i].release, (char *)NULL);
            } else {
                execl("/proc/self/exe", "test_release_emulation", CHILD_FLAG, releases[i].release, (char *)NULL);
            }
            _exit(3);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fprintf(stderr, "release %s failed\n", releases[i].release);
    }
    return emu_test_finish("test_release_emulation");
}
