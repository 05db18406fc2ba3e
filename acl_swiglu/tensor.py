"""aclTensor and aclIntArray handles over device arrays and host integer lists."""

from __future__ import annotations

import ctypes
from typing import NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from ._device import DeviceArray, elements_spanned, open_address
from ._dtypes import ACL_FORMAT_ND, acl_dtype
from .runtime import Life, Owned, runtime_api


class TensorView(NamedTuple):
    """How an operator's parameter sees an array whose NumPy dtype is not its aclDataType: the
    aclDataType, and how many of its elements each item of the array packs along the last dim
    (FLOAT4 codes, two to a byte: 2)."""

    dtype: int
    per_item: int = 1


def tensor_geometry(shape: Sequence[int], strides: Sequence[int], offset: int,
                    view: Optional[TensorView]) -> Tuple[Tuple[int, ...], Tuple[int, ...], int, int]:
    """(dims, strides, offset, per_item) of the aclTensor over an array seen through `view`:
    with items of k elements, the last dim and every other stride count k times more, and the
    last dim's elements are contiguous within an item."""
    k = 1 if view is None else view.per_item
    if k == 1 or not shape:
        return tuple(shape), tuple(strides), offset, 1
    return (tuple(shape[:-1]) + (shape[-1] * k,), tuple(s * k for s in strides[:-1]) + (1,), offset * k, k)


class AclTensor(Owned):
    """An aclTensor describing a DeviceArray view (shape, element strides, offset, dtype, ND).

    The storage is declared as a 1-D element count covering the view, so non-contiguous views
    are passed as they are. Rebinding its executor's address (aclSet*TensorAddr) changes the
    address it holds too, so each user of a tensor owns its own.
    """

    _kind = "AclTensor"

    def __init__(self, array: DeviceArray, view: Optional[TensorView] = None, after: Optional[Life] = None):
        super().__init__()
        api = runtime_api()
        data = open_address(array) or None
        layout_shape, layout_dtype, layout_strides, layout_offset = array._layout   # (not what a subclass says)
        ndim = len(layout_shape)
        shape, steps, offset, k = tensor_geometry(layout_shape, layout_strides, layout_offset, view)
        dims = (ctypes.c_int64 * max(ndim, 1))(*shape)
        strides = (ctypes.c_int64 * max(ndim, 1))(*steps)
        storage_numel = elements_spanned(array._layout)
        buffer = array._buffer
        if buffer is not None and not buffer.closed:
            storage_numel = max(storage_numel, buffer._nbytes // layout_dtype.itemsize)
        storage = (ctypes.c_int64 * 1)(storage_numel * k)
        dtype = acl_dtype(layout_dtype) if view is None else view.dtype
        life = self._prepare(api.raw.aclDestroyTensor)
        life.after = after   # (an executor made over it is freed first)
        life.handle = api.aclCreateTensor(dims, ndim, dtype, strides, offset, ACL_FORMAT_ND, storage, 1, data)
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
