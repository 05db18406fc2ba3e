/* The operator's seven tensor parameters in the order of its phase-1 prototype, with the names
 * its messages give them. */
#ifndef ACL_SWIGLU_EMU_OPERATOR_PARAMS_H
#define ACL_SWIGLU_EMU_OPERATOR_PARAMS_H

#include <stddef.h>

enum {
    /* inputs */
    OP_PARAM_GRAD_Y, OP_PARAM_X, OP_PARAM_WEIGHT, OP_PARAM_Y_ORIGIN, OP_PARAM_GROUP_INDEX,
    /* outputs */
    OP_PARAM_GRAD_X, OP_PARAM_GRAD_WEIGHT,
    OP_PARAMS,
    OP_INPUTS = OP_PARAM_GRAD_X
};

static inline const char *op_param_name(size_t param)
{
    static const char *const names[OP_PARAMS] = {
        "gradY", "x", "weightOptional", "yOriginOptional", "groupIndexOptional", "gradXOut",
        "gradWeightOutOptional"};
    return names[param];
}

#endif
