/*
 * Frees a handle the package owns and clears the package's copy of it in one call. The caller
 * cannot be interrupted inside a C call: an exception that reaches it before this call finds the
 * handle still there (and frees it later), one after it finds it gone (and never frees it twice).
 * A destroy that fails leaves the handle where it was.
 */
#include "helper.h"

/* Every destroy the package calls has this form: aclrtFree, aclrtDestroyStream, aclDestroyTensor,
 * aclDestroyIntArray and aclDestroyAclOpExecutor all take the handle and return a status. */
typedef int32_t (*helper_destroy)(void *handle);

HELPER_EXPORT int32_t acl_swiglu_destroy(helper_destroy destroy, void **handle)
{
    void *owned = *handle;
    if (owned == NULL) {
        return 0;
    }
    *handle = NULL;
    int32_t status = destroy(owned);
    if (status != 0) {
        *handle = owned;   /* not freed: still there (a stream whose destroy failed still has its work) */
    }
    return status;
}
