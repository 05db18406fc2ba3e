/*
 * aclnnSwigluGroupQuantGrad sample: what the operator document's C++ example does, done
 * correctly against ABI revision 2:
 *  - FLOAT16 tensors get real fp16 host data (converted with round half to even), not float32
 *    bytes;
 *  - groupIndex is an INT64 device tensor {256, 256};
 *  - every failure prints the status and aclGetRecentErrMsg() and releases what was made.
 *
 * Build: see CMakeLists.txt beside this file. Runs on the CPU emulator or a CANN install.
 */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "acl/acl.h"
#include "aclnnop/aclnn_swiglu_group_quant_grad.h"

#define LOG_PRINT(message, ...)              \
    do {                                     \
        printf(message, ##__VA_ARGS__);      \
    } while (0)

/* On failure: print what failed, the status and the runtime's last message, then run
 * `return_expr` (the caller's cleanup happens in the destructor of Resources). */
#define CHECK_RET(cond, what, status, return_expr)                                  \
    do {                                                                            \
        if (!(cond)) {                                                              \
            const char *recent_ = aclGetRecentErrMsg();                             \
            LOG_PRINT("%s failed. ERROR: %d (%s)\n", what, static_cast<int>(status), \
                      recent_ != nullptr ? recent_ : "no message");                 \
            return_expr;                                                            \
        }                                                                           \
    } while (0)

namespace {

int64_t GetShapeSize(const std::vector<int64_t> &shape)
{
    int64_t size = 1;
    for (int64_t dim : shape) {
        size *= dim;
    }
    return size;
}

uint32_t FloatBits(float value)
{
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    return bits;
}

/* float -> IEEE fp16, round half to even; overflow to inf; NaN -> quiet NaN. */
uint16_t FloatToHalf(float value)
{
    uint32_t bits = FloatBits(value);
    uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
    uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude > 0x7F800000u) {
        return static_cast<uint16_t>(sign | 0x7E00u);
    }
    if (magnitude >= 0x477FF000u) { /* 65520 and up (inf included) round to inf */
        return static_cast<uint16_t>(sign | 0x7C00u);
    }
    int exponent = static_cast<int>(magnitude >> 23) - 127;
    uint32_t mantissa = (magnitude & 0x7FFFFFu) | 0x800000u; /* 24 significant bits */
    int shift;                                                /* bits dropped from the 24 */
    uint32_t base;                                            /* fp16 exponent field */
    if (exponent >= -14) {
        shift = 13;
        base = static_cast<uint32_t>(exponent + 15) << 10;
        mantissa &= 0x7FFFFFu; /* the implicit bit is in the exponent field */
    } else {
        if (magnitude < 0x33000000u) { /* below 2^-25: rounds to 0 (2^-25 itself is a tie to 0) */
            return sign;
        }
        shift = 13 + (-14 - exponent); /* subnormal: quantum 2^-24 */
        base = 0;
    }
    uint32_t kept = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u) != 0)) {
        kept += 1; /* a carry into the exponent field is the right result */
    }
    return static_cast<uint16_t>(sign | (base + kept));
}

float HalfToFloat(uint16_t half)
{
    int exponent = (half >> 10) & 0x1F;
    int mantissa = half & 0x3FF;
    float value;
    if (exponent == 0x1F) {
        value = mantissa != 0 ? NAN : INFINITY;
    } else if (exponent == 0) {
        value = std::ldexp(static_cast<float>(mantissa), -24);
    } else {
        value = std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
    }
    return (half & 0x8000u) != 0 ? -value : value;
}

/* Everything the sample makes, released in reverse order whatever happened. */
struct Resources {
    int32_t deviceId = 0;
    bool initialized = false;
    bool deviceSet = false;
    aclrtStream stream = nullptr;
    std::vector<void *> deviceBuffers;
    std::vector<aclTensor *> tensors;
    aclOpExecutor *executor = nullptr; /* owned only between the two phases */

    ~Resources()
    {
        if (executor != nullptr) {
            aclDestroyAclOpExecutor(executor);
        }
        for (aclTensor *tensor : tensors) {
            aclDestroyTensor(tensor);
        }
        for (void *buffer : deviceBuffers) {
            aclrtFree(buffer);
        }
        if (stream != nullptr) {
            aclrtDestroyStream(stream);
        }
        if (deviceSet) {
            aclrtResetDevice(deviceId);
        }
        if (initialized) {
            aclFinalize();
        }
    }
};

int Init(Resources &res)
{
    aclError ret = aclInit(nullptr);
    CHECK_RET(ret == ACL_SUCCESS, "aclInit", ret, return ret);
    res.initialized = true;
    ret = aclrtSetDevice(res.deviceId);
    CHECK_RET(ret == ACL_SUCCESS, "aclrtSetDevice", ret, return ret);
    res.deviceSet = true;
    ret = aclrtCreateStream(&res.stream);
    CHECK_RET(ret == ACL_SUCCESS, "aclrtCreateStream", ret, return ret);
    return ACL_SUCCESS;
}

int DeviceAlloc(Resources &res, size_t bytes, void **deviceAddr)
{
    aclError ret = aclrtMalloc(deviceAddr, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS, "aclrtMalloc", ret, return ret);
    res.deviceBuffers.push_back(*deviceAddr);
    return ACL_SUCCESS;
}

/* Copies `hostData` (already in the tensor's dtype) to new device memory and describes it. */
template <typename T>
int CreateAclTensor(Resources &res, const std::vector<T> &hostData, const std::vector<int64_t> &shape,
                    void **deviceAddr, aclDataType dataType, aclTensor **tensor)
{
    size_t bytes = static_cast<size_t>(GetShapeSize(shape)) * sizeof(T);
    int ret = DeviceAlloc(res, bytes, deviceAddr);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = aclrtMemcpy(*deviceAddr, bytes, hostData.data(), bytes, ACL_MEMCPY_HOST_TO_DEVICE);
    CHECK_RET(ret == ACL_SUCCESS, "aclrtMemcpy", ret, return ret);
    std::vector<int64_t> strides(shape.size(), 1);
    for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; i--) {
        strides[i] = shape[i + 1] * strides[i + 1];
    }
    *tensor = aclCreateTensor(shape.data(), shape.size(), dataType, strides.data(), 0, ACL_FORMAT_ND,
                              shape.data(), shape.size(), *deviceAddr);
    CHECK_RET(*tensor != nullptr, "aclCreateTensor", ACLNN_ERR_PARAM_INVALID, return ACLNN_ERR_PARAM_INVALID);
    res.tensors.push_back(*tensor);
    return ACL_SUCCESS;
}

std::vector<uint16_t> ToHalf(const std::vector<float> &values)
{
    std::vector<uint16_t> out(values.size());
    for (size_t i = 0; i < values.size(); i++) {
        out[i] = FloatToHalf(values[i]);
    }
    return out;
}

int Run(Resources &res)
{
    int ret = Init(res); /* the helpers print their own failures */
    if (ret != ACL_SUCCESS) {
        return ret;
    }

    std::vector<int64_t> gradYShape = {512, 512};
    std::vector<int64_t> xShape = {512, 1024};
    std::vector<int64_t> weightShape = {512, 1};
    std::vector<int64_t> yOriginShape = {512, 512};
    std::vector<int64_t> groupIndexShape = {2};
    std::vector<int64_t> gradXShape = {512, 1024};
    std::vector<int64_t> gradWeightShape = {512, 1};

    std::vector<float> gradYHostData(GetShapeSize(gradYShape));
    for (size_t i = 0; i < gradYHostData.size(); i++) {
        gradYHostData[i] = static_cast<float>(i % 10) * 0.1f;
    }
    std::vector<float> xHostData(GetShapeSize(xShape));
    for (size_t i = 0; i < xHostData.size(); i++) {
        xHostData[i] = static_cast<float>(static_cast<int64_t>(i % 20) - 10) * 0.5f;
    }
    std::vector<float> weightHostData(GetShapeSize(weightShape));
    for (size_t i = 0; i < weightHostData.size(); i++) {
        weightHostData[i] = static_cast<float>((i % 5) + 1) * 0.2f;
    }
    std::vector<float> yOriginHostData(GetShapeSize(yOriginShape));
    for (size_t i = 0; i < yOriginHostData.size(); i++) {
        yOriginHostData[i] = static_cast<float>((i % 8) + 1) * 0.3f;
    }
    std::vector<int64_t> groupIndexHostData = {256, 256};

    void *gradYDeviceAddr = nullptr;
    void *xDeviceAddr = nullptr;
    void *weightDeviceAddr = nullptr;
    void *yOriginDeviceAddr = nullptr;
    void *groupIndexDeviceAddr = nullptr;
    void *gradXDeviceAddr = nullptr;
    void *gradWeightDeviceAddr = nullptr;
    aclTensor *gradYTensor = nullptr;
    aclTensor *xTensor = nullptr;
    aclTensor *weightTensor = nullptr;
    aclTensor *yOriginTensor = nullptr;
    aclTensor *groupIndexTensor = nullptr;
    aclTensor *gradXTensor = nullptr;
    aclTensor *gradWeightTensor = nullptr;

    ret = CreateAclTensor(res, ToHalf(gradYHostData), gradYShape, &gradYDeviceAddr, ACL_FLOAT16, &gradYTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = CreateAclTensor(res, ToHalf(xHostData), xShape, &xDeviceAddr, ACL_FLOAT16, &xTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = CreateAclTensor(res, weightHostData, weightShape, &weightDeviceAddr, ACL_FLOAT, &weightTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = CreateAclTensor(res, ToHalf(yOriginHostData), yOriginShape, &yOriginDeviceAddr, ACL_FLOAT16,
                          &yOriginTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = CreateAclTensor(res, groupIndexHostData, groupIndexShape, &groupIndexDeviceAddr, ACL_INT64,
                          &groupIndexTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = CreateAclTensor(res, std::vector<uint16_t>(GetShapeSize(gradXShape), 0), gradXShape, &gradXDeviceAddr,
                          ACL_FLOAT16, &gradXTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }
    ret = CreateAclTensor(res, std::vector<float>(GetShapeSize(gradWeightShape), 0.0f), gradWeightShape,
                          &gradWeightDeviceAddr, ACL_FLOAT, &gradWeightTensor);
    if (ret != ACL_SUCCESS) {
        return ret;
    }

    double clampLimit = 1.0;
    uint64_t workspaceSize = 0;
    ret = aclnnSwigluGroupQuantGradGetWorkspaceSize(gradYTensor, xTensor, weightTensor, yOriginTensor,
                                                    groupIndexTensor, clampLimit, gradXTensor, gradWeightTensor,
                                                    &workspaceSize, &res.executor);
    CHECK_RET(ret == ACL_SUCCESS, "aclnnSwigluGroupQuantGradGetWorkspaceSize", ret, return ret);

    void *workspaceAddr = nullptr;
    if (workspaceSize > 0) {
        ret = DeviceAlloc(res, workspaceSize, &workspaceAddr);
        if (ret != ACL_SUCCESS) {
            return ret;
        }
    }
    /* phase 2 consumes the executor, whether it succeeds or not */
    aclOpExecutor *executor = res.executor;
    res.executor = nullptr;
    ret = aclnnSwigluGroupQuantGrad(workspaceAddr, workspaceSize, executor, res.stream);
    CHECK_RET(ret == ACL_SUCCESS, "aclnnSwigluGroupQuantGrad", ret, return ret);
    ret = aclrtSynchronizeStream(res.stream);
    CHECK_RET(ret == ACL_SUCCESS, "aclrtSynchronizeStream", ret, return ret);

    std::vector<uint16_t> gradXResultData(GetShapeSize(gradXShape), 0);
    size_t gradXBytes = gradXResultData.size() * sizeof(uint16_t);
    ret = aclrtMemcpy(gradXResultData.data(), gradXBytes, gradXDeviceAddr, gradXBytes, ACL_MEMCPY_DEVICE_TO_HOST);
    CHECK_RET(ret == ACL_SUCCESS, "copy gradX result from device to host", ret, return ret);
    LOG_PRINT("gradX output (first 10 elements):\n");
    for (int64_t i = 0; i < 10 && i < static_cast<int64_t>(gradXResultData.size()); i++) {
        LOG_PRINT("gradX[%ld] = %f\n", static_cast<long>(i), HalfToFloat(gradXResultData[i]));
    }

    std::vector<float> gradWeightResultData(GetShapeSize(gradWeightShape), 0.0f);
    size_t gradWeightBytes = gradWeightResultData.size() * sizeof(float);
    ret = aclrtMemcpy(gradWeightResultData.data(), gradWeightBytes, gradWeightDeviceAddr, gradWeightBytes,
                      ACL_MEMCPY_DEVICE_TO_HOST);
    CHECK_RET(ret == ACL_SUCCESS, "copy gradWeight result from device to host", ret, return ret);
    LOG_PRINT("gradWeight output (first 10 elements):\n");
    for (int64_t i = 0; i < 10 && i < static_cast<int64_t>(gradWeightResultData.size()); i++) {
        LOG_PRINT("gradWeight[%ld] = %f\n", static_cast<long>(i), gradWeightResultData[i]);
    }
    return ACL_SUCCESS;
}

}  // namespace

int main()
{
    int ret;
    {
        Resources res;
        ret = Run(res);
    } /* everything released here, aclFinalize last */
    return ret == ACL_SUCCESS ? 0 : 1;
}
