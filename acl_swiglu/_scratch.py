"""Native resources that live for one call only (device memory, tensor and int-array handles),
made with the raw C functions and released in reverse order when the call ends, success or not.

The one-shot call uses this instead of the owned Python objects of runtime.py: it frees
everything before it returns, so per-object finalizers would only add cost. All of a call's
device memory is one allocation (an arena), each array at a 64-byte aligned offset in it.
"""

from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Tuple

import numpy as np

from . import _ffi
from ._device import (ACL_MEM_MALLOC_HUGE_FIRST, MEMCPY_DEVICE_TO_HOST, MEMCPY_HOST_TO_DEVICE, contiguous_strides,
                      element_span, host_element_strides)
from ._dtypes import ACL_FORMAT_ND, acl_dtype
from ._ffi import check

ALIGNMENT = 64   # CANN wants 32-byte aligned tensor addresses

_dims_cache: Dict[tuple, ctypes.Array] = {}


def _int64s(values: tuple) -> ctypes.Array:
    """A C int64 array of `values`, shared between calls (CANN copies dims, never writes them)."""
    array = _dims_cache.get(values)
    if array is None:
        if len(_dims_cache) > 4096:
            _dims_cache.clear()
        array = _dims_cache[values] = (ctypes.c_int64 * max(len(values), 1))(*values)
    return array


class Staged:
    """An array's place in the arena: element strides, element span and byte offset."""

    __slots__ = ("array", "strides", "span", "offset")

    def __init__(self, array: np.ndarray, strides: Tuple[int, ...], span: int, offset: int):
        self.array, self.strides, self.span, self.offset = array, strides, span, offset


class CallScratch:
    """Use as ``with CallScratch(api) as scratch:``; everything it made is released on exit.

    Stage every array first (``stage_input`` / ``stage_output``), then ``allocate()`` the arena
    once, then ``upload`` / ``tensor_for`` them. When ``drain`` is set to a stream handle, that
    stream is synchronised before anything is freed if the call fails after queuing work.
    """

    __slots__ = ("api", "raw", "size", "base", "tensors", "int_arrays", "drain")

    def __init__(self, api):
        self.api = api
        self.raw = api.raw
        self.size = 0
        self.base: Optional[int] = None
        self.tensors: list = []
        self.int_arrays: list = []
        self.drain = None

    def __enter__(self) -> "CallScratch":
        return self

    def _reserve(self, nbytes: int) -> int:
        offset = self.size
        self.size = offset + (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        return offset

    def stage_input(self, array: np.ndarray) -> Staged:
        """Reserves room for the bytes `array` spans, keeping its strides on the device
        (a copy in C order when its strides are negative or not whole elements)."""
        if array.size == 0:
            return Staged(array, contiguous_strides(array.shape), 0, -1)
        if array.flags.c_contiguous:
            return Staged(array, contiguous_strides(array.shape), array.size, self._reserve(array.nbytes))
        strides = host_element_strides(array)
        if strides is None:
            array = np.ascontiguousarray(array)
            return Staged(array, contiguous_strides(array.shape), array.size, self._reserve(array.nbytes))
        span = element_span(array.shape, strides)
        return Staged(array, strides, span, self._reserve(span * array.dtype.itemsize))

    def stage_output(self, host: np.ndarray) -> Staged:
        if host.size == 0:
            return Staged(host, contiguous_strides(host.shape), 0, -1)
        return Staged(host, contiguous_strides(host.shape), host.size, self._reserve(host.nbytes))

    def allocate(self) -> None:
        if self.size:
            ptr = ctypes.c_void_p()
            check(self.api, self.raw.aclrtMalloc(ctypes.byref(ptr), self.size, ACL_MEM_MALLOC_HUGE_FIRST),
                  "aclrtMalloc")
            self.base = ptr.value

    def address(self, staged: Staged) -> Optional[int]:
        return None if staged.offset < 0 else self.base + staged.offset

    def tensor_for(self, staged: Staged):
        array = staged.array
        handle = self.raw.aclCreateTensor(_int64s(array.shape), array.ndim, acl_dtype(array.dtype),
                                          _int64s(staged.strides), 0, ACL_FORMAT_ND, _int64s((staged.span,)), 1,
                                          self.address(staged))
        if not handle:
            _ffi.raise_null("aclCreateTensor", self.api.get_message)
        self.tensors.append(handle)
        return handle

    def upload(self, staged: Staged):
        """Copies a staged input to the device; returns its tensor."""
        if staged.offset >= 0:
            nbytes = staged.span * staged.array.dtype.itemsize
            check(self.api, self.raw.aclrtMemcpy(self.base + staged.offset, nbytes, staged.array.ctypes.data, nbytes,
                                                 MEMCPY_HOST_TO_DEVICE), "aclrtMemcpy")
        return self.tensor_for(staged)

    def download(self, staged: Staged) -> None:
        host = staged.array
        if staged.offset >= 0:
            check(self.api, self.raw.aclrtMemcpy(host.ctypes.data, host.nbytes, self.base + staged.offset,
                                                 host.nbytes, MEMCPY_DEVICE_TO_HOST), "aclrtMemcpy")

    def int_array(self, values: np.ndarray):
        values = np.ascontiguousarray(values, dtype=np.int64)
        pointer = values.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)) if values.size else None
        handle = self.raw.aclCreateIntArray(pointer, values.size)
        if not handle:
            _ffi.raise_null("aclCreateIntArray", self.api.get_message)
        self.int_arrays.append(handle)
        return handle

    def __exit__(self, exc_type, exc, tb) -> None:
        raw = self.raw
        if exc_type is not None and self.drain is not None:
            self.api.hot.aclrtSynchronizeStream(self.drain)   # the call's own error is the one to report
        failed: List[Tuple[int, str]] = []
        for handle in reversed(self.tensors):
            status = raw.aclDestroyTensor(handle)
            if status:
                failed.append((status, "aclDestroyTensor"))
        for handle in self.int_arrays:
            status = raw.aclDestroyIntArray(handle)
            if status:
                failed.append((status, "aclDestroyIntArray"))
        if self.base is not None:
            status = raw.aclrtFree(self.base)
            if status:
                failed.append((status, "aclrtFree"))
        if failed and exc_type is None:
            _ffi.raise_status(failed[0][0], failed[0][1], self.api.get_message)
