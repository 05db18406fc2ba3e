/*
 * A one-shot call's arena in C: every input copied to the device and every tensor made (or
 * every output copied back, or every tensor destroyed) in one call, from function pointers the
 * Python side took from whichever libraries it loaded. One ctypes call instead of one per
 * array keeps a small one-shot call close to the cost of the same ACL calls made from C.
 * This library links to no ACL library: it only calls what it is given.
 */
#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define ARENA_EXPORT
#else
#define ARENA_EXPORT __attribute__((visibility("default")))
#endif

enum { MEMCPY_HOST_TO_DEVICE = 1, MEMCPY_DEVICE_TO_HOST = 2 };
enum { TENSOR_NOT_MADE = -1 };   /* returned when aclCreateTensor gave NULL (its message says why) */

typedef int (*memcpy_fn)(void *dst, size_t dst_max, const void *src, size_t count, int kind);
typedef void *(*create_tensor_fn)(const int64_t *dims, uint64_t ndim, int dtype, const int64_t *strides,
                                  int64_t offset, int format, const int64_t *storage_dims, uint64_t storage_ndim,
                                  void *data);
typedef int (*destroy_tensor_fn)(void *tensor);

/* Laid out as the binding's ctypes structures of the same fields, in this order. */
typedef struct {
    memcpy_fn copy;                  /* aclrtMemcpy */
    create_tensor_fn create_tensor;  /* aclCreateTensor */
    destroy_tensor_fn destroy_tensor;/* aclDestroyTensor */
} arena_api;

typedef struct {
    const int64_t *dims;
    const int64_t *strides;
    const int64_t *storage_dims;     /* one value: the elements the view spans */
    uint64_t ndim;
    int64_t offset;                  /* byte offset in the arena, -1 for an empty array */
    uint64_t nbytes;
    int32_t dtype;
    int32_t format;
} arena_array;

static void *address_in(char *base, const arena_array *array)
{
    return array->offset < 0 || base == NULL ? NULL : base + array->offset;
}

/* For each array: copies hosts[i] (when not NULL) to its place in the arena, then makes its
 * tensor into tensors[i] (which the caller zeroed, and destroys with acl_swiglu_arena_destroy
 * whatever happens). Returns 0, or the failing aclrtMemcpy status / TENSOR_NOT_MADE with
 * *failed set to the array's index. */
ARENA_EXPORT int32_t acl_swiglu_arena_place(const arena_api *api, const arena_array *arrays, uint32_t count,
                                            char *base, void *const *hosts, void **tensors, uint32_t *failed)
{
    for (uint32_t i = 0; i < count; i++) {
        const arena_array *array = &arrays[i];
        void *device = address_in(base, array);
        if (hosts[i] != NULL && device != NULL && array->nbytes != 0) {
            int status = api->copy(device, (size_t)array->nbytes, hosts[i], (size_t)array->nbytes,
                                   MEMCPY_HOST_TO_DEVICE);
            if (status != 0) {
                *failed = i;
                return status;
            }
        }
        tensors[i] = api->create_tensor(array->dims, array->ndim, array->dtype, array->strides, 0, array->format,
                                        array->storage_dims, 1, device);
        if (tensors[i] == NULL) {
            *failed = i;
            return TENSOR_NOT_MADE;
        }
    }
    return 0;
}

/* Copies each array with a host destination (hosts[i] not NULL) back from the arena.
 * Returns 0, or the failing status with *failed set to the array's index. */
ARENA_EXPORT int32_t acl_swiglu_arena_fetch(const arena_api *api, const arena_array *arrays, uint32_t count,
                                            char *base, void *const *hosts, uint32_t *failed)
{
    for (uint32_t i = 0; i < count; i++) {
        const arena_array *array = &arrays[i];
        void *device = address_in(base, array);
        if (hosts[i] != NULL && device != NULL && array->nbytes != 0) {
            int status = api->copy(hosts[i], (size_t)array->nbytes, device, (size_t)array->nbytes,
                                   MEMCPY_DEVICE_TO_HOST);
            if (status != 0) {
                *failed = i;
                return status;
            }
        }
    }
    return 0;
}

/* Destroys every tensor made (not NULL), in reverse order, all of them even when one fails.
 * Returns 0 or the first failing status. */
ARENA_EXPORT int32_t acl_swiglu_arena_destroy(const arena_api *api, void **tensors, uint32_t count)
{
    int32_t first = 0;
    for (uint32_t i = count; i-- > 0;) {
        if (tensors[i] != NULL) {
            int status = api->destroy_tensor(tensors[i]);
            tensors[i] = NULL;
            if (status != 0 && first == 0) {
                first = status;
            }
        }
    }
    return first;
}
