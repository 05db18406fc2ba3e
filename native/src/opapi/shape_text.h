/*
 * A tensor's shape as message text, for the operators' phase-1 refusals (they name the shape
 * they refused).
 */
#ifndef ACL_SWIGLU_OPAPI_SHAPE_TEXT_H
#define ACL_SWIGLU_OPAPI_SHAPE_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nnopbase/launch.h"

/* Writes "[d0, d1, ...]" into buf (cut at size) and returns buf; only error paths call it. */
static inline const char *shape_text(const aclTensor *t, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "[");
    for (uint64_t i = 0; i < t->ndim && used < size; i++) {
        used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)t->dims[i]);
    }
    if (used < size) snprintf(buf + used, size - used, "]");
    return buf;
}

#endif
