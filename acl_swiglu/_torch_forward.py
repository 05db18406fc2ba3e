"""PyTorch integration of the forward, aclnnSwigluGroupQuant: the operator as
``torch.ops.acl_swiglu.swiglu_group_quant`` (the schema of the operator's own torch extension),
``swiglu_group_quant`` on tensors with the NumPy call's rules, ``dst_type_code`` for the schema's
number, ``dequantise`` (the values codes and scales stand for), and ``swiglu_quant``, which pairs
this forward with the backward operator for training (a straight-through gradient).
acl_swiglu.torch imports this module and exports its public names.

As for the backward: CPU tensors run the one-shot NumPy call on zero-copy views; NPU tensors are
described in place, their outputs and workspace come from torch_npu's caching allocator and the
work goes on its current stream; the fake implementation checks the NumPy call's rules on shapes
and dtypes alone, so torch.compile and torch.export trace the operator without loading anything.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple, Union, cast

import numpy as np
import torch

import acl_swiglu
from acl_swiglu import ArgumentError, DeviceBuffer, formats
from acl_swiglu._checks import whole_number
from acl_swiglu._torch_common import (
    _LIBRARY, _NUMPY_DTYPES, CLAMP_OFF, _allocate, _as_numpy, _check_flag, _check_npu_formats, _check_same_device,
    _check_tensor, _clamp_argument, _clamp_option, _current_stream, _framework_first, _from_numpy,
    _load_backend, _operator_weight, _optional_numpy, _torch_npu, tensor_layout)
from acl_swiglu._validate_forward import DST_TYPE_MAX_DEFAULT, ForwardProblem, validate_forward
from acl_swiglu.forward import get_workspace_size

__all__ = ["QuantisedSwiGLU", "dequantise", "dst_type_code", "swiglu_group_quant", "swiglu_quant"]

SCHEMA = ("swiglu_group_quant(Tensor x, Tensor? weight=None, Tensor? group_index=None, Tensor? scale=None, *, "
          "int dst_type=291, int quant_mode=0, int block_size=0, bool round_scale=False, float clamp_limit=-1.0, "
          "float dst_type_max=15.0, bool output_origin=False) -> (Tensor y, Tensor y_scale, Tensor y_origin)")
OP_NAME = "acl_swiglu::swiglu_group_quant"

# The schema's dst_type numbers, as the operator's own torch extension has them: 256 + the
# aclDataType code of every destination type, and torch's ScalarType numbers of its FP8 dtypes.
CODE_OFFSET = 256
DST_TYPE_DEFAULT = 291   # float8_e5m2 (256 + 35), the extension's default (the aclnn call has none)
_TORCH_SCALAR_TYPES = {23: "float8_e5m2", 24: "float8_e4m3fn"}
_BY_ACL_CODE = {t.acl_code: t for t in formats.DST_TYPES.values()}
_TORCH_DST_TYPES = {torch.float8_e4m3fn: "float8_e4m3fn", torch.float8_e5m2: "float8_e5m2"}
_E8M0 = getattr(torch, "float8_e8m0fnu", None)   # (torch 2.7 on; before it, the scale bytes are uint8)
_HIFLOAT8_MODES = (2, 3)
_MX_GROUP, _BLOCK = 32, 128


# ---- dst_type: names and dtypes for people, numbers for the schema ----


def _dst_type(dst_type: object) -> formats.DstType:
    """A destination type from a name of acl_swiglu.formats.DST_TYPES, a DstType, an ml_dtypes dtype
    or torch.float8_e4m3fn / torch.float8_e5m2; numbers are refused (TypeError), as by the NumPy call."""
    if isinstance(dst_type, torch.dtype):
        name = _TORCH_DST_TYPES.get(dst_type)
        if name is None:
            raise ArgumentError(f"dst_type {dst_type} is not a destination type; use torch.float8_e4m3fn, "
                                f"torch.float8_e5m2 or a name of acl_swiglu.formats.DST_TYPES "
                                f"({', '.join(map(repr, formats.DST_TYPES))})")
        return formats.DST_TYPES[name]
    try:
        return formats.as_dst_type(dst_type)
    except ValueError as error:
        raise ArgumentError(str(error)) from None


def dst_type_code(dst_type: Union[str, torch.dtype, formats.DstTypeLike]) -> int:
    """The number ``torch.ops.acl_swiglu.swiglu_group_quant`` takes as dst_type for a destination
    type (a name of acl_swiglu.formats.DST_TYPES, torch.float8_e4m3fn, torch.float8_e5m2 or an
    ml_dtypes dtype): 256 + its aclDataType code, as in the operator's own torch extension."""
    return CODE_OFFSET + _dst_type(dst_type).acl_code


def _dst_of_code(code: int) -> formats.DstType:
    """The schema's dst_type number as a destination type."""
    name = _TORCH_SCALAR_TYPES.get(code)
    if name is not None:
        return formats.DST_TYPES[name]
    found = _BY_ACL_CODE.get(code - CODE_OFFSET)
    if found is None:
        known = ", ".join(f"{CODE_OFFSET + t.acl_code} ({t.name})" for t in formats.DST_TYPES.values())
        raise ArgumentError(f"dst_type {code} is no destination type's number: the operator takes 256 + the "
                            f"aclDataType code, {known}, or torch's number of a float8 dtype (23 float8_e5m2, "
                            "24 float8_e4m3fn); acl_swiglu.torch.dst_type_code(...) gives it from a name or dtype")
    return found


# ---- the NumPy call's rules, on shapes and dtypes alone ----


class _Described(NamedTuple):
    """What the forward's rules read of an array: its shape and its NumPy dtype."""

    shape: Tuple[Any, ...]   # (ints, or symbolic ints while traced)
    dtype: np.dtype


def _other_numpy_dtypes() -> Dict[torch.dtype, np.dtype]:
    """NumPy's names for the other torch dtypes NumPy has, so that a refusal names a tensor's dtype."""
    found = {}
    for dtype in (torch.float64, torch.int32, torch.int16, torch.int8, torch.bool, torch.complex64, torch.complex128):
        found[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return found


_DESCRIBED_DTYPES = {**_other_numpy_dtypes(), **_NUMPY_DTYPES}
_TORCH_DTYPES = {numpy: dtype for dtype, numpy in _NUMPY_DTYPES.items()}


def _described(name: str, tensor: Optional[torch.Tensor]) -> Optional[_Described]:
    if tensor is None:
        return None
    dtype = _DESCRIBED_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ArgumentError(f"{name} has dtype {tensor.dtype}, which the operator takes for no argument")
    return _Described(tuple(tensor.shape), dtype)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of an output the NumPy call gives as `dtype` (E8M0 scales: uint8 before torch 2.7)."""
    return _TORCH_DTYPES.get(dtype, torch.uint8)


def _tensors(x: torch.Tensor, weight: Optional[torch.Tensor], group_index: Optional[torch.Tensor],
             scale: Optional[torch.Tensor]) -> Dict[str, Optional[torch.Tensor]]:
    """The tensor arguments, checked to be dense tensors on one device with a dtype NumPy has."""
    tensors = {"x": x, "weight": weight, "group_index": group_index, "scale": scale}
    for name, tensor in tensors.items():
        _check_tensor(name, tensor, optional=name != "x")
        _described(name, tensor)
    _check_same_device(x, {name: tensors[name] for name in ("weight", "group_index", "scale")})
    return tensors


def _options(dst_type: int, quant_mode: int, block_size: int, round_scale: bool, clamp_limit: float,
             dst_type_max: float, output_origin: bool) -> Dict[str, Any]:
    """The schema's scalars as the NumPy call's keyword arguments: dst_type's number as its type,
    clamp -1.0 as None, and dst_type_max's default as not given (modes 0 to 2 do not read it)."""
    return {"dst_type": _dst_of_code(dst_type), "quant_mode": quant_mode, "block_size": block_size,
            "round_scale": round_scale, "clamp_limit": _clamp_argument(clamp_limit),
            "dst_type_max": None if dst_type_max == DST_TYPE_MAX_DEFAULT else dst_type_max,
            "output_origin": output_origin}


def _problem(tensors: Dict[str, Optional[torch.Tensor]], options: Dict[str, Any]) -> ForwardProblem:
    """The NumPy call's validation of these tensors' shapes and dtypes with these options; reads no
    data and loads nothing. (The installed release's limits are checked when the operator runs.)"""
    arguments: Dict[str, Any] = {name: _described(name, tensor) for name, tensor in tensors.items()}
    arguments.update(options)
    return validate_forward(arguments, array_types=(_Described,), array_text="a torch.Tensor", check_outputs=False,
                            counts_overread=None)


OUTPUTS = ("y", "y_scale", "y_origin")
_Outputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _fake(x: torch.Tensor, weight: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
          scale: Optional[torch.Tensor] = None, *, dst_type: int = DST_TYPE_DEFAULT, quant_mode: int = 0,
          block_size: int = 0, round_scale: bool = False, clamp_limit: float = CLAMP_OFF,
          dst_type_max: float = DST_TYPE_MAX_DEFAULT, output_origin: bool = False) -> _Outputs:
    problem = _problem(_tensors(x, weight, group_index, scale),
                       _options(dst_type, quant_mode, block_size, round_scale, clamp_limit, dst_type_max,
                                output_origin))
    y, y_scale, y_origin = (torch.empty(problem.outputs[name][0], dtype=_torch_dtype(problem.outputs[name][1]),
                                        device=x.device) for name in OUTPUTS)
    return y, y_scale, y_origin


# ---- CPU tensors: the one-shot NumPy call on views ----


def _output_tensor(array: np.ndarray) -> torch.Tensor:
    """A NumPy result as a tensor on its memory: ml_dtypes codes as the torch dtype of their bytes."""
    dtype = _torch_dtype(array.dtype)
    if array.dtype.itemsize == 1 and array.dtype != np.uint8:
        codes = torch.from_numpy(array.view(np.uint8))
        return codes if dtype == torch.uint8 else codes.view(dtype)
    return _from_numpy(array)


def _cpu(x: torch.Tensor, weight: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
         scale: Optional[torch.Tensor] = None, *, dst_type: int = DST_TYPE_DEFAULT, quant_mode: int = 0,
         block_size: int = 0, round_scale: bool = False, clamp_limit: float = CLAMP_OFF,
         dst_type_max: float = DST_TYPE_MAX_DEFAULT, output_origin: bool = False) -> _Outputs:
    _framework_first()
    _load_backend()
    _tensors(x, weight, group_index, scale)   # (checks them)
    options = _options(dst_type, quant_mode, block_size, round_scale, clamp_limit, dst_type_max, output_origin)
    # The NumPy call checks the rest, with the same rules and messages as the fake implementation.
    results: Tuple[np.ndarray, ...] = acl_swiglu.swiglu_group_quant(
        _as_numpy(x), _optional_numpy(weight), _optional_numpy(group_index), _optional_numpy(scale), **options)
    y_origin = _from_numpy(results[2]) if output_origin else torch.empty((0,), dtype=x.dtype)
    return _output_tensor(results[0]), _output_tensor(results[1]), y_origin


# ---- NPU tensors: described in place, on torch_npu's memory and stream ----


def _npu_output(shape: Tuple[int, ...], dtype: torch.dtype, device: torch.device, zeroed: bool) -> torch.Tensor:
    """An output from torch's allocator for `device`; an empty one is a view of one element, since
    an aclTensor needs an address even when it holds nothing."""
    count = math.prod(shape)
    storage = _allocate((max(count, 1),), dtype, device)
    if zeroed:   # rows the operator leaves unwritten (past the truncation) read as zeros
        storage.zero_()
    return storage[:count].view(shape)


def _npu(x: torch.Tensor, weight: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
         scale: Optional[torch.Tensor] = None, *, dst_type: int = DST_TYPE_DEFAULT, quant_mode: int = 0,
         block_size: int = 0, round_scale: bool = False, clamp_limit: float = CLAMP_OFF,
         dst_type_max: float = DST_TYPE_MAX_DEFAULT, output_origin: bool = False) -> _Outputs:
    torch_npu = _torch_npu()
    _load_backend()
    tensors = _tensors(x, weight, group_index, scale)
    options = _options(dst_type, quant_mode, block_size, round_scale, clamp_limit, dst_type_max, output_origin)
    problem = _problem(tensors, options)
    _check_npu_formats(torch_npu, tensors)
    device = x.device
    # As for the backward: torch_npu makes the device current, the package adopts it.
    with torch_npu.npu.device(device):
        _framework_first()
        outputs = {name: _npu_output(problem.outputs[name][0], _torch_dtype(problem.outputs[name][1]), device,
                                     zeroed=name in problem.preset) for name in OUTPUTS}
        arrays: Dict[str, Any] = {name: None if t is None else tensor_layout(t).wrap()
                                  for name, t in {**tensors, **outputs}.items()}
        stream = _current_stream(torch_npu, device)
        try:
            executor = get_workspace_size(arrays["x"], arrays["weight"], arrays["group_index"], arrays["scale"],
                                          y=arrays["y"], y_scale=arrays["y_scale"], y_origin=arrays["y_origin"],
                                          **options)
            with executor:
                workspace = None
                if executor.workspace_size:
                    # Back to the caching allocator when this call returns: its reuse is ordered
                    # after the work queued on this same stream.
                    buffer = _allocate((executor.workspace_size,), torch.uint8, device)
                    workspace = DeviceBuffer.wrap(buffer.data_ptr(), executor.workspace_size)
                executor.launch(stream, workspace=workspace)
        finally:
            for array in arrays.values():   # borrowed memory: this drops the aclTensor handles only
                if array is not None:
                    array.close()
    return outputs["y"], outputs["y_scale"], outputs["y_origin"]


NO_DERIVATIVE = (f"{OP_NAME} has no derivative: its outputs are quantised codes and their scales. For training, "
                 "acl_swiglu.torch.swiglu_quant runs it with a straight-through gradient (the unquantised SwiGLU's, "
                 "through the backward operator); where no gradient is wanted, call it under torch.no_grad() or on "
                 "detached tensors")


def _refuse_derivative(ctx: Any, *grads: Any) -> None:
    raise NotImplementedError(NO_DERIVATIVE)


def _keep_nothing(ctx: Any, inputs: Tuple[Any, ...], keyword_only_inputs: Dict[str, Any], output: Any) -> None:
    pass   # the backward only refuses


_LIBRARY.define(SCHEMA)
_LIBRARY.impl("swiglu_group_quant", _cpu, "CPU")
_LIBRARY.impl("swiglu_group_quant", _npu, "PrivateUse1")
torch.library.register_fake(OP_NAME, _fake, lib=_LIBRARY)
torch.library.register_autograd(OP_NAME, _refuse_derivative, setup_context=_keep_nothing, lib=_LIBRARY)


# ---- the Python-level call ----


def _python_options(dst_type: object, quant_mode: object, round_scale: object,
                   block_size: object = 0) -> Tuple[int, int, int, bool]:
    """(dst_type's number, quant_mode, block_size, round_scale) for the schema from the Python-level
    arguments, with the NumPy call's rules for their types (round_scale None: True in mode 1, False
    in mode 0); the HiFloat8 modes, which need arguments these calls do not take, are refused."""
    dst = _dst_type(dst_type)
    mode = whole_number(quant_mode, "quant_mode", low=-2**63)
    if mode in _HIFLOAT8_MODES:
        raise ArgumentError(f"quant_mode {mode} (HiFloat8) needs scale, dst_type_max or output_origin, which this "
                            "call does not take: use torch.ops.acl_swiglu.swiglu_group_quant (dst_type="
                            "acl_swiglu.torch.dst_type_code('hifloat8'))")
    rounded = mode == 1 if round_scale is None else _check_flag("round_scale", round_scale)
    return dst_type_code(dst), mode, whole_number(block_size, "block_size"), rounded


def swiglu_group_quant(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                       group_index: Optional[torch.Tensor] = None, *, dst_type: Any, quant_mode: int = 0,
                       block_size: int = 0, round_scale: Optional[bool] = None,
                       clamp_limit: Optional[float] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU forward with quantisation on tensors: (y, y_scale), the operator's codes and scales
    (no gradient: acl_swiglu.torch.swiglu_quant is the differentiable form).

    x [..., 2H] float16 or bfloat16, gate half first (2H a multiple of 256, 2 to 8 dims; 7 in mode
    1). weight: the MoE router's per-token weight, as for swiglu: [T], [T, 1], x's leading dims or
    those then 1, float32 (float16 / bfloat16 widened exactly). group_index: int64 [G] counts; rows
    from min(sum, T) on are zero. dst_type: "float8_e4m3fn", "float8_e5m2", "float4_e2m1fn",
    "float4_e1m2", torch.float8_e4m3fn / torch.float8_e5m2 or an ml_dtypes dtype, never a number.
    quant_mode 0: a float32 scale per 128 elements (powers of two with round_scale=True); 1 (MX): an
    E8M0 scale per 32. clamp_limit None is off, else > 0. The other rules and their errors are the
    NumPy call's (acl_swiglu.swiglu_group_quant).

    Returns y [..., H] as torch.float8_e4m3fn / float8_e5m2, or uint8 [..., H/2] with two FP4
    codes a byte (low nibble first); y_scale float32 [..., H/128] (mode 0) or [..., H/64, 2]
    torch.float8_e8m0fnu (mode 1; uint8 bytes before torch 2.7). ``dequantise(y, y_scale)`` gives
    the values they stand for.
    """
    for name, tensor, optional in (("x", x, False), ("weight", weight, True), ("group_index", group_index, True)):
        # Dense tensors here (torch would dispatch a sparse one to a kernel that does not
        # exist); the operator's kernels check the rest, the fake one when traced.
        _check_tensor(name, tensor, optional)
    code, mode, block, rounded = _python_options(dst_type, quant_mode, round_scale, block_size)
    clamp = _clamp_option(clamp_limit)
    y, y_scale, _ = torch.ops.acl_swiglu.swiglu_group_quant(
        x, None if weight is None else _operator_weight(weight, x), group_index, dst_type=code, quant_mode=mode,
        block_size=block, round_scale=rounded, clamp_limit=CLAMP_OFF if clamp is None else clamp)
    return y, y_scale


# ---- the values codes and scales stand for ----


def _code_type(y: torch.Tensor, dst_type: object) -> formats.DstType:
    named = None if dst_type is None else _dst_type(dst_type)
    of_dtype = _TORCH_DST_TYPES.get(y.dtype)
    if of_dtype is not None:
        if named is not None and named.name != of_dtype:
            raise ArgumentError(f"dst_type {named.name!r} does not match y's dtype {y.dtype}")
        return formats.DST_TYPES[of_dtype]
    if y.dtype != torch.uint8:
        raise ArgumentError(f"y has dtype {y.dtype}; codes are torch.float8_e4m3fn, torch.float8_e5m2, or uint8 "
                            "holding two FP4 codes a byte")
    if named is None or not named.packed:
        raise ArgumentError("y holds uint8 bytes: dst_type must say which FP4 type they are ('float4_e2m1fn' or "
                            f"'float4_e1m2'), got {dst_type!r}")
    return named


# The value of each FP4 code (bit 3 the sign: code 8 is -0.0), by type.
_FP4_VALUES = {t.name: formats.unpack_fp4(np.arange(16, dtype=np.uint8), t)[0::2].tolist()
               for t in formats.DST_TYPES.values() if t.packed}


def _fp4_values(y: torch.Tensor, dst: formats.DstType) -> torch.Tensor:
    """float32 [..., 2n] from FP4 codes two a byte [..., n], low nibble first."""
    table = torch.tensor(_FP4_VALUES[dst.name], dtype=torch.float32, device=y.device)
    pairs = torch.stack((table[(y & 0x0F).long()], table[(y >> 4).long()]), dim=-1)
    return pairs.reshape(*y.shape[:-1], 2 * y.shape[-1])


def _e8m0_values(y_scale: torch.Tensor) -> torch.Tensor:
    """float32 2^(b - 127) of E8M0 bytes, built from the bits (b 0 is 2^-127, a subnormal; 255 NaN)."""
    b = y_scale.view(torch.uint8).to(torch.int32)
    bits = (b << 23) | (((b == 0) | (b == 255)).to(torch.int32) << 22)
    return bits.view(torch.float32)


def dequantise(y: torch.Tensor, y_scale: torch.Tensor, *, dst_type: Any = None,
               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values the codes y stand for, times their scales: y.float() * y_scale, each scale over its
    block of 128 elements (float32 y_scale, quant mode 0) or group of 32 (E8M0 y_scale, mode 1),
    computed in float32 and returned as `dtype`. dst_type is needed only for FP4 bytes (uint8 y).

    A plain function of its inputs: codes carry no gradient (acl_swiglu.torch.swiglu_quant's
    ``dequantised`` output is the differentiable one)."""
    _check_tensor("y", y)
    _check_tensor("y_scale", y_scale)
    _check_same_device(y, {"y_scale": y_scale})
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    dst = _code_type(y, dst_type)
    values = _fp4_values(y, dst) if dst.packed else y.to(torch.float32)
    lead, hidden = tuple(values.shape[:-1]), values.shape[-1]
    if y_scale.dtype == torch.float32 and not dst.packed:
        per, scales = _BLOCK, y_scale
    elif y_scale.dtype in (_E8M0, torch.uint8) and y_scale.dim() == y.dim() + 1 and y_scale.shape[-1] == 2:
        per, scales = _MX_GROUP, _e8m0_values(y_scale).reshape(*y_scale.shape[:-2], -1)
    else:
        raise ArgumentError(f"y_scale is {y_scale.dtype} {list(y_scale.shape)}; for y {y.dtype} {list(y.shape)} it "
                            "must be float32 [..., H/128] (quant mode 0, FP8 only) or E8M0 bytes [..., H/64, 2] "
                            "(mode 1)")
    if hidden % per or tuple(scales.shape) != lead + (hidden // per,):
        raise ArgumentError(f"y_scale has shape {list(y_scale.shape)}; for y of shape {list(y.shape)} it must hold "
                            f"one scale per {per} elements of each row")
    blocks = values.reshape(*lead, hidden // per, per) * scales.unsqueeze(-1)
    return blocks.reshape(*lead, hidden).to(dtype)


# ---- the differentiable pairing: the forward operator, then the backward operator ----


class QuantisedSwiGLU(NamedTuple):
    """What swiglu_quant gives: the operator's codes and scales, and the values they stand for."""

    y: torch.Tensor            # the codes (no gradient)
    y_scale: torch.Tensor      # their scales (no gradient)
    dequantised: torch.Tensor  # dequantise(y, y_scale) in x's dtype: the differentiable output


class _SwiGLUQuantFunction(torch.autograd.Function):
    """The forward operator's codes, and their values as the differentiable output. The backward
    takes the quantisation as the identity (straight-through): the gradient reaching the values
    is the gradient of weight * silu(x0c) * x1c, which the backward operator computes, with the
    unweighted output recomputed (quant modes 0 and 1 cannot output it)."""

    @staticmethod
    def forward(x: torch.Tensor, weight_rows: Optional[torch.Tensor], group_index: Optional[torch.Tensor],
                code: int, mode: int, block: int, rounded: bool, clamp: Optional[float],
                packed: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, y_scale, _ = torch.ops.acl_swiglu.swiglu_group_quant(
            x, weight_rows, group_index, dst_type=code, quant_mode=mode, block_size=block, round_scale=rounded,
            clamp_limit=CLAMP_OFF if clamp is None else clamp)
        return y, y_scale, dequantise(y, y_scale, dst_type=packed, dtype=x.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[torch.Tensor, ...]) -> None:
        x, weight_rows, group_index, _, _, _, _, clamp, _ = inputs
        ctx.clamp_limit = clamp
        ctx.save_for_backward(x, weight_rows, group_index)
        ctx.mark_non_differentiable(output[0], output[1])

    @staticmethod
    def backward(ctx: Any, _grad_y: Any, _grad_y_scale: Any, grad_values: torch.Tensor) -> Tuple[Any, ...]:
        x, weight_rows, group_index = ctx.saved_tensors
        clamp = CLAMP_OFF if ctx.clamp_limit is None else ctx.clamp_limit
        y_origin = None if weight_rows is None else _unweighted_output(x, ctx.clamp_limit)
        # (The backward operator, which acl_swiglu.torch defines; it imports this module.)
        grad_x, grad_weight = torch.ops.acl_swiglu.swiglu_group_quant_grad(
            grad_values.to(x.dtype), x, weight=weight_rows, y_origin=y_origin, group_index=group_index,
            clamp_limit=clamp)
        return grad_x, None if weight_rows is None else grad_weight, None, None, None, None, None, None, None


def _unweighted_output(x: torch.Tensor, clamp_limit: Optional[float]) -> torch.Tensor:
    """silu(x0c) * x1c in fp32, rounded to x's dtype: the y_origin the backward operator takes
    with weight. Rows past the truncation need no zeroing: the backward operator computes none."""
    gate, value = x.float().chunk(2, dim=-1)
    if clamp_limit is not None:
        gate = gate.clamp(max=clamp_limit)
        value = value.clamp(min=-clamp_limit, max=clamp_limit)
    return (torch.nn.functional.silu(gate) * value).to(x.dtype)


# torch declares Function.apply without annotations: this is what it returns here.
_apply_swiglu_quant = cast(Callable[..., Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], _SwiGLUQuantFunction.apply)


def swiglu_quant(x: torch.Tensor, weight: Optional[torch.Tensor] = None, group_index: Optional[torch.Tensor] = None,
                 *, dst_type: Any, quant_mode: int = 0, block_size: int = 0, round_scale: Optional[bool] = None,
                 clamp_limit: Optional[float] = None) -> QuantisedSwiGLU:
    """SwiGLU with quantisation for training (FP8 MoE): the forward operator gives (y, y_scale) as
    swiglu_group_quant does, and ``dequantised``, the values they stand for in x's dtype, is
    differentiable in x and weight with a straight-through gradient: the gradient of the
    unquantised weight * silu(x0c) * x1c (acl_swiglu.torch.swiglu's), computed by the backward
    operator. Arguments and rules as swiglu_group_quant's. Returns QuantisedSwiGLU(y, y_scale,
    dequantised); y and y_scale carry no gradient."""
    for name, tensor, optional in (("x", x, False), ("weight", weight, True), ("group_index", group_index, True)):
        _check_tensor(name, tensor, optional)
    code, mode, block, rounded = _python_options(dst_type, quant_mode, round_scale, block_size)
    dst = _dst_of_code(code)
    clamp = _clamp_option(clamp_limit)
    # weight as torch operations make it (widened, reshaped): their own backward gives its
    # gradient the caller's shape and dtype.
    weight_rows = None if weight is None else _operator_weight(weight, x)
    y, y_scale, values = _apply_swiglu_quant(x, weight_rows, group_index, code, mode, block, rounded, clamp,
                                             dst.name if dst.packed else None)
    return QuantisedSwiGLU(y, y_scale, values)
