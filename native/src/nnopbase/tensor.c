/* aclTensor and aclIntArray: host-side descriptions of device data, and host int lists. */
#include <stdlib.h>
#include <string.h>

#include "common/meta_internal.h"

int64_t aclEmu_numel(const int64_t *dims, uint64_t ndim)
{
    int64_t n = 1;
    for (uint64_t i = 0; i < ndim; i++) {
        if (dims[i] == 0) {
            return 0;
        }
    }
    for (uint64_t i = 0; i < ndim; i++) {
        if (__builtin_mul_overflow(n, dims[i], &n)) {
            return -1;
        }
    }
    return n;
}

int64_t aclEmu_view_last_index(const aclTensor *t)
{
    int64_t last = t->offset;
    for (uint64_t i = 0; i < t->ndim; i++) {
        last += (t->dims[i] - 1) * t->strides[i];
    }
    return last;
}

static aclTensor *reject_tensor(const char *fmt, ...) EMU_PRINTF(1, 2);
static aclTensor *reject_tensor(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    aclEmu_vfail(ACLNN_ERR_PARAM_INVALID, "aclCreateTensor", fmt, ap);
    va_end(ap);
    return NULL;
}

static int known_format(int format)
{
    return format == ACL_FORMAT_UNDEFINED || format == ACL_FORMAT_NCHW || format == ACL_FORMAT_NHWC ||
           format == ACL_FORMAT_ND || format == ACL_FORMAT_NCL;
}

EMU_EXPORT aclTensor *aclCreateTensor(const int64_t *viewDims, uint64_t viewDimsNum,
                                      aclDataType dataType, const int64_t *stride, int64_t offset,
                                      aclFormat format, const int64_t *storageDims,
                                      uint64_t storageDimsNum, void *tensorData)
{
    if (aclEmu_fault("aclCreateTensor") != 0) {
        return NULL;
    }
    if (viewDimsNum > EMU_MAX_DIMS) {
        return reject_tensor("viewDimsNum %llu is more than %d dims",
                             (unsigned long long)viewDimsNum, EMU_MAX_DIMS);
    }
    if (viewDimsNum > 0 && viewDims == NULL) {
        return reject_tensor("viewDims is NULL but viewDimsNum is %llu",
                             (unsigned long long)viewDimsNum);
    }
    if (aclEmu_dtype_bits(dataType) == 0) {
        return reject_tensor("dataType %d (%s) is not a data type a tensor can hold", (int)dataType,
                             aclEmu_dtype_name(dataType));
    }
    if (!known_format(format)) {
        return reject_tensor("format %d is not an aclFormat", (int)format);
    }
    if (offset < 0) {
        return reject_tensor("offset %lld is negative", (long long)offset);
    }
    if (storageDimsNum > EMU_MAX_DIMS || (storageDimsNum > 0 && storageDims == NULL)) {
        return reject_tensor("storageDims/storageDimsNum (%llu) are inconsistent",
                             (unsigned long long)storageDimsNum);
    }
    aclTensor *t = calloc(1, sizeof *t);
    if (t == NULL) {
        return reject_tensor("out of host memory");
    }
    t->dtype = dataType;
    t->format = format;
    t->ndim = viewDimsNum;
    t->offset = offset;
    t->data = tensorData;
    int64_t contiguous = 1;
    for (uint64_t k = viewDimsNum; k-- > 0;) {
        if (viewDims[k] < 0) {
            free(t);
            return reject_tensor("viewDims[%llu] is %lld; dims must be >= 0", (unsigned long long)k,
                                 (long long)viewDims[k]);
        }
        t->dims[k] = viewDims[k];
        if (stride != NULL) {
            if (stride[k] < 0) {
                free(t);
                return reject_tensor("stride[%llu] is %lld; negative strides are not supported",
                                     (unsigned long long)k, (long long)stride[k]);
            }
            t->strides[k] = stride[k];
        } else {
            t->strides[k] = contiguous;
            if (viewDims[k] > 0 && __builtin_mul_overflow(contiguous, viewDims[k], &contiguous)) {
                free(t);
                return reject_tensor("viewDims overflow int64");
            }
        }
    }
    int64_t view_numel = aclEmu_numel(t->dims, t->ndim);
    if (view_numel < 0) {
        free(t);
        return reject_tensor("viewDims overflow int64");
    }
    /* Highest element the view reaches; every element must lie in the declared storage. */
    int64_t last = offset;
    for (uint64_t k = 0; view_numel > 0 && k < t->ndim; k++) {
        int64_t reach;
        if (__builtin_mul_overflow(t->dims[k] - 1, t->strides[k], &reach) ||
            __builtin_add_overflow(last, reach, &last)) {
            free(t);
            return reject_tensor("the view's extent overflows int64");
        }
    }
    /* In bytes too (FLOAT4 elements are half a byte each), so that no later address
     * computation can wrap. */
    uint64_t first_byte, extent_bytes;
    if (view_numel > 0 && aclEmu_element_bytes(dataType, last, 1, &first_byte, &extent_bytes) != 0) {
        free(t);
        return reject_tensor("the view reaches element %lld; at %u bits per element that "
                             "overflows int64 bytes",
                             (long long)last, aclEmu_dtype_bits(dataType));
    }
    int64_t storage_numel = view_numel > 0 ? last + 1 : 0;
    if (storageDimsNum > 0) {
        for (uint64_t k = 0; k < storageDimsNum; k++) {
            if (storageDims[k] < 0) {
                free(t);
                return reject_tensor("storageDims[%llu] is %lld; dims must be >= 0",
                                     (unsigned long long)k, (long long)storageDims[k]);
            }
        }
        storage_numel = aclEmu_numel(storageDims, storageDimsNum);
        if (storage_numel < 0 ||
            aclEmu_element_bytes(dataType, 0, storage_numel, &first_byte, &extent_bytes) != 0) {
            free(t);
            return reject_tensor("storageDims overflow int64%s",
                                 storage_numel < 0 ? "" : " bytes at this dtype's element size");
        }
    }
    if (view_numel > 0 && last >= storage_numel) {
        free(t);
        return reject_tensor("the view reaches element %lld (offset %lld) but the storage "
                             "holds %lld elements",
                             (long long)last, (long long)offset, (long long)storage_numel);
    }
    t->storage_numel = storage_numel;
    static uint64_t next_serial;
    t->serial = __atomic_add_fetch(&next_serial, 1, __ATOMIC_RELAXED);
    aclEmu_handle_add(ACL_EMU_KIND_TENSOR, t);
    return t;
}

EMU_EXPORT aclnnStatus aclDestroyTensor(const aclTensor *tensor)
{
    static const char api[] = "aclDestroyTensor";
    int rc = aclEmu_fault(api);
    if (rc != 0 || tensor == NULL) {
        return rc;
    }
    if (!aclEmu_handle_remove(ACL_EMU_KIND_TENSOR, tensor, "destroyed")) {
        return aclEmu_require_handle(api, ACLNN_ERR_PARAM_INVALID, "tensor", ACL_EMU_KIND_TENSOR,
                                     tensor);
    }
    free((void *)tensor);
    return ACLNN_SUCCESS;
}

EMU_EXPORT aclnnStatus aclSetRawTensorAddr(aclTensor *tensor, void *addr)
{
    static const char api[] = "aclSetRawTensorAddr";
    int rc = aclEmu_fault(api);
    if (rc != 0) {
        return rc;
    }
    if (tensor == NULL) {
        return aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, api, "tensor is NULL");
    }
    rc = aclEmu_require_handle(api, ACLNN_ERR_PARAM_INVALID, "tensor", ACL_EMU_KIND_TENSOR, tensor);
    if (rc != 0) {
        return rc;
    }
    tensor->data = addr;
    return ACLNN_SUCCESS;
}

EMU_EXPORT aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size)
{
    static const char api[] = "aclCreateIntArray";
    if (aclEmu_fault(api) != 0) {
        return NULL;
    }
    if (size > 0 && value == NULL) {
        aclEmu_fail(ACLNN_ERR_PARAM_NULLPTR, api, "value is NULL but size is %llu",
                    (unsigned long long)size);
        return NULL;
    }
    if (size > ((uint64_t)1 << 40)) {
        aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api, "size %llu is too large",
                    (unsigned long long)size);
        return NULL;
    }
    aclIntArray *array = malloc(sizeof *array + (size_t)size * sizeof(int64_t));
    if (array == NULL) {
        aclEmu_fail(ACLNN_ERR_PARAM_INVALID, api, "out of host memory");
        return NULL;
    }
    array->size = size;
    if (size > 0) {
        memcpy(array->values, value, (size_t)size * sizeof(int64_t));
    }
    aclEmu_handle_add(ACL_EMU_KIND_INT_ARRAY, array);
    return array;
}

EMU_EXPORT aclnnStatus aclDestroyIntArray(const aclIntArray *array)
{
    static const char api[] = "aclDestroyIntArray";
    int rc = aclEmu_fault(api);
    if (rc != 0 || array == NULL) {
        return rc;
    }
    if (!aclEmu_handle_remove(ACL_EMU_KIND_INT_ARRAY, array, "destroyed")) {
        return aclEmu_require_handle(api, ACLNN_ERR_PARAM_INVALID, "array",
                                     ACL_EMU_KIND_INT_ARRAY, array);
    }
    free((void *)array);
    return ACLNN_SUCCESS;
}
