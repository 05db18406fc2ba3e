"""aclTensor and aclIntArray handles over device arrays and host integer lists."""

from __future__ import annotations

import ctypes
from typing import Sequence, Union

import numpy as np

from ._device import DeviceArray
from ._dtypes import ACL_FORMAT_ND, acl_dtype
from .runtime import Owned, runtime_api


class AclTensor(Owned):
    """An aclTensor describing a DeviceArray view (shape, element strides, offset, dtype, ND).

    The storage is declared as a 1-D element count covering the view, so non-contiguous views
    are passed as they are. Rebinding its executor's address (aclSet*TensorAddr) changes the
    address it holds too, so each user of a tensor owns its own.
    """

    _kind = "AclTensor"

    def __init__(self, array: DeviceArray):
        super().__init__()
        api = runtime_api()
        ndim = len(array.shape)
        dims = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
        strides = (ctypes.c_int64 * max(ndim, 1))(*array.strides)
        storage_numel = array.last_index + 1 if array.size else 0
        if array.buffer is not None and not array.buffer.closed:
            storage_numel = max(storage_numel, array.buffer.nbytes // array.dtype.itemsize)
        storage = (ctypes.c_int64 * 1)(storage_numel)
        dtype, data = acl_dtype(array.dtype), array.ptr or None
        life = self._prepare(api.raw.aclDestroyTensor)
        life.handle = api.aclCreateTensor(dims, ndim, dtype, strides, array.offset, ACL_FORMAT_ND, storage, 1, data)
        self.address = ctypes.cast(life.handle, ctypes.c_void_p)   # for unprototyped calls


class AclIntArray(Owned):
    """An aclIntArray (host int64 values, copied by CANN at creation)."""

    _kind = "AclIntArray"

    def __init__(self, values: Union[Sequence[int], np.ndarray]):
        super().__init__()
        api = runtime_api()
        host = np.ascontiguousarray(values, dtype=np.int64)
        pointer = host.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) if host.size else None
        life = self._prepare(api.raw.aclDestroyIntArray)
        life.handle = api.aclCreateIntArray(pointer, host.size)
        self.address = ctypes.cast(life.handle, ctypes.c_void_p)   # for unprototyped calls
        self.values = tuple(int(v) for v in host)
