"""Calls the bundled emulator's aclnnSwigluGroupQuant directly through ctypes, for tests: device
buffers, tensors, both phases on the default stream, the outputs read back as raw bytes.

The package initialises ACL and binds the thread's device (acl_swiglu.runtime.runtime_api);
everything else goes through function objects made here from the loaded libraries, so that the
package's own declarations are left as they are. Every handle and buffer is released before a
call returns, whatever happens.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from acl_swiglu import runtime

c_int64_p = ctypes.POINTER(ctypes.c_int64)
ACL_FLOAT, ACL_FLOAT16, ACL_INT64, ACL_BF16 = 0, 1, 9, 27
ACL_FLOAT8_E8M0 = 37
FP4_CODES = (40, 41)
ND = 2


@dataclass
class Result:
    status: int
    message: str
    y: Optional[np.ndarray] = None        # raw bytes of yOut's storage (uint8)
    y_scale: Optional[np.ndarray] = None  # raw bytes of yScaleOut's storage (uint8)
    workspace_size: int = 0


class _Api:
    def __init__(self) -> None:
        libs = runtime.runtime_api().libraries
        rt, meta, op = libs.runtime, libs.meta, libs.operator

        def fn(lib, name, restype, *argtypes):
            return ctypes.CFUNCTYPE(restype, *argtypes)((name, lib))

        vp = ctypes.c_void_p
        self.malloc = fn(rt, "aclrtMalloc", ctypes.c_int, ctypes.POINTER(vp), ctypes.c_size_t, ctypes.c_int)
        self.free = fn(rt, "aclrtFree", ctypes.c_int, vp)
        self.memcpy = fn(rt, "aclrtMemcpy", ctypes.c_int, vp, ctypes.c_size_t, vp, ctypes.c_size_t, ctypes.c_int)
        self.memset = fn(rt, "aclrtMemset", ctypes.c_int, vp, ctypes.c_size_t, ctypes.c_int32, ctypes.c_size_t)
        self.sync = fn(rt, "aclrtSynchronizeStream", ctypes.c_int, vp)
        self.message = fn(rt, "aclGetRecentErrMsg", ctypes.c_char_p)
        self.create = fn(meta, "aclCreateTensor", vp, c_int64_p, ctypes.c_uint64, ctypes.c_int, c_int64_p,
                         ctypes.c_int64, ctypes.c_int, c_int64_p, ctypes.c_uint64, vp)
        self.destroy = fn(meta, "aclDestroyTensor", ctypes.c_int, vp)
        self.destroy_executor = fn(meta, "aclDestroyAclOpExecutor", ctypes.c_int, vp)
        self.phase1 = fn(op, "aclnnSwigluGroupQuantGetWorkspaceSize", ctypes.c_int, vp, vp, vp, vp, ctypes.c_int64,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_bool, ctypes.c_double, ctypes.c_double,
                         ctypes.c_bool, vp, vp, vp, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(vp))
        self.phase2 = fn(op, "aclnnSwigluGroupQuant", ctypes.c_int, vp, ctypes.c_uint64, vp, vp)


_api: Optional[_Api] = None


def api() -> _Api:
    global _api
    if _api is None:
        _api = _Api()
    return _api


@dataclass
class Tensor:
    """A tensor to pass: its aclDataType, view dims and strides (elements; None: contiguous),
    offset, and the bytes of its storage (uploaded to device memory)."""
    dtype: int
    dims: Sequence[int]
    storage: np.ndarray
    strides: Optional[Sequence[int]] = None
    offset: int = 0


def _dtype_of(array: np.ndarray) -> int:
    if array.dtype == np.float16:
        return ACL_FLOAT16
    if array.dtype == np.float32:
        return ACL_FLOAT
    if array.dtype == np.int64:
        return ACL_INT64
    if array.dtype.name == "bfloat16":
        return ACL_BF16
    raise TypeError(f"no aclDataType for {array.dtype}")


def tensor_of(array: np.ndarray) -> Tensor:
    """A contiguous tensor holding an array."""
    return Tensor(_dtype_of(array), array.shape, np.ascontiguousarray(array).view(np.uint8).reshape(-1))


def output(dtype: int, dims: Sequence[int], fill: int = 0xA5) -> Tensor:
    """A contiguous output whose storage starts as `fill` bytes (FP4: two elements a byte)."""
    numel = math.prod(dims)
    size = (numel + 1) // 2 if dtype in FP4_CODES else numel * (4 if dtype == ACL_FLOAT else 1)
    return Tensor(dtype, dims, np.full(size, fill, np.uint8))


class _Session:
    def __init__(self, a: _Api) -> None:
        self.a = a
        self.buffers = []
        self.tensors = []

    def tensor(self, t: Optional[Tensor]):
        if t is None:
            return None
        data = np.ascontiguousarray(t.storage, dtype=np.uint8).reshape(-1)
        nbytes = max(32, data.size)
        ptr = ctypes.c_void_p()
        status = self.a.malloc(ctypes.byref(ptr), nbytes, 0)
        if status != 0:
            raise RuntimeError(f"aclrtMalloc({nbytes}) failed with {status}")
        self.buffers.append(ptr.value)
        if data.size:
            status = self.a.memcpy(ptr.value, nbytes, data.ctypes.data, data.size, 1)
            if status != 0:
                raise RuntimeError(f"aclrtMemcpy failed with {status}")
        ndim = len(t.dims)
        dims = (ctypes.c_int64 * max(1, ndim))(*t.dims)
        strides = None if t.strides is None else (ctypes.c_int64 * max(1, ndim))(*t.strides)
        storage = (ctypes.c_int64 * 1)(nbytes * 2 if t.dtype in FP4_CODES else
                                       nbytes // (4 if t.dtype == ACL_FLOAT else 8 if t.dtype == ACL_INT64 else
                                                  2 if t.dtype in (ACL_FLOAT16, ACL_BF16) else 1))
        handle = self.a.create(dims, ndim, t.dtype, strides, t.offset, ND, storage, 1, ptr.value)
        if not handle:
            raise RuntimeError(f"aclCreateTensor failed: {self.a.message()}")
        self.tensors.append(handle)
        return handle, ptr.value, data.size

    def read(self, ptr: int, size: int) -> np.ndarray:
        out = np.empty(size, np.uint8)
        if size:
            status = self.a.memcpy(out.ctypes.data, size, ptr, size, 2)
            if status != 0:
                raise RuntimeError(f"aclrtMemcpy failed with {status}")
        return out

    def close(self) -> None:
        for handle in self.tensors:
            self.a.destroy(handle)
        for ptr in self.buffers:
            self.a.free(ptr)


def call(x: Tensor, weight: Optional[Tensor] = None, group_index: Optional[Tensor] = None,
         scale: Optional[Tensor] = None, *, dst_type: int, quant_mode: int, y: Tensor, y_scale: Tensor,
         y_origin: Optional[Tensor] = None, block_size: int = 0, round_scale: bool = False,
         clamp_limit: float = -1.0, dst_type_max: float = 15.0, output_origin: bool = False,
         workspace: bool = True) -> Result:
    """Both phases; the outputs' storage bytes after the launch (or the failing status and its
    message). y_origin defaults to an empty tensor of x's dtype."""
    a = api()
    if y_origin is None:
        y_origin = Tensor(x.dtype, [0], np.zeros(0, np.uint8))
    session = _Session(a)
    try:
        handles = [session.tensor(t) for t in (x, weight, group_index, scale, y, y_scale, y_origin)]
        ptrs = [None if h is None else h[0] for h in handles]
        size = ctypes.c_uint64(0)
        executor = ctypes.c_void_p()
        status = a.phase1(ptrs[0], ptrs[1], ptrs[2], ptrs[3], dst_type, quant_mode, block_size, round_scale,
                          clamp_limit, dst_type_max, output_origin, ptrs[4], ptrs[5], ptrs[6],
                          ctypes.byref(size), ctypes.byref(executor))
        if status != 0:
            return Result(status, (a.message() or b"").decode())
        ws = ctypes.c_void_p()
        if workspace and size.value:
            if a.malloc(ctypes.byref(ws), size.value, 0) != 0:
                a.destroy_executor(executor)
                raise RuntimeError("aclrtMalloc of the workspace failed")
            session.buffers.append(ws.value)
        status = a.phase2(ws.value, size.value if workspace else 0, executor, None)
        if status != 0:
            return Result(status, (a.message() or b"").decode(), workspace_size=size.value)
        status = a.sync(None)
        if status != 0:
            return Result(status, (a.message() or b"").decode(), workspace_size=size.value)
        y_bytes = session.read(handles[4][1], handles[4][2])
        s_bytes = session.read(handles[5][1], handles[5][2])
        return Result(0, "", y_bytes, s_bytes, size.value)
    finally:
        session.close()


def quantise(x: np.ndarray, weight: Optional[np.ndarray] = None, group_index: Optional[np.ndarray] = None, *,
             dst_type: int, quant_mode: int, round_scale: bool = False, clamp_limit: float = -1.0,
             y_fill: int = 0xA5) -> Tuple[np.ndarray, np.ndarray]:
    """The emulator's outputs for contiguous x [..., 2H] with outputs of the documented shapes:
    y [T, H] uint8 (FP4: [T, H/2] packed), scales [T, H/128] float32 (mode 0) or [T, H/32] uint8
    (mode 1); rows past trunc hold `y_fill` bytes. Raises on a failing status."""
    lead = list(x.shape[:-1])
    h = x.shape[-1] // 2
    t = math.prod(lead)
    if quant_mode == 0:
        scale_t = output(ACL_FLOAT, lead + [h // 128], y_fill)
    else:
        scale_t = output(ACL_FLOAT8_E8M0, lead + [(h // 32 + 1) // 2, 2], y_fill)
    result = call(tensor_of(x), None if weight is None else tensor_of(weight),
                  None if group_index is None else tensor_of(group_index), dst_type=dst_type,
                  quant_mode=quant_mode, y=output(dst_type, lead + [h], y_fill), y_scale=scale_t,
                  round_scale=round_scale, clamp_limit=clamp_limit)
    if result.status != 0:
        raise RuntimeError(f"aclnnSwigluGroupQuant failed with {result.status}: {result.message}")
    assert result.y is not None and result.y_scale is not None
    y = result.y.reshape(t, -1)
    scales = result.y_scale.view(np.float32).reshape(t, -1) if quant_mode == 0 else result.y_scale.reshape(t, -1)
    return y, scales
