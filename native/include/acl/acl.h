/*
 * acl-swiglu: the ACL entry header (initialisation, error text, runtime).
 * Written for this project from the facts in docs/c_abi.md; values match CANN.
 */
#ifndef ACL_SWIGLU_ACL_H
#define ACL_SWIGLU_ACL_H

#include "acl/acl_base.h"
#include "acl/acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
ACL_FUNC_VISIBILITY aclError aclFinalize(void);

/* The calling thread's failure texts since it last asked, newest first, one per line; NULL when
 * there are none. Reading clears them; only the latest returned text stays valid (until this
 * thread's next call). */
ACL_FUNC_VISIBILITY const char *aclGetRecentErrMsg(void);

#ifdef __cplusplus
}
#endif

#endif /* ACL_SWIGLU_ACL_H */
