"""aclTensor and aclIntArray handles over device arrays and host integer lists."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional, Sequence, overload

import numpy as np

from ._dtypes import ACL_FORMAT_ND, acl_dtype
from ._device import DeviceArray, tensor_lock
from .runtime import Owned, runtime_api


class AclTensor(Owned):
    """An aclTensor describing a DeviceArray view (shape, element strides, offset, dtype, ND).

    The storage is declared as a 1-D element count covering the view, so non-contiguous views
    are passed as they are. ``address`` overrides the data pointer (NULL for a placeholder).
    """

    _kind = "AclTensor"

    def __init__(self, array: DeviceArray, address: Optional[int] = None):
        super().__init__()
        api = runtime_api()
        ndim = len(array.shape)
        dims = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
        strides = (ctypes.c_int64 * max(ndim, 1))(*array.strides)
        storage_numel = array.last_index + 1 if array.size else 0
        if array.buffer is not None and not array.buffer.closed:
            storage_numel = max(storage_numel, array.buffer.nbytes // array.dtype.itemsize)
        storage = (ctypes.c_int64 * 1)(storage_numel)
        data = array.ptr if address is None else address
        handle = api.aclCreateTensor(dims, ndim, acl_dtype(array.dtype), strides, array.offset, ACL_FORMAT_ND,
                                     storage, 1, data or None)
        raw_destroy: Callable[[Any], int] = api.raw.aclDestroyTensor

        def release(handle: Any = handle) -> int:
            return raw_destroy(handle)

        self._own(handle, release)
        self.address = ctypes.cast(handle, ctypes.c_void_p)   # for unprototyped hot-path calls


class AclIntArray(Owned):
    """An aclIntArray (host int64 values, copied by CANN at creation)."""

    _kind = "AclIntArray"

    def __init__(self, values: Sequence[int]):
        super().__init__()
        api = runtime_api()
        host = np.ascontiguousarray(values, dtype=np.int64)
        pointer = host.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) if host.size else None
        handle = api.aclCreateIntArray(pointer, host.size)
        raw_destroy: Callable[[Any], int] = api.raw.aclDestroyIntArray

        def release(handle: Any = handle) -> int:
            return raw_destroy(handle)

        self._own(handle, release)
        self.address = ctypes.cast(handle, ctypes.c_void_p)   # for unprototyped hot-path calls
        self.values = tuple(int(v) for v in host)


@overload
def tensor_for(array: DeviceArray) -> AclTensor: ...


@overload
def tensor_for(array: None) -> None: ...


@overload
def tensor_for(array: Optional[DeviceArray]) -> Optional[AclTensor]: ...


def tensor_for(array: Optional[DeviceArray]) -> Optional[AclTensor]:
    """The array's own cached aclTensor (made on first use, freed with the array)."""
    if array is None:
        return None
    tensor = array._tensor
    if tensor is None or tensor.closed:
        with tensor_lock():   # one tensor per array, even when two threads use it first at once
            tensor = array._tensor
            if tensor is None or tensor.closed:
                tensor = AclTensor(array)
                array._tensor = tensor
                array._bound = (tensor.address, tensor._life if array.buffer is None else array.buffer._life,
                                array._layout_id)
    return tensor

