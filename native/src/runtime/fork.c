/*
 * Fork safety: before a fork, every lock of libascendcl.so is taken, outermost first, so that
 * the child never inherits one held by a thread that does not exist there. Taking a stream's
 * run lock waits for a drain in progress to finish, so the child's streams are idle.
 * (libnnopbase.so registers its executor lock the same way; it is loaded later, so its handler
 * runs first and that lock, the outermost, is taken before these.)
 */
#include <pthread.h>

#include "runtime/blocks.h"
#include "runtime/device.h"
#include "runtime/fault.h"
#include "runtime/memory.h"
#include "runtime/registry.h"
#include "runtime/stream.h"

static void before_fork(void)
{
    aclEmu_device_lock_for_fork();
    aclEmu_streams_lock_for_fork();
    aclEmu_mem_lock_for_fork();
    aclEmu_registry_lock_for_fork();
    aclEmu_fault_lock_for_fork();
    aclEmu_blocks_lock_for_fork();
}

static void after_fork_in_parent(void)
{
    aclEmu_blocks_unlock_after_fork();
    aclEmu_fault_unlock_after_fork();
    aclEmu_registry_unlock_after_fork();
    aclEmu_mem_unlock_after_fork();
    aclEmu_streams_unlock_after_fork();
    aclEmu_device_unlock_after_fork();
}

static void after_fork_in_child(void)
{
    aclEmu_blocks_unlock_after_fork();
    aclEmu_fault_unlock_after_fork();
    aclEmu_registry_unlock_after_fork();
    aclEmu_mem_reset_in_child();
    aclEmu_streams_unlock_after_fork();
    aclEmu_device_unlock_after_fork();
}

__attribute__((constructor)) static void register_fork_handlers(void)
{
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);
}
