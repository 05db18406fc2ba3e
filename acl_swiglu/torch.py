"""PyTorch integration: the operator as ``torch.ops.acl_swiglu.swiglu_group_quant_grad``, a
differentiable ``swiglu`` whose backward runs it, and a ``SwiGLU`` module.

Importing this module needs torch (the ``torch`` extra); ``import acl_swiglu`` never does.

- CPU tensors run on the backend in use (a real CANN, or the bundled emulator) through the
  one-shot NumPy call, on zero-copy NumPy views of the tensors (any strides, any storage offset).
- NPU tensors (torch_npu) are never copied: each one is described to aclCreateTensor by its
  storage base, storage_offset() and stride() (elements); outputs and workspace come from
  torch_npu's caching allocator; the work goes on the current torch_npu stream of the tensors'
  device, read at every call.

The libraries are loaded when the operator first runs, never while torch.compile or torch.export
traces: what the traced code runs (the forward, the argument checks, the fake implementation) reads
the ABI revision only where it is known without loading anything (ACL_SWIGLU_ABI, or an install
already loaded), and otherwise checks revision 2's rules, the revision every CANN release ships.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from types import FrameType, ModuleType
from typing import Any, Callable, ContextManager, Dict, Optional, Sequence, Tuple, cast

import numpy as np
import torch

import acl_swiglu
from acl_swiglu import ArgumentError, AclSwigluWarning, DeviceArray, DeviceBuffer, Stream, _loader, bfloat16
from acl_swiglu._validate import Rules, check_clamp_limit
from acl_swiglu.op import REVISIONS

__all__ = ["SwiGLU", "swiglu", "swiglu_group_quant_grad", "TensorLayout", "tensor_layout"]

CLAMP_OFF = -1.0   # the schema's "no clamp", as in the operator's own torch extension
SCHEMA = ("swiglu_group_quant_grad(Tensor grad_y, Tensor x, *, Tensor? weight=None, Tensor? y_origin=None, "
          "Tensor? group_index=None, float clamp_limit=-1.0) -> (Tensor, Tensor)")
OP_NAME = "acl_swiglu::swiglu_group_quant_grad"

_NUMPY_DTYPES: Dict[torch.dtype, np.dtype] = {torch.float32: np.dtype(np.float32), torch.float16: np.dtype(np.float16),
                 torch.bfloat16: bfloat16, torch.int64: np.dtype(np.int64)}
IO_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_RANK = 8
DEFAULT_REVISION = 2   # what traced code checks when the revision is not known yet

# torch_npu's base formats (the storage is laid out as the tensor's strides say): ND, NCHW,
# NHWC, NCDHW. Every other format (FRACTAL_NZ, NC1HWC0, ...) is a private tiled layout.
NPU_BASE_FORMATS = {0: "NCHW", 1: "NHWC", 2: "ND", 30: "NCDHW"}


# ---- argument rules (shared by the fake and the real implementations) ----


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


def _revision_rules() -> Rules:
    """The shape rules of the ABI revision calls use (revision 1: ranks 2-3, weight [..., 1]);
    finding it may load the libraries, so only what runs the operator calls this."""
    return cast(Rules, REVISIONS[acl_swiglu.abi_revision()].rules)


def _known_revision() -> Optional[int]:
    """The revision calls will use, when that is known without loading anything: ACL_SWIGLU_ABI
    when set, else the loaded install's; None before the libraries are loaded."""
    if _loader.parse_revision(_loader.ENV_ABI, os.environ.get(_loader.ENV_ABI)) is None and _loader.loaded() is None:
        return None
    return acl_swiglu.abi_revision()   # loads nothing now: the setting or the loaded install answers


def _trace_rules() -> Rules:
    """The rules a trace (the fake implementation) checks: the known revision's, else revision 2's.
    Loads nothing, so that torch.compile and torch.export never load libraries; a revision-1
    install then refuses the rest when the operator runs, with the same message."""
    return cast(Rules, REVISIONS[_known_revision() or DEFAULT_REVISION].rules)


_ANY_REVISION = Rules("any ABI revision", 1, MAX_RANK, False)


def _check_x(x: torch.Tensor, rules: Rules = _ANY_REVISION) -> None:
    """x: a fused [..., 2H] tensor of an operator dtype, with a rank `rules` allow."""
    _check_tensor("x", x)
    if x.dtype not in IO_DTYPES:
        raise ArgumentError(f"x has dtype {x.dtype}; it must be torch.float32, torch.float16 or torch.bfloat16")
    if not rules.min_rank <= x.dim() <= rules.max_rank:
        raise ArgumentError(f"x has {x.dim()} dims; it must have {rules.min_rank} to {rules.max_rank} ({rules.text})")
    if x.shape[-1] % 2 != 0:
        raise ArgumentError(f"x has shape {tuple(x.shape)}; its last dim must be even (gate and value halves)")


def _check_weight(weight: torch.Tensor, x: torch.Tensor, rules: Rules) -> None:
    """The raw operator's weight: fp32 with one element per row of x (any shape with that many
    elements and 1 to 8 dims; revision 1: x's leading dims then 1)."""
    _check_tensor("weight", weight)
    if weight.dtype != torch.float32:
        raise ArgumentError(f"weight has dtype {weight.dtype}; the operator takes torch.float32 (the Python-level "
                            "acl_swiglu.torch.swiglu_group_quant_grad and swiglu also take float16 and bfloat16)")
    rows = math.prod(x.shape[:-1])
    if weight.numel() != rows:
        raise ArgumentError(f"weight has {weight.numel()} elements; it must have one per row of x ({rows})")
    rows_then_one = tuple(x.shape[:-1]) + (1,)
    if rules.weight_trailing_one and tuple(weight.shape) != rows_then_one:
        raise ArgumentError(f"weight has shape {tuple(weight.shape)}; {rules.text} needs x's leading "
                            f"dims followed by 1: {rows_then_one}")
    if not 1 <= weight.dim() <= MAX_RANK:
        raise ArgumentError(f"weight has {weight.dim()} dims; it must have 1 to {MAX_RANK} (e.g. {rows_then_one})")


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


def _check_group_index(group_index: Optional[torch.Tensor]) -> None:
    _check_tensor("group_index", group_index, optional=True)
    if group_index is not None and (group_index.dtype != torch.int64 or group_index.dim() != 1):
        raise ArgumentError(f"group_index is {group_index.dtype} with {group_index.dim()} dims; it must be a "
                            "1-D torch.int64 tensor of per-group token counts")


def _check_arguments(grad_y: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                     y_origin: Optional[torch.Tensor], group_index: Optional[torch.Tensor],
                     clamp_limit: float, rules: Rules) -> None:
    """The operator's shape, dtype and device rules under `rules`, on metadata only (never reads data)."""
    _check_x(x, rules)
    _check_tensor("grad_y", grad_y)
    _check_tensor("y_origin", y_origin, optional=True)
    if grad_y.dtype != x.dtype:
        raise ArgumentError(f"grad_y has dtype {grad_y.dtype}; it must be x's dtype {x.dtype}")
    if grad_y.dim() != x.dim() or grad_y.shape[:-1] != x.shape[:-1]:
        raise ArgumentError(f"grad_y has shape {tuple(grad_y.shape)}; it must have x's leading dims "
                            f"{tuple(x.shape[:-1])} and a last dim of x's last dim / 2")
    if grad_y.shape[-1] * 2 != x.shape[-1]:
        raise ArgumentError(f"grad_y's last dim is {grad_y.shape[-1]}; it must be x's last dim / 2 = "
                            f"{x.shape[-1] // 2}")
    if weight is not None:
        _check_weight(weight, x, rules)
        if y_origin is None:
            raise ArgumentError("y_origin is required with weight (the unweighted forward output)")
    if y_origin is not None:
        if weight is None:
            raise ArgumentError("y_origin is given without weight; it is only used with weight")
        if y_origin.dtype != x.dtype or y_origin.shape != grad_y.shape:
            raise ArgumentError(f"y_origin is {y_origin.dtype} {tuple(y_origin.shape)}; it must be grad_y's "
                                f"{grad_y.dtype} {tuple(grad_y.shape)}")
    _check_group_index(group_index)
    _check_same_device(x, {"grad_y": grad_y, "weight": weight, "y_origin": y_origin, "group_index": group_index})
    _clamp_argument(clamp_limit)


def _empty_grad_weight(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((0,), dtype=torch.float32, device=x.device)


def _fake(grad_y: torch.Tensor, x: torch.Tensor, *, weight: Optional[torch.Tensor] = None,
          y_origin: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
          clamp_limit: float = CLAMP_OFF) -> Tuple[torch.Tensor, torch.Tensor]:
    _check_arguments(grad_y, x, weight, y_origin, group_index, clamp_limit, _trace_rules())
    grad_x = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if weight is None:
        return grad_x, _empty_grad_weight(x)
    return grad_x, torch.empty(weight.shape, dtype=torch.float32, device=weight.device)


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
        ours = warning.filename.startswith(_PACKAGE_DIR)
        if ours and category is RuntimeWarning:
            category = AclSwigluWarning
        if ours and frame is not None:
            warnings.warn_explicit(warning.message if category is warning.category else str(warning.message),
                                   category, frame.f_code.co_filename, frame.f_lineno,
                                   module=frame.f_globals.get("__name__"),
                                   registry=frame.f_globals.setdefault("__warningregistry__", {}))
        else:   # not the loader's (another thread's, in the meantime): as it was given
            warnings.warn_explicit(warning.message, category, warning.filename, warning.lineno)


# ---- CPU tensors: zero-copy NumPy views through the one-shot call ----


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


def _cpu(grad_y: torch.Tensor, x: torch.Tensor, *, weight: Optional[torch.Tensor] = None,
         y_origin: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
         clamp_limit: float = CLAMP_OFF) -> Tuple[torch.Tensor, torch.Tensor]:
    _framework_first()
    _load_backend()
    _check_arguments(grad_y, x, weight, y_origin, group_index, clamp_limit, _revision_rules())
    grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad(
        _as_numpy(grad_y), _as_numpy(x), _optional_numpy(weight), _optional_numpy(y_origin),
        _optional_numpy(group_index), clamp_limit=_clamp_argument(clamp_limit))
    return _from_numpy(grad_x), (_from_numpy(grad_weight) if grad_weight is not None else _empty_grad_weight(x))


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


def run_device_arrays(arrays: Dict[str, Any], clamp_limit: Optional[float], stream: Stream,
                      workspace: Callable[[int], Optional[DeviceBuffer]]) -> None:
    """Both phases on DeviceArrays (grad_y, x, weight, y_origin, group_index, grad_x, grad_weight;
    absent ones None; revision 1 takes group_index as host counts), queued on `stream`, with the
    workspace `workspace(nbytes)` gives. The arrays' tensor handles are released on return."""
    made = [a for a in arrays.values() if isinstance(a, DeviceArray)]
    try:
        executor = acl_swiglu.get_workspace_size(
            arrays["grad_y"], arrays["x"], arrays["weight"], arrays["y_origin"], arrays["group_index"],
            clamp_limit, grad_x=arrays["grad_x"], grad_weight=arrays["grad_weight"])
        with executor:
            executor.launch(stream, workspace=workspace(executor.workspace_size) if executor.workspace_size else None)
    finally:
        for array in made:   # borrowed memory: this drops the aclTensor handles only
            array.close()


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


def _npu(grad_y: torch.Tensor, x: torch.Tensor, *, weight: Optional[torch.Tensor] = None,
         y_origin: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
         clamp_limit: float = CLAMP_OFF) -> Tuple[torch.Tensor, torch.Tensor]:
    torch_npu = _torch_npu()
    _load_backend()
    _check_arguments(grad_y, x, weight, y_origin, group_index, clamp_limit, _revision_rules())
    named: Dict[str, Any] = {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin, "group_index": group_index}
    device = x.device
    for name, tensor in named.items():
        if tensor is None:
            continue
        npu_format = int(torch_npu.get_npu_format(tensor))
        if npu_format not in NPU_BASE_FORMATS:
            raise ArgumentError(f"{name} has the private NPU format {npu_format}; the operator takes ND tensors "
                                "(convert with torch_npu.npu_format_cast(tensor, 2))")
    clamp = _clamp_argument(clamp_limit)
    # torch_npu makes the device current (its aclInit comes first, so its configuration
    # stands); the package adopts a thread's current device and never switches it.
    with torch_npu.npu.device(device):
        _framework_first()
        grad_x = _allocate(x.shape, x.dtype, device)
        grad_weight = (_allocate(weight.shape, torch.float32, device) if weight is not None
                       else _empty_grad_weight(x))
        if group_index is not None and acl_swiglu.abi_revision() == 1:
            named["group_index"] = group_index.cpu().numpy()   # revision 1 reads host counts at phase 1
        arrays = {name: (tensor_layout(t).wrap() if isinstance(t, torch.Tensor) else t)
                  for name, t in named.items()}
        arrays["grad_x"] = tensor_layout(grad_x).wrap()
        arrays["grad_weight"] = tensor_layout(grad_weight).wrap() if weight is not None else None
        # Read at every call: reading npu_stream flushes torch_npu's queue, so queued producers
        # of the inputs are submitted before our launch.
        stream = Stream.from_handle(torch_npu.npu.current_stream(device).npu_stream)
        keep: list[torch.Tensor] = []

        def workspace(nbytes: int) -> DeviceBuffer:
            # Freed back to the caching allocator when this call returns: safe, since the
            # allocator orders its reuse after the work queued on this same stream.
            buffer = _allocate((nbytes,), torch.uint8, device)
            keep.append(buffer)
            return DeviceBuffer.wrap(buffer.data_ptr(), nbytes)

        run_device_arrays(arrays, clamp, stream, workspace)
    return grad_x, grad_weight


_LIBRARY = torch.library.Library("acl_swiglu", "DEF")
_LIBRARY.define(SCHEMA)
_LIBRARY.impl("swiglu_group_quant_grad", _cpu, "CPU")
_LIBRARY.impl("swiglu_group_quant_grad", _npu, "PrivateUse1")
torch.library.register_fake(OP_NAME, _fake, lib=_LIBRARY)


NO_DERIVATIVE = (f"{OP_NAME} has no derivative: it is itself the backward of swiglu, so second-order gradients "
                 "through acl_swiglu.torch.swiglu (create_graph=True, torch.func.grad of a grad, hessians) and "
                 "gradients of the operator's own outputs are not supported (where no gradient is wanted, call it "
                 "under torch.no_grad() or on detached tensors)")


_OVERLOAD = torch.ops.acl_swiglu.swiglu_group_quant_grad.default
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset


class _NoDerivative(torch.autograd.Function):
    """The operator on inputs that require grad: its outputs carry a backward that refuses.
    Without it torch would only warn and give no gradient, a second-order gradient that silently
    leaves this part out. (torch.library.register_autograd does not take keyword-only tensors.)"""

    @staticmethod
    def forward(keyset: Any, grad_y: torch.Tensor, x: torch.Tensor, weight: Optional[torch.Tensor],
                y_origin: Optional[torch.Tensor], group_index: Optional[torch.Tensor],
                clamp_limit: float) -> Tuple[torch.Tensor, torch.Tensor]:
        with torch._C._AutoDispatchBelowAutograd():
            return _below_autograd(keyset, grad_y, x, weight=weight, y_origin=y_origin, group_index=group_index,
                                   clamp_limit=clamp_limit)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, torch.Tensor]) -> None:
        pass   # nothing to keep: the backward only refuses

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> None:
        raise NotImplementedError(NO_DERIVATIVE)


# torch declares Function.apply without annotations: this is what it returns here.
_apply_no_derivative = cast(Callable[..., Tuple[torch.Tensor, torch.Tensor]], _NoDerivative.apply)


def _below_autograd(keyset: Any, grad_y: torch.Tensor, x: torch.Tensor,
                    **options: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """The CPU, NPU or fake implementation, whichever the dispatcher chose below autograd."""
    return cast(Tuple[torch.Tensor, torch.Tensor], _OVERLOAD.redispatch(keyset & _AFTER_AUTOGRAD, grad_y, x, **options))


def _requires_grad(tensor: Optional[torch.Tensor]) -> bool:
    return tensor is not None and tensor.requires_grad   # a missing required tensor arrives as None


def _autograd(keyset: Any, grad_y: torch.Tensor, x: torch.Tensor, *, weight: Optional[torch.Tensor] = None,
              y_origin: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
              clamp_limit: float = CLAMP_OFF) -> Tuple[torch.Tensor, torch.Tensor]:
    if torch.is_grad_enabled() and (_requires_grad(grad_y) or _requires_grad(x) or _requires_grad(weight)
                                    or _requires_grad(y_origin)):
        if torch._C._are_functorch_transforms_active():
            # torch.func cannot carry an autograd.Function's node from inside an operator
            # kernel: the derivative would be missing, so refuse now.
            raise NotImplementedError(NO_DERIVATIVE)
        return _apply_no_derivative(keyset, grad_y, x, weight, y_origin, group_index, clamp_limit)
    return _below_autograd(keyset, grad_y, x, weight=weight, y_origin=y_origin, group_index=group_index,
                           clamp_limit=clamp_limit)


# A Python kernel costs a few microseconds per call; redispatching below autograd with the
# keyset it was called with keeps that to one hop.
_LIBRARY.impl("swiglu_group_quant_grad", _autograd, "Autograd", with_keyset=True)


def swiglu_group_quant_grad(grad_y: torch.Tensor, x: torch.Tensor, *, weight: Optional[torch.Tensor] = None,
                            y_origin: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
                            clamp_limit: Optional[float] = None) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """SwiGLU backward on tensors: (grad_x, grad_weight), grad_weight None without weight.
    clamp_limit None means off, otherwise > 0.

    weight (the MoE router's per-token weight) may be float32, float16 or bfloat16, shaped [T],
    [T, 1], x's leading dims or those followed by 1; the operator gets it widened to float32 and
    shaped x's leading dims then 1, and grad_weight comes back in weight's own shape and dtype
    (computed in float32, rounded once)."""
    for name, tensor, optional in (("grad_y", grad_y, False), ("x", x, False), ("weight", weight, True),
                                   ("y_origin", y_origin, True), ("group_index", group_index, True)):
        # Types here; the operator's kernels check the rest (the fake one when traced).
        _check_type(name, tensor, optional)
    clamp = _clamp_option(clamp_limit)
    weight_rows = None if weight is None else _operator_weight(weight, x)
    grad_x, grad_weight = torch.ops.acl_swiglu.swiglu_group_quant_grad(
        grad_y, x, weight=weight_rows, y_origin=y_origin, group_index=group_index,
        clamp_limit=CLAMP_OFF if clamp is None else clamp)
    if weight is None:
        return grad_x, None
    if weight_rows is weight:
        return grad_x, grad_weight
    return grad_x, grad_weight.reshape(weight.shape).to(weight.dtype)


def _operator_weight(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """weight as the operator takes it; one already so (as swiglu's backward passes it) goes
    through untouched and unread, since torch.compile traces that backward reading nothing but a
    tensor's dtype and shape."""
    if weight.dtype == torch.float32 and tuple(weight.shape) == (*x.shape[:-1], 1):
        return weight
    return _routing_weight(weight, x)


# ---- the differentiable forward ----


def _truncation(group_index: torch.Tensor, rows: int) -> torch.Tensor:
    """trunc as the operator computes it: counts cast to uint32 and summed in uint32, capped at T."""
    return torch.clamp(torch.bitwise_and(torch.bitwise_and(group_index, 0xFFFFFFFF).sum(), 0xFFFFFFFF), max=rows)


def _unweighted(x: torch.Tensor, clamp_limit: Optional[float], group_index: Optional[torch.Tensor]) -> torch.Tensor:
    """silu(x0c) * x1c in fp32 (rows at or past trunc zero), not yet rounded: the traceable form."""
    gate, value = x.float().chunk(2, dim=-1)
    if clamp_limit is not None:
        gate = gate.clamp(max=clamp_limit)
        value = value.clamp(min=-clamp_limit, max=clamp_limit)
    y = torch.nn.functional.silu(gate) * value
    if group_index is not None:
        rows = math.prod(x.shape[:-1])
        keep = torch.arange(rows, device=x.device) < _truncation(group_index, rows)
        y = torch.where(keep.reshape(*x.shape[:-1], 1), y, torch.zeros((), dtype=y.dtype, device=y.device))
    return y


# Elements of gradY per block of the eager CPU forward: its temporaries stay in the cache instead
# of making five passes over T x H floats in memory, and each operation on a block (at most
# 2 x 16384 elements, torch's grain) runs in the calling thread: waking torch's thread pool for
# every small operation costs more than it gives, and far more while other threads (the emulator
# kernel's, after a backward) still hold the cores.
_BLOCK_ELEMENTS = 1 << 14


def _block_rows(hidden: int) -> int:
    """Rows per block: about _BLOCK_ELEMENTS elements, and a multiple of 64 elements, so that
    torch's vectorised loops (which leave a remainder of under 64 to its scalar code) split a
    contiguous block where they split the whole tensor."""
    if hidden == 0:
        return 1 << 30
    align = 64 // math.gcd(hidden, 64)
    return max(align, _BLOCK_ELEMENTS // hidden // align * align)


def _in_blocks(x: torch.Tensor) -> bool:
    """Whether the forward may run block by block: eager, on plain CPU tensors (never while
    torch.compile, torch.export or torch.func trace, where the one-expression form is kept)."""
    return (not torch.compiler.is_compiling() and type(x) is torch.Tensor and x.device.type == "cpu"
            and not torch._C._are_functorch_transforms_active())


def _forward_in_blocks(x: torch.Tensor, weight_rows: Optional[torch.Tensor], clamp_limit: Optional[float],
                       group_index: Optional[torch.Tensor],
                       keep_unweighted: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """_forward's values, computed a block of rows at a time with the one expression's fp32
    operations, in its order and on its layouts: the same bits as that expression computed in
    one thread (torch's vectorised and scalar exp differ in the last bit, and how torch splits
    an operation between threads decides which elements get which)."""
    hidden = x.shape[-1] // 2
    rows = math.prod(x.shape[:-1])
    flat = x.reshape(rows, 2 * hidden)
    weights = None if weight_rows is None else weight_rows.reshape(rows, 1)
    trunc = rows if group_index is None else int(_truncation(group_index, rows))
    out = torch.empty((rows, hidden), dtype=x.dtype)
    y_origin = torch.empty((rows, hidden), dtype=x.dtype) if keep_unweighted else None
    step = _block_rows(hidden)
    with torch.no_grad():
        for start in range(0, trunc, step):
            stop = min(start + step, rows)   # (whole blocks: rows past trunc are zeroed below)
            # The one expression's layouts: x's rows in fp32, the halves views of them; torch
            # vectorises silu by layout, and its vectorised exp can differ from the scalar one.
            block = flat[start:stop].to(torch.float32, copy=True)
            gate, value = block[:, :hidden], block[:, hidden:]
            if clamp_limit is not None:
                gate = gate.clamp(max=clamp_limit)
                value = value.clamp(min=-clamp_limit, max=clamp_limit)
                torch.nn.functional.silu(gate, inplace=True)
            else:
                gate = torch.nn.functional.silu(gate)
            gate.mul_(value)
            if y_origin is not None:
                y_origin[start:stop] = gate
            if weights is not None:
                gate.mul_(weights[start:stop])
            out[start:stop] = gate
        if trunc < rows:   # zero rows, times the weight as the one-expression form has it (-0.0, NaN)
            tail = torch.zeros((rows - trunc, hidden), dtype=torch.float32)
            if weights is not None:
                tail.mul_(weights[trunc:])
            out[trunc:] = tail
            if y_origin is not None:
                y_origin[trunc:] = 0
    shape = (*x.shape[:-1], hidden)
    return out.reshape(shape), (None if y_origin is None else y_origin.reshape(shape))


def _forward(x: torch.Tensor, weight_rows: Optional[torch.Tensor], clamp_limit: Optional[float],
             group_index: Optional[torch.Tensor], keep_unweighted: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(out, y_origin): out = weight * silu(x0c) * x1c in fp32, rounded once to x's dtype (no
    weight: the unweighted value); y_origin the unweighted value rounded, when asked for."""
    if _in_blocks(x):
        return _forward_in_blocks(x, weight_rows, clamp_limit, group_index, keep_unweighted)
    y = _unweighted(x, clamp_limit, group_index)
    y_origin = y.to(x.dtype) if keep_unweighted else None
    return (y if weight_rows is None else y * weight_rows).to(x.dtype), y_origin


def _first_order_only() -> ContextManager[Any]:
    """Where swiglu's backward runs the operator: under torch.func with a single differentiating
    transform (torch.func.grad, vjp), whose result is that gradient and is never differentiated
    again, the operator runs without recording; anywhere else the operator decides (a second
    derivative is refused)."""
    if not torch._C._are_functorch_transforms_active():
        return contextlib.nullcontext()
    from torch._C._functorch import TransformType
    from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters
    levels = [i for i in retrieve_all_functorch_interpreters() if i.key() in (TransformType.Grad, TransformType.Jvp)]
    return torch.no_grad() if len(levels) == 1 else contextlib.nullcontext()


class _SwiGLUFunction(torch.autograd.Function):
    """weight arrives as the operator takes it (fp32, x's leading dims then 1): swiglu widens and
    reshapes the caller's weight with torch operations, whose own backward gives the gradient
    the caller's shape and dtype."""

    @staticmethod
    def forward(x: torch.Tensor, weight_rows: Optional[torch.Tensor], clamp_limit: Optional[float],
                group_index: Optional[torch.Tensor],
                recompute_y_origin: bool) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        return _forward(x, weight_rows, clamp_limit, group_index,
                        keep_unweighted=weight_rows is not None and not recompute_y_origin)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, Optional[torch.Tensor]]) -> None:
        x, weight_rows, clamp_limit, group_index, recompute_y_origin = inputs
        ctx.clamp_limit = clamp_limit
        ctx.recompute_y_origin = recompute_y_origin
        ctx.save_for_backward(x, weight_rows, group_index, output[1])
        if output[1] is not None:
            ctx.mark_non_differentiable(output[1])

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, _grad_y_origin: Optional[torch.Tensor]
                 ) -> Tuple[torch.Tensor, Optional[torch.Tensor], None, None, None]:
        x, weight_rows, group_index, y_origin = ctx.saved_tensors
        if weight_rows is not None and y_origin is None:
            y_origin = _forward(x, None, ctx.clamp_limit, group_index, keep_unweighted=False)[0]
        with _first_order_only():
            grad_x, grad_weight = swiglu_group_quant_grad(
                grad_out.to(x.dtype), x, weight=weight_rows, y_origin=y_origin, group_index=group_index,
                clamp_limit=ctx.clamp_limit)
        return grad_x, grad_weight, None, None, None


# torch declares Function.apply without annotations: this is what it returns here.
_apply_swiglu = cast(Callable[..., Tuple[torch.Tensor, Optional[torch.Tensor]]], _SwiGLUFunction.apply)


def swiglu(x: torch.Tensor, weight: Optional[torch.Tensor] = None, *, clamp_limit: Optional[float] = None,
           group_index: Optional[torch.Tensor] = None, recompute_y_origin: bool = True) -> torch.Tensor:
    """SwiGLU on fused x [..., 2H] (gate first): weight * silu(x0c) * x1c, computed in fp32 and
    rounded once to x's dtype; x0c = min(x0, c), x1c = clip(x1, -c, c) with clamp_limit c.

    weight: the MoE router's per-token weight, one element per row of x: [T], [T, 1], x's
    leading dims or those followed by 1; float32, or float16 / bfloat16 (widened to float32, its
    gradient rounded back to its dtype). group_index: int64 per-group token counts; rows at or
    past their sum are zero. Differentiable in x and weight; the backward runs the operator. The
    forward is plain torch and loads no library. With weight, the backward needs the unweighted
    output: recompute_y_origin=True (default) recomputes it there instead of keeping it alive
    between forward and backward (a third less saved activation memory for one elementwise pass;
    the bits are the same either way).
    """
    clamp_limit = _clamp_option(clamp_limit)
    # The revision's rank rule where it is known without loading (never while tracing, which
    # must not touch the loader); the operator checks it again when the backward runs.
    revision = None if torch.compiler.is_compiling() else _known_revision()
    _check_x(x, _ANY_REVISION if revision is None else cast(Rules, REVISIONS[revision].rules))
    _check_tensor("weight", weight, optional=True)
    _check_group_index(group_index)
    _check_same_device(x, {"weight": weight, "group_index": group_index})
    weight_rows = None if weight is None else _routing_weight(weight, x)
    return _apply_swiglu(x, weight_rows, clamp_limit, group_index,
                         _check_flag("recompute_y_origin", recompute_y_origin))[0]


class SwiGLU(torch.nn.Module):
    """``swiglu`` as a module: ``SwiGLU(clamp_limit=None)(x, weight=None, group_index=None)``."""

    def __init__(self, clamp_limit: Optional[float] = None, recompute_y_origin: bool = True) -> None:
        super().__init__()
        self.clamp_limit = _clamp_option(clamp_limit)
        self.recompute_y_origin = _check_flag("recompute_y_origin", recompute_y_origin)

    def forward(self, x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                group_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        return swiglu(x, weight, clamp_limit=self.clamp_limit, group_index=group_index,
                      recompute_y_origin=self.recompute_y_origin)

    def extra_repr(self) -> str:
        return f"clamp_limit={self.clamp_limit}, recompute_y_origin={self.recompute_y_origin}"
