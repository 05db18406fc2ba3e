"""What the package's torch operators share (acl_swiglu.torch and acl_swiglu._torch_forward build
on it; it names no operator): the argument rules of tensors and of the schemas' scalars, loading
the backend outside any trace, zero-copy NumPy views of CPU tensors, the description of NPU
tensors in place, torch_npu's allocator and current stream, and the ``acl_swiglu`` library the
operators are defined in.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Dict, Optional, Sequence, Tuple, cast

import ml_dtypes
import numpy as np
import torch

import acl_swiglu
from acl_swiglu import ArgumentError, AclSwigluWarning, DeviceArray, Stream, _loader, bfloat16
from acl_swiglu._validate import check_clamp_limit

CLAMP_OFF = -1.0   # the schema's "no clamp", as in the operator's own torch extension

# torch dtypes and the NumPy dtypes the package's arrays give them (bfloat16 and the FP8 codes: ml_dtypes').
_NUMPY_DTYPES: Dict[torch.dtype, np.dtype] = {
    torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16), torch.bfloat16: bfloat16,
    torch.int64: np.dtype(np.int64), torch.uint8: np.dtype(np.uint8),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn), torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2)}
if hasattr(torch, "float8_e8m0fnu"):   # (torch 2.7 on)
    _NUMPY_DTYPES[torch.float8_e8m0fnu] = np.dtype(ml_dtypes.float8_e8m0fnu)
IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# torch_npu's base formats (the storage is laid out as the tensor's strides say): ND, NCHW,
# NHWC, NCDHW. Every other format (FRACTAL_NZ, NC1HWC0, ...) is a private tiled layout.
NPU_BASE_FORMATS = {0: "NCHW", 1: "NHWC", 2: "ND", 30: "NCDHW"}


# ---- argument rules of tensors and of the schemas' scalars ----


def _clamp_argument(clamp_limit: float) -> Optional[float]:
    """The schema's float as the NumPy API's clamp_limit: None for "off", which is -1.0 after the
    conversion to fp32 the operator makes; any other value must pass the NumPy API's rule."""
    # The schema has already made any number a float; a symbolic float (a trace) is decided on
    # its value here, as the real implementation will be.
    value = float(clamp_limit)
    if -2.0 < value < 0.0 and float(np.float32(value)) == CLAMP_OFF:
        return None
    if not value > 0:   # NaN included
        raise ArgumentError(f"clamp_limit must be -1.0 (off) or > 0, got {value!r}")
    if value == math.inf:   # (a comparison: traceable on a symbolic float)
        raise ArgumentError(f"clamp_limit must be -1.0 (off) or a finite number > 0, got {value!r}")
    return check_clamp_limit(value)   # within fp32's range, and not rounding to 0 in fp32


def _clamp_option(clamp_limit: object) -> Optional[float]:
    """The Python-level clamp_limit: None (off) or a real number > 0 that fp32 holds; the NumPy
    API's rule, so bools, strings and tensors are refused, as are inf and values fp32 cannot hold."""
    if isinstance(clamp_limit, (int, float)) and not isinstance(clamp_limit, bool) and not clamp_limit > 0:
        raise ArgumentError(f"clamp_limit must be None (off) or > 0, got {clamp_limit!r}")   # NaN included
    return check_clamp_limit(clamp_limit)


def _check_type(name: str, value: object, optional: bool = False) -> None:
    """`name` is a torch.Tensor (or None, when optional)."""
    if not (isinstance(value, torch.Tensor) or (optional and value is None)):
        kind = "a torch.Tensor or None" if optional else "a torch.Tensor"
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")


def _check_tensor(name: str, value: object, optional: bool = False) -> None:
    """`name` is a dense torch.Tensor (or None, when optional)."""
    _check_type(name, value, optional)
    if isinstance(value, torch.Tensor) and (value.layout != torch.strided or value.is_nested):
        raise ArgumentError(f"{name} is a {'nested' if value.is_nested else value.layout} tensor; the operator "
                            "takes dense (torch.strided) tensors (convert with .to_dense())")


def _check_flag(name: str, value: object) -> bool:
    """A bool option: a string or a tensor is refused rather than taken for its truth value."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _check_same_device(x: torch.Tensor, named: Dict[str, Optional[torch.Tensor]]) -> None:
    """Every tensor on x's device: torch would run a mixed call on the "highest" device alone (a
    meta tensor among CPU ones makes the whole call a shape-only one, with unwritten outputs)."""
    for name, tensor in named.items():
        if tensor is not None and tensor.device != x.device:
            raise ArgumentError(f"{name} is on {tensor.device} but x is on {x.device}: all tensors must be on one "
                                "device")


def _routing_weight(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The Python-level weight (the MoE router's per-token weight) as the operator takes it: fp32,
    shaped x's leading dims then 1. Accepted: float32, float16 or bfloat16 (widened to fp32,
    exactly), shaped [T], [T, 1], x's leading dims, or those followed by 1 -- the shapes whose rows
    cannot be read in another order than x's."""
    _check_tensor("weight", weight)
    if weight.dtype not in IO_DTYPES:
        raise ArgumentError(f"weight has dtype {weight.dtype}; it must be torch.float32, torch.float16 or "
                            "torch.bfloat16 (float16 and bfloat16 are widened to float32)")
    leading = tuple(x.shape[:-1])
    rows = math.prod(leading)
    if weight.numel() != rows:
        raise ArgumentError(f"weight has {weight.numel()} elements; it must have one per row of x ({rows})")
    accepted = ((rows,), (rows, 1), leading, leading + (1,))
    if tuple(weight.shape) not in accepted:
        shapes = ", ".join(dict.fromkeys(str(list(shape)) for shape in accepted))
        raise ArgumentError(f"weight has shape {list(weight.shape)}; for x of shape {list(x.shape)} it must be one "
                            f"of {shapes} (one weight per row of x, in x's row order)")
    return weight.reshape(leading + (1,)).to(torch.float32)


def _operator_weight(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """weight as the operator takes it; one already so (as swiglu's backward passes it) goes
    through untouched and unread, since torch.compile traces that backward reading nothing but a
    tensor's dtype and shape."""
    if weight.dtype == torch.float32 and tuple(weight.shape) == (*x.shape[:-1], 1):
        return weight
    return _routing_weight(weight, x)


# ---- loading the backend, outside any trace ----


_PACKAGE_DIR = os.path.dirname(os.path.abspath(acl_swiglu.__file__)) + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_first_load = threading.Lock()


def _caller_frame() -> Optional[FrameType]:
    """The innermost frame outside this package, torch and the import machinery: the user's
    line that led here (a forward, a backward, a call of the operator)."""
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith(_PACKAGE_DIR) or name.startswith(_TORCH_DIR) or name.startswith("<frozen")):
            return frame
        frame = frame.f_back
    return None


def _load_backend() -> None:
    """Loads the libraries on the operator's first run. What the loader warns while doing so
    ("no CANN found, running on the emulator", a known CANN release's limitation) is given as
    an AclSwigluWarning attributed to the caller's line, not to a line inside this package or torch."""
    if _loader.loaded() is not None:
        return
    with _first_load:   # (one thread records the warnings of the load at a time)
        if _loader.loaded() is not None:
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            acl_swiglu.backend_info()
    frame = _caller_frame()
    for warning in caught:
        category = warning.category
        # The loader's own warnings point at the first frame outside the package, which is
        # torch's dispatcher when an operator kernel made the first call.
        ours = warning.filename.startswith(_PACKAGE_DIR) or warning.filename.startswith(_TORCH_DIR)
        if ours and category is RuntimeWarning:
            category = AclSwigluWarning
        if ours and frame is not None:
            warnings.warn_explicit(warning.message if category is warning.category else str(warning.message),
                                   category, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__"),
                                   registry=frame.f_globals.setdefault("__warningregistry__", {}))
        else:   # not the loader's (another thread's, in the meantime): as it was given
            warnings.warn_explicit(warning.message, category, warning.filename, warning.lineno)


# ---- CPU tensors: zero-copy NumPy views ----


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view of the tensor's memory (no copy; strides and offset kept)."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:   # NumPy has no bfloat16: reinterpret the bits
        return cast(np.ndarray, tensor.view(torch.uint16).numpy().view(bfloat16))
    return tensor.numpy()


def _optional_numpy(tensor: Optional[torch.Tensor]) -> Optional[np.ndarray]:
    return None if tensor is None else _as_numpy(tensor)


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    if array.dtype == bfloat16:
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def _framework_first() -> None:
    """When torch_npu is in use, it initialises ACL before our first call, so that its aclInit
    (and configuration) is the one that stands and we never finalise it."""
    torch_npu = sys.modules.get("torch_npu")
    if torch_npu is not None:
        torch_npu.npu.init()   # does nothing once torch_npu is initialised


# ---- NPU tensors: the storage described in place ----


@dataclass(frozen=True)
class TensorLayout:
    """How aclCreateTensor sees a tensor: its storage's base address, the view's shape, dtype,
    strides and offset (both in elements, from the base) and the storage's size in bytes."""

    base: int
    shape: Tuple[int, ...]
    dtype: np.dtype
    strides: Tuple[int, ...]
    offset: int
    storage_nbytes: int

    def wrap(self, base: Optional[int] = None) -> DeviceArray:
        """The view as a DeviceArray borrowing the storage at `base` (default: its own)."""
        return DeviceArray.wrap(self.base if base is None else base, self.shape, self.dtype, strides=self.strides,
                                offset=self.offset, nbytes=self.storage_nbytes)


def tensor_layout(tensor: torch.Tensor) -> TensorLayout:
    """The description of a tensor's memory that the device path hands to the operator."""
    dtype = _NUMPY_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ArgumentError(f"a tensor of dtype {tensor.dtype} cannot be passed to the operator")
    storage = tensor.untyped_storage()
    return TensorLayout(storage.data_ptr(), tuple(tensor.shape), dtype, tuple(tensor.stride()),
                        int(tensor.storage_offset()), storage.nbytes())


def _torch_npu() -> ModuleType:
    # Imported by name: torch_npu exists only on Ascend hosts, and ships no type information.
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        raise RuntimeError("these tensors are on an NPU device, but torch_npu cannot be imported") from None


def _allocate(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Device memory for outputs and workspace: torch's allocator for `device` (torch_npu's
    caching allocator), never an aclrtMalloc per call."""
    return torch.empty(shape, dtype=dtype, device=device)


def _check_npu_formats(torch_npu: ModuleType, named: Dict[str, Optional[torch.Tensor]]) -> None:
    """Every given tensor in a base format: the operators read storage as the strides say."""
    for name, tensor in named.items():
        if tensor is None:
            continue
        npu_format = int(torch_npu.get_npu_format(tensor))
        if npu_format not in NPU_BASE_FORMATS:
            raise ArgumentError(f"{name} has the private NPU format {npu_format}; the operator takes ND tensors "
                                "(convert with torch_npu.npu_format_cast(tensor, 2))")


def _current_stream(torch_npu: ModuleType, device: torch.device) -> Stream:
    """torch_npu's current stream of `device`, read at every call: reading npu_stream flushes
    torch_npu's queue, so queued producers of the inputs are submitted before our launch."""
    return Stream.from_handle(torch_npu.npu.current_stream(device).npu_stream)


# The operators' library: each operator's module defines its schema and kernels in it.
_LIBRARY = torch.library.Library("acl_swiglu", "DEF")
