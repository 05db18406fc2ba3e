/*
 * The CANN release and the device the emulator stands in for, as libascendcl.so tells the
 * operator libraries (ACL_EMU_CANN_VERSION, ACL_EMU_VECTOR_CORES; docs/emulator.md), and the
 * one parser of release strings that the runtime and the kernel's tiling share.
 */
#ifndef ACL_SWIGLU_EMU_RELEASE_H
#define ACL_SWIGLU_EMU_RELEASE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A release as a key that sorts like the releases: major, minor, patch, stage (alpha 0, beta 1,
 * rc 2, the release itself 3), the stage's number. */
#define EMU_RELEASE_KEY_PARTS 5
#define EMU_RELEASE_STAGE_FINAL 3

/* "M.m.p" with an optional leading 'v' and an optional "-alpha.N", "-beta.N" or "-rc.N" (which
 * come before M.m.p itself, in that order). Fills `key`; 0 on success, -1 for anything else. */
static inline int emu_release_key(const char *text, int64_t key[EMU_RELEASE_KEY_PARTS])
{
    static const char *const stages[] = {"alpha", "beta", "rc"};
    const char *p = text;
    if (p == NULL) return -1;
    if (*p == 'v') p++;
    for (int part = 0; part < 3; part++) {
        if (*p < '0' || *p > '9') return -1;
        char *end = NULL;
        unsigned long value = strtoul(p, &end, 10);
        if (value > 100000) return -1;
        key[part] = (int64_t)value;
        p = end;
        if (part < 2 && *p++ != '.') return -1;
    }
    key[3] = EMU_RELEASE_STAGE_FINAL;
    key[4] = 0;
    if (*p == '\0') return 0;
    if (*p++ != '-') return -1;
    for (int s = 0; s < 3; s++) {
        size_t length = strlen(stages[s]);
        if (strncmp(p, stages[s], length) == 0 && p[length] == '.') {
            const char *digits = p + length + 1;
            if (*digits < '0' || *digits > '9') return -1;
            char *end = NULL;
            unsigned long value = strtoul(digits, &end, 10);
            if (*end != '\0' || value > 100000) return -1;
            key[3] = s;
            key[4] = (int64_t)value;
            return 0;
        }
    }
    return -1;
}

/* 1 when release a comes before release b. */
static inline int emu_release_before(const int64_t a[EMU_RELEASE_KEY_PARTS],
                                     const int64_t b[EMU_RELEASE_KEY_PARTS])
{
    for (int i = 0; i < EMU_RELEASE_KEY_PARTS; i++) {
        if (a[i] != b[i]) return a[i] < b[i];
    }
    return 0;
}

/* The release the emulator stands in for: its name ("9.2.0", "9.2.0-beta.1", ...), and its key
 * in `key` when not NULL. Decided once per process, at the first question: ACL_EMU_CANN_VERSION
 * when it names a release the emulator knows, else (reported once on stderr) the newest. */
const char *aclEmu_release(int64_t key[EMU_RELEASE_KEY_PARTS]) __attribute__((visibility("default")));

/* The emulated device's vector (AIV) cores, the kernel's block limit: ACL_EMU_VECTOR_CORES,
 * read once per process (default 56); and its AI cores, half as many (rounded up), as the 950
 * pairs two vector cores with each cube core. */
int64_t aclEmu_vector_cores(void) __attribute__((visibility("default")));
int64_t aclEmu_ai_cores(void) __attribute__((visibility("default")));

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_EMU_RELEASE_H */
