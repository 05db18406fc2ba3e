"""PyTorch integration: the operator as ``torch.ops.acl_swiglu.swiglu_group_quant_grad``, a
differentiable ``swiglu`` whose backward runs it, and a ``SwiGLU`` module; and the forward
operator as ``torch.ops.acl_swiglu.swiglu_group_quant`` with ``swiglu_group_quant``,
``dequantise``, ``dst_type_code`` and the differentiable ``swiglu_quant`` (acl_swiglu._torch_forward).

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
import math
import os
from typing import Any, Callable, ContextManager, Dict, Optional, Tuple, cast

import torch

import acl_swiglu
from acl_swiglu import ArgumentError, DeviceArray, DeviceBuffer, Stream, _loader
from acl_swiglu._torch_common import (
    _LIBRARY, CLAMP_OFF, IO_DTYPES, TensorLayout, _allocate, _as_numpy, _check_flag, _check_npu_formats,
    _check_same_device, _check_tensor, _check_type, _clamp_argument, _clamp_option, _current_stream,
    _framework_first, _from_numpy, _load_backend, _operator_weight, _optional_numpy, _routing_weight, _torch_npu,
    tensor_layout)
from acl_swiglu._validate import Rules
from acl_swiglu.op import REVISIONS

__all__ = ["SwiGLU", "swiglu", "swiglu_group_quant_grad", "TensorLayout", "tensor_layout",
           "swiglu_group_quant", "swiglu_quant", "QuantisedSwiGLU", "dequantise", "dst_type_code"]

SCHEMA = ("swiglu_group_quant_grad(Tensor grad_y, Tensor x, *, Tensor? weight=None, Tensor? y_origin=None, "
          "Tensor? group_index=None, float clamp_limit=-1.0) -> (Tensor, Tensor)")
OP_NAME = "acl_swiglu::swiglu_group_quant_grad"

MAX_RANK = 8
DEFAULT_REVISION = 2   # what traced code checks when the revision is not known yet


# ---- argument rules (shared by the fake and the real implementations) ----


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


# ---- CPU tensors: zero-copy NumPy views through the one-shot call ----


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


def _npu(grad_y: torch.Tensor, x: torch.Tensor, *, weight: Optional[torch.Tensor] = None,
         y_origin: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
         clamp_limit: float = CLAMP_OFF) -> Tuple[torch.Tensor, torch.Tensor]:
    torch_npu = _torch_npu()
    _load_backend()
    _check_arguments(grad_y, x, weight, y_origin, group_index, clamp_limit, _revision_rules())
    named: Dict[str, Any] = {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin, "group_index": group_index}
    device = x.device
    _check_npu_formats(torch_npu, named)
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
        stream = _current_stream(torch_npu, device)
        keep: list[torch.Tensor] = []

        def workspace(nbytes: int) -> DeviceBuffer:
            # Freed back to the caching allocator when this call returns: safe, since the
            # allocator orders its reuse after the work queued on this same stream.
            buffer = _allocate((nbytes,), torch.uint8, device)
            keep.append(buffer)
            return DeviceBuffer.wrap(buffer.data_ptr(), nbytes)

        run_device_arrays(arrays, clamp, stream, workspace)
    return grad_x, grad_weight


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


# The forward operator's names (its module builds on _torch_common only, so it imports nothing from here).
from acl_swiglu._torch_forward import (  # noqa: E402
    QuantisedSwiGLU, dequantise, dst_type_code, swiglu_group_quant, swiglu_quant)
