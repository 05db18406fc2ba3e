/*
 * Every handle the emulator hands out (tensor, int array, executor, stream, allocation) is
 * recorded here, so that any pointer a caller passes back can be told apart from a foreign or
 * dead one, and live handles can be counted for leak tests.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/emu_internal.h"
#include "runtime/registry.h"

#define EMPTY_SLOT ((uintptr_t)0)
#define TOMBSTONE ((uintptr_t)1)
#define GRAVEYARD_SIZE 512

typedef struct {
    uintptr_t key;
    int kind;
} registry_slot;

typedef struct {
    uintptr_t key;
    int kind;
    const char *reason;
} grave;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static registry_slot *slots;
static size_t slot_capacity;   /* power of two */
static size_t slot_used;       /* live + tombstones */
static int64_t live_by_kind[ACL_EMU_KIND_COUNT];
static grave graveyard[GRAVEYARD_SIZE];
static size_t graveyard_next;

static const char *const kind_names[ACL_EMU_KIND_COUNT] = {
#define KIND_NAME(suffix, value, name) [value] = name,
    ACL_EMU_HANDLE_KINDS(KIND_NAME)
#undef KIND_NAME
};

const char *aclEmu_kind_name(aclEmuHandleKind kind)
{
    if ((int)kind < 0 || kind >= ACL_EMU_KIND_COUNT) {
        return "unknown handle";
    }
    return kind_names[kind];
}

static const char *article(const char *noun)
{
    return strchr("aeiouAEIOU", noun[0]) != NULL ? "an" : "a";
}

static size_t hash_pointer(uintptr_t key)
{
    uint64_t h = (uint64_t)key;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return (size_t)h;
}

/* Slot holding `key`, or NULL. Caller holds the lock. */
static registry_slot *find_slot(uintptr_t key)
{
    if (slot_capacity == 0) {
        return NULL;
    }
    size_t mask = slot_capacity - 1;
    for (size_t i = hash_pointer(key) & mask, probes = 0; probes < slot_capacity;
         i = (i + 1) & mask, probes++) {
        if (slots[i].key == EMPTY_SLOT) {
            return NULL;
        }
        if (slots[i].key == key) {
            return &slots[i];
        }
    }
    return NULL;
}

static void insert_slot(registry_slot *table, size_t capacity, uintptr_t key, int kind)
{
    size_t mask = capacity - 1;
    size_t i = hash_pointer(key) & mask;
    while (table[i].key != EMPTY_SLOT && table[i].key != TOMBSTONE) {
        i = (i + 1) & mask;
    }
    table[i].key = key;
    table[i].kind = kind;
}

/* Keeps the table at most half full; returns 0 when memory ran out. Caller holds the lock. */
static int reserve_slot(void)
{
    if ((slot_used + 1) * 2 <= slot_capacity) {
        return 1;
    }
    size_t live = 0;
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) {
        live += (size_t)live_by_kind[k];
    }
    size_t capacity = slot_capacity ? slot_capacity : 256;
    while ((live + 1) * 4 > capacity) {
        capacity *= 2;
    }
    registry_slot *table = calloc(capacity, sizeof *table);
    if (table == NULL) {
        return 0;
    }
    for (size_t i = 0; i < slot_capacity; i++) {
        if (slots[i].key != EMPTY_SLOT && slots[i].key != TOMBSTONE) {
            insert_slot(table, capacity, slots[i].key, slots[i].kind);
        }
    }
    free(slots);
    slots = table;
    slot_capacity = capacity;
    slot_used = live;
    return 1;
}

void aclEmu_handle_add(aclEmuHandleKind kind, const void *handle)
{
    uintptr_t key = (uintptr_t)handle;
    pthread_mutex_lock(&registry_lock);
    if (reserve_slot()) {
        insert_slot(slots, slot_capacity, key, (int)kind);
        slot_used++;
        live_by_kind[kind]++;
    } else {
        /* Without room the handle would be unknown to every later check; that only happens
         * when the host itself is out of memory, so say so loudly. */
        fprintf(stderr, "acl-swiglu emulator: out of memory recording a %s handle\n",
                aclEmu_kind_name(kind));
    }
    pthread_mutex_unlock(&registry_lock);
}

int aclEmu_handle_remove(aclEmuHandleKind kind, const void *handle, const char *reason)
{
    uintptr_t key = (uintptr_t)handle;
    int removed = 0;
    pthread_mutex_lock(&registry_lock);
    registry_slot *slot = find_slot(key);
    if (slot != NULL && slot->kind == (int)kind) {
        slot->key = TOMBSTONE;
        live_by_kind[kind]--;
        graveyard[graveyard_next] = (grave){key, (int)kind, reason};
        graveyard_next = (graveyard_next + 1) % GRAVEYARD_SIZE;
        removed = 1;
    }
    pthread_mutex_unlock(&registry_lock);
    return removed;
}

int aclEmu_handle_is(aclEmuHandleKind kind, const void *handle)
{
    uintptr_t key = (uintptr_t)handle;
    if (key == EMPTY_SLOT || key == TOMBSTONE) {
        return 0;
    }
    pthread_mutex_lock(&registry_lock);
    registry_slot *slot = find_slot(key);
    int live = slot != NULL && slot->kind == (int)kind;
    pthread_mutex_unlock(&registry_lock);
    return live;
}

void aclEmu_handle_describe(aclEmuHandleKind kind, const void *handle, char *buf, size_t size)
{
    uintptr_t key = (uintptr_t)handle;
    const char *wanted = aclEmu_kind_name(kind);
    pthread_mutex_lock(&registry_lock);
    registry_slot *slot = key > TOMBSTONE ? find_slot(key) : NULL;
    if (slot != NULL) {
        const char *actual = aclEmu_kind_name(slot->kind);
        snprintf(buf, size, "%p is a live %s, not %s %s", handle, actual, article(wanted),
                 wanted);
        pthread_mutex_unlock(&registry_lock);
        return;
    }
    /* Newest first, so that a reused address reports its latest fate. */
    for (size_t n = 0; n < GRAVEYARD_SIZE; n++) {
        const grave *g = &graveyard[(graveyard_next + GRAVEYARD_SIZE - 1 - n) % GRAVEYARD_SIZE];
        if (g->key == key && g->reason != NULL) {
            const char *kind = aclEmu_kind_name(g->kind);
            snprintf(buf, size, "%p is %s %s that was already %s", handle, article(kind), kind,
                     g->reason);
            pthread_mutex_unlock(&registry_lock);
            return;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    snprintf(buf, size, "%p is not %s %s made by this library", handle, article(wanted), wanted);
}

int aclEmu_require_handle(const char *api, int code, const char *what, aclEmuHandleKind kind,
                          const void *handle)
{
    if (aclEmu_handle_is(kind, handle)) {
        return 0;
    }
    char why[200];
    aclEmu_handle_describe(kind, handle, why, sizeof why);
    return aclEmu_fail(code, api, "%s: %s", what, why);
}

int64_t aclEmu_live_count(aclEmuHandleKind kind)
{
    pthread_mutex_lock(&registry_lock);
    int64_t n = live_by_kind[kind];
    pthread_mutex_unlock(&registry_lock);
    return n;
}

EMU_EXPORT int64_t aclEmuLiveCount(aclEmuHandleKind kind)
{
    if ((int)kind < 0 || kind >= ACL_EMU_KIND_COUNT) {
        return -1;
    }
    return aclEmu_live_count(kind);
}

EMU_EXPORT int64_t aclEmuLiveHandles(aclEmuHandleKind kind, void **handles, int64_t capacity)
{
    if ((int)kind < 0 || kind >= ACL_EMU_KIND_COUNT || capacity < 0 || (handles == NULL && capacity > 0)) {
        return -1;
    }
    int64_t found = 0;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < slot_capacity; i++) {
        if (slots[i].key != EMPTY_SLOT && slots[i].key != TOMBSTONE && slots[i].kind == (int)kind) {
            if (found < capacity) {
                handles[found] = (void *)slots[i].key;
            }
            found++;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

int64_t aclEmu_report_live_handles(FILE *out)
{
    pthread_mutex_lock(&registry_lock);
    int64_t total = 0;
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) {
        total += live_by_kind[k];
    }
    if (total == 0) {
        pthread_mutex_unlock(&registry_lock);
        fprintf(out, "acl-swiglu emulator: leak check at aclFinalize: no live handles\n");
        return 0;
    }
    fprintf(out, "acl-swiglu emulator: leak check at aclFinalize: %lld live handle(s):",
            (long long)total);
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) {
        fprintf(out, "%s %lld %s", k ? "," : "", (long long)live_by_kind[k], kind_names[k]);
    }
    fputc('\n', out);
    for (size_t i = 0; i < slot_capacity; i++) {
        if (slots[i].key != EMPTY_SLOT && slots[i].key != TOMBSTONE) {
            fprintf(out, "  leaked %s %p\n", aclEmu_kind_name(slots[i].kind),
                    (void *)slots[i].key);
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return total;
}

/* At unload (dlclose, or exit): release the table when no handle is live, so that unloading the
 * library leaks nothing. With live handles it stays: they are the caller's leak, and another
 * thread may still be using them while the process exits. */
__attribute__((destructor)) static void registry_unload(void)
{
    pthread_mutex_lock(&registry_lock);
    int64_t live = 0;
    for (int k = 0; k < ACL_EMU_KIND_COUNT; k++) {
        live += live_by_kind[k];
    }
    if (live == 0) {
        free(slots);
        slots = NULL;
        slot_capacity = 0;
        slot_used = 0;
    }
    pthread_mutex_unlock(&registry_lock);
}

void aclEmu_registry_lock_for_fork(void) { pthread_mutex_lock(&registry_lock); }
void aclEmu_registry_unlock_after_fork(void) { pthread_mutex_unlock(&registry_lock); }
