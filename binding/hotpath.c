/*
 * The binding's hot path in C: a plan call is phase 2 and, optionally, a stream
 * synchronisation, made here from function pointers the Python side took from whichever
 * libraries it loaded (real CANN or the emulator).
 *
 * A repeated call with nothing to rebind is one ctypes call: this file also holds the checks
 * such a call needs (who owns the plan, whether anything was closed since the plan last looked,
 * whether the caller's view of the outputs is current), so that the Python side of it is a
 * single crossing. Anything those checks refuse goes back to Python, which takes its own lock,
 * then owns the plan here (hot_claim) while it rebinds, checks and launches.
 * This library links to no ACL library: it only calls what it is given.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <time.h>

#if defined(_WIN32)
#define HOTPATH_EXPORT
#else
#define HOTPATH_EXPORT __attribute__((visibility("default")))
#endif

typedef int32_t (*launch_fn)(void *workspace, uint64_t workspace_size, void *executor, void *stream);
typedef int (*synchronize_fn)(void *stream);

/* What a call's result says in its upper 32 bits; the lower 32 hold a failed call's status. */
enum {
    HOT_DONE = 0,       /* launched (and synchronised): the result is 0 */
    HOT_LAUNCH_FAILED,  /* phase 2 returned the status */
    HOT_SYNC_FAILED,    /* aclrtSynchronizeStream returned the status (phase 2 succeeded) */
    HOT_BUSY,           /* another call owns the plan: nothing was done */
    HOT_CHECK,          /* the plan must be checked from Python first: nothing was done */
    HOT_OVERLAP         /* launched, but something was closed meanwhile: Python decides */
};

/* Laid out as the binding's ctypes structure of the same fields, in this order. */
typedef struct {
    launch_fn launch;            /* the operator's phase 2 */
    synchronize_fn synchronize;  /* aclrtSynchronizeStream */
    void *workspace;
    uint64_t workspace_size;
    void *executor;
    void *stream;
    const int64_t *close_epoch;  /* moves at every close of any handle (written by Python) */
    int64_t checked_at;          /* the close epoch the bindings were last checked at, or -1 */
    uint64_t thread;             /* the thread allowed the one-crossing call (its this_thread()), or 0 */
    int32_t generation;          /* moves at every change of the outputs the plan returns (mod 2^31) */
    uint64_t owner;              /* the thread (this_thread()) of the call that owns the plan, or 0 */
} hot_plan;

/* A number for the calling thread, never 0 and never given to another thread of the process:
 * unlike pthread_self(), which a new thread may get from one that ended (and that one's plan
 * checks with it). */
static __thread uint64_t thread_number;
static uint64_t next_thread_number = 1;

static uint64_t this_thread(void)
{
    uint64_t number = thread_number;
    if (number == 0) {
        number = __atomic_fetch_add(&next_thread_number, 1, __ATOMIC_RELAXED);
        thread_number = number;
    }
    return number;
}

static int64_t result_of(int32_t kind, int32_t status)
{
    return (int64_t)(((uint64_t)(uint32_t)kind << 32) | (uint32_t)status);
}

static int try_claim(hot_plan *plan, uint64_t self)
{
    uint64_t free_now = 0;
    return __atomic_compare_exchange_n(&plan->owner, &free_now, self, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
}

/* Lets go of the plan if this thread owns it (else does nothing: a Python call interrupted
 * before its claim must not release another thread's). */
static void release(hot_plan *plan, uint64_t self)
{
    uint64_t mine = self;
    __atomic_compare_exchange_n(&plan->owner, &mine, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}

static int64_t epoch_now(const hot_plan *plan)
{
    return __atomic_load_n(plan->close_epoch, __ATOMIC_ACQUIRE);
}

static int64_t launch_owned(hot_plan *plan, int synchronize)
{
    int32_t status = plan->launch(plan->workspace, plan->workspace_size, plan->executor, plan->stream);
    if (status != 0) {
        return result_of(HOT_LAUNCH_FAILED, status);
    }
    if (synchronize) {
        status = plan->synchronize(plan->stream);
        if (status != 0) {
            return result_of(HOT_SYNC_FAILED, status);
        }
    }
    return 0;
}

static int64_t call_unowned(hot_plan *plan, int32_t generation, int synchronize)
{
    uint64_t self = this_thread();
    if (!try_claim(plan, self)) {
        return result_of(HOT_BUSY, 0);
    }
    int64_t checked_at = plan->checked_at;
    if (plan->thread != self || plan->generation != generation || checked_at < 0 ||
        epoch_now(plan) != checked_at) {
        release(plan, self);
        return result_of(HOT_CHECK, 0);
    }
    int64_t result = launch_owned(plan, synchronize);
    if (result == 0 && epoch_now(plan) != checked_at) {
        result = result_of(HOT_OVERLAP, 0);
    }
    release(plan, self);
    return result;
}

/* The calling thread's number, for the Python side to authorise it (hot_plan.thread). */
HOTPATH_EXPORT uint64_t acl_swiglu_hot_thread(void)
{
    return this_thread();
}

/* A plan call with nothing to rebind, by a caller that saw the outputs of `generation`. */
HOTPATH_EXPORT int64_t acl_swiglu_hot_launch(hot_plan *plan, int32_t generation)
{
    return call_unowned(plan, generation, 0);
}

HOTPATH_EXPORT int64_t acl_swiglu_hot_launch_synchronize(hot_plan *plan, int32_t generation)
{
    return call_unowned(plan, generation, 1);
}

/* Owns the plan for Python's own call (or close), waiting for a call in C to end. Whoever
 * owns it is either in C, where it cannot block, or holds the plan's Python lock, which the
 * caller holds: the wait is bounded by one launch. The caller holding the lock cannot own the
 * plan already, unless an exception cut its last call short between claim and release: that
 * stale claim is its own, and taken as made (a wait for itself would never end). */
HOTPATH_EXPORT void acl_swiglu_hot_claim(hot_plan *plan)
{
    uint64_t self = this_thread();
    struct timespec pause = {0, 1000};
    if (__atomic_load_n(&plan->owner, __ATOMIC_ACQUIRE) == self) {
        return;
    }
    while (!try_claim(plan, self)) {
        nanosleep(&pause, NULL);
        if (pause.tv_nsec < 1000000) {
            pause.tv_nsec *= 2;
        }
    }
}

HOTPATH_EXPORT void acl_swiglu_hot_release(hot_plan *plan)
{
    release(plan, this_thread());
}

/* Phase 2 (and the synchronisation) for the Python call that owns the plan. */
HOTPATH_EXPORT int64_t acl_swiglu_hot_launch_owned(hot_plan *plan, int32_t synchronize)
{
    return launch_owned(plan, synchronize != 0);
}
