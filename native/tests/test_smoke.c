#include <math.h>
#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"
#include "acl_emu/acl_emu.h"
#include "emu_test.h"

int main(void)
{
    CHECK_EQ_INT(aclInit(NULL), 0);
    CHECK_EQ_INT(aclrtSetDevice(0), 0);
    aclrtStream stream;
    CHECK_EQ_INT(aclrtCreateStream(&stream), 0);
    int64_t gy_shape[2] = {2, 4}, x_shape[2] = {2, 8};
    float gy[8], x[16], gx[16];
    for (int i = 0; i < 8; i++) gy[i] = 0.5f * (float)(i + 1);
    for (int i = 0; i < 16; i++) x[i] = 0.25f * (float)(i - 8);
    void *dgy, *dx, *dgx;
    CHECK_EQ_INT(aclrtMalloc(&dgy, sizeof gy, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ_INT(aclrtMalloc(&dx, sizeof x, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ_INT(aclrtMalloc(&dgx, sizeof gx, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ_INT(aclrtMemcpy(dgy, sizeof gy, gy, sizeof gy, ACL_MEMCPY_HOST_TO_DEVICE), 0);
    CHECK_EQ_INT(aclrtMemcpy(dx, sizeof x, x, sizeof x, ACL_MEMCPY_HOST_TO_DEVICE), 0);
    aclTensor *tgy = aclCreateTensor(gy_shape, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, gy_shape, 2, dgy);
    aclTensor *tx = aclCreateTensor(x_shape, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, x_shape, 2, dx);
    aclTensor *tgx = aclCreateTensor(x_shape, 2, ACL_FLOAT, NULL, 0, ACL_FORMAT_ND, x_shape, 2, dgx);
    CHECK(tgy && tx && tgx);
    uint64_t ws = 0;
    aclOpExecutor *ex = NULL;
    CHECK_EQ_INT(aclnnSwigluGroupQuantGradGetWorkspaceSize(tgy, tx, NULL, NULL, NULL, -1.0, tgx, NULL, &ws, &ex), 0);
    void *dws = NULL;
    CHECK_EQ_INT(aclrtMalloc(&dws, ws, ACL_MEM_MALLOC_HUGE_FIRST), 0);
    CHECK_EQ_INT(aclnnSwigluGroupQuantGrad(dws, ws, ex, stream), 0);
    CHECK_EQ_INT(aclrtSynchronizeStream(stream), 0);
    CHECK_EQ_INT(aclrtMemcpy(gx, sizeof gx, dgx, sizeof gx, ACL_MEMCPY_DEVICE_TO_HOST), 0);
    for (int t = 0; t < 2; t++) for (int h = 0; h < 4; h++) {
        double a = x[t*8+h], b = x[t*8+4+h], g = gy[t*4+h];
        double s = 1/(1+exp(-a));
        double e0 = g*b*s*(1+a*(1-s)), e1 = g*a*s;
        printf("%d %d: %g vs %g, %g vs %g\n", t, h, gx[t*8+h], e0, gx[t*8+4+h], e1);
        CHECK(fabs(gx[t*8+h]-e0) < 1e-5 && fabs(gx[t*8+4+h]-e1) < 1e-5);
    }
    aclDestroyTensor(tgy); aclDestroyTensor(tx); aclDestroyTensor(tgx);
    aclrtFree(dgy); aclrtFree(dx); aclrtFree(dgx); aclrtFree(dws);
    aclrtDestroyStream(stream);
    aclrtResetDevice(0);
    CHECK_EQ_INT(aclFinalize(), 0);
    return emu_test_finish("test_smoke");
}
