"""Native resources that live for one call only (device memory, tensor and int-array handles),
made with the raw C functions and released in reverse order when the call ends, success or not.

The one-shot call uses this instead of the owned Python objects of runtime.py: it frees
everything before it returns, so per-object finalizers would only add cost.
"""

from __future__ import annotations

import ctypes
from typing import List, Optional, Sequence

import numpy as np

from . import _ffi
from ._dtypes import ACL_FORMAT_ND, acl_dtype

ACL_MEM_MALLOC_HUGE_FIRST = 0
MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2


def check(api, status: int, name: str) -> None:
    if status != 0:
        _ffi.raise_status(status, name, api.get_message)


class CallScratch:
    """Use as ``with CallScratch(api) as scratch:``; everything it made is released on exit.

    When ``drain`` is set to a stream, that stream is synchronised before anything is freed if
    the call fails after queuing work (queued work must not find its memory gone).
    """

    __slots__ = ("api", "raw", "buffers", "tensors", "int_arrays", "drain")

    def __init__(self, api):
        self.api = api
        self.raw = api.raw
        self.buffers: List[int] = []
        self.tensors: list = []
        self.int_arrays: list = []
        self.drain = None

    def __enter__(self) -> "CallScratch":
        return self

    def malloc(self, nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        check(self.api, self.raw.aclrtMalloc(ctypes.byref(ptr), nbytes, ACL_MEM_MALLOC_HUGE_FIRST), "aclrtMalloc")
        self.buffers.append(ptr.value)
        return ptr.value

    def tensor(self, shape: Sequence[int], strides: Sequence[int], dtype, storage_numel: int, ptr: Optional[int]):
        ndim = len(shape)
        handle = self.raw.aclCreateTensor((ctypes.c_int64 * max(ndim, 1))(*shape), ndim, acl_dtype(dtype),
                                          (ctypes.c_int64 * max(ndim, 1))(*strides), 0, ACL_FORMAT_ND,
                                          (ctypes.c_int64 * 1)(storage_numel), 1, ptr)
        if not handle:
            # The checked binding turns the NULL into the right exception with the message.
            self.api.aclCreateTensor.errcheck(handle, None, None)
        self.tensors.append(handle)
        return handle

    def int_array(self, values: np.ndarray):
        values = np.ascontiguousarray(values, dtype=np.int64)
        pointer = values.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) if values.size else None
        handle = self.raw.aclCreateIntArray(pointer, values.size)
        if not handle:
            self.api.aclCreateIntArray.errcheck(handle, None, None)
        self.int_arrays.append(handle)
        return handle

    def host_to_device(self, array: np.ndarray):
        """A tensor over a device copy of `array`, keeping its strides (the bytes it spans are
        copied); empty arrays get a tensor with no memory."""
        itemsize = array.dtype.itemsize
        if array.size == 0:
            return self.tensor(array.shape, _contiguous(array.shape), array.dtype, 0, None)
        strides = array.strides
        if any(s < 0 or s % itemsize for s in strides):
            array = np.ascontiguousarray(array)
            strides = array.strides
        elements = tuple(s // itemsize for s in strides)
        span_elements = sum((d - 1) * s for d, s in zip(array.shape, elements)) + 1
        nbytes = span_elements * itemsize
        ptr = self.malloc(nbytes)
        check(self.api, self.raw.aclrtMemcpy(ptr, nbytes, array.ctypes.data, nbytes, MEMCPY_HOST_TO_DEVICE),
              "aclrtMemcpy")
        return self.tensor(array.shape, elements, array.dtype, span_elements, ptr)

    def device_output(self, host: np.ndarray):
        """(tensor, device address) for a C-contiguous output shaped like `host`."""
        if host.size == 0:
            return self.tensor(host.shape, _contiguous(host.shape), host.dtype, 0, None), None
        ptr = self.malloc(host.nbytes)
        return self.tensor(host.shape, _contiguous(host.shape), host.dtype, host.size, ptr), ptr

    def device_to_host(self, ptr: Optional[int], host: np.ndarray) -> None:
        if ptr is not None and host.nbytes:
            check(self.api, self.raw.aclrtMemcpy(host.ctypes.data, host.nbytes, ptr, host.nbytes,
                                                 MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy")

    def __exit__(self, exc_type, exc, tb) -> None:
        raw = self.raw
        if exc_type is not None and self.drain is not None:
            raw.aclrtSynchronizeStream(self.drain)   # the call's own error is the one to report
        first = None
        for handle in reversed(self.tensors):
            status = raw.aclDestroyTensor(handle)
            first = first or (status and (status, "aclDestroyTensor"))
        for handle in self.int_arrays:
            status = raw.aclDestroyIntArray(handle)
            first = first or (status and (status, "aclDestroyIntArray"))
        for ptr in reversed(self.buffers):
            status = raw.aclrtFree(ptr)
            first = first or (status and (status, "aclrtFree"))
        if first and exc_type is None:
            _ffi.raise_status(first[0], first[1], self.api.get_message)


def _contiguous(shape: Sequence[int]):
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))
