/* acl-swiglu: umbrella for the aclnn meta API, as operator headers expect it. */
#ifndef ACL_SWIGLU_ACLNN_BASE_H
#define ACL_SWIGLU_ACLNN_BASE_H

#include "aclnn/acl_meta.h"

#endif /* ACL_SWIGLU_ACLNN_BASE_H */
