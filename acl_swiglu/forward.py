"""aclnnSwigluGroupQuant, the forward: SwiGLU with weight, clamp and group truncation, then FP8 or
FP4 quantisation. Its description for the generic aclnn layer, and its public calls (one-shot
NumPy call, device-level call, phase 1, and a reusable plan), as the backward's (acl_swiglu.op).

Quant mode 0 gives FP8 codes with a float32 scale per 128 elements, mode 1 (MX) FP8 or FP4 codes
with an E8M0 scale per 32; modes 2 and 3 (HiFloat8) are handed to the installed CANN, and the
emulator refuses them. The number formats are acl_swiglu.formats'; docs/forward.md has the rules.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, Union

import numpy as np

from . import _aclnn, _plan, _releases
from ._device import DeviceArray, Stream
from ._operator import BOOL, DOUBLE, INPUT, INT64, OUTPUT, Executor, OperatorDescription, Param, Revision
from ._validate_forward import ForwardProblem, validate_forward
from .formats import DstTypeLike

__all__ = ["SwigluGroupQuantPlan", "get_workspace_size", "swiglu_group_quant", "swiglu_group_quant_device",
           "SWIGLU_GROUP_QUANT"]

_PARAMS = (Param("x", "x", INPUT), Param("weight", "weightOptional", INPUT),
           Param("group_index", "groupIndexOptional", INPUT), Param("scale", "scaleOptional", INPUT),
           Param("dst_type", "dstType", INT64), Param("quant_mode", "quantMode", INT64),
           Param("block_size", "blockSize", INT64), Param("round_scale", "roundScale", BOOL),
           Param("clamp_limit", "clampLimit", DOUBLE), Param("dst_type_max", "dstTypeMax", DOUBLE),
           Param("output_origin", "outputOrigin", BOOL), Param("y", "yOut", OUTPUT),
           Param("y_scale", "yScaleOut", OUTPUT), Param("y_origin", "yOriginOut", OUTPUT))


def _validate(arguments: Mapping[str, Any], revision: Revision, device: bool) -> ForwardProblem:
    return validate_forward(arguments, array_types=(DeviceArray,) if device else (np.ndarray,),
                            array_text="a DeviceArray" if device else "a numpy.ndarray", check_outputs=device,
                            counts_overread=_releases.quant_counts_overread())


def _scalars(problem: ForwardProblem, revision: Revision) -> Tuple[Any, ...]:
    return (problem.dst.acl_code, problem.quant_mode, problem.block_size, problem.round_scale,
            problem.clamp_limit, problem.dst_type_max, problem.output_origin)


# One ABI in every release that has the operator (9.1.0 on).
SWIGLU_GROUP_QUANT = _aclnn.register(OperatorDescription(
    name="SwigluGroupQuant",
    phase1="aclnnSwigluGroupQuantGetWorkspaceSize",
    phase2="aclnnSwigluGroupQuant",
    thunk="acl_swiglu_phase1_swiglu_group_quant",
    revisions={1: Revision(1, _PARAMS, None)}, revision=lambda: 1,
    validate=_validate, scalars=_scalars,
))
_OP = SWIGLU_GROUP_QUANT

Quantised = Union[Tuple[Any, Any], Tuple[Any, Any, Any]]


def _arguments(x: Any, weight: Any, group_index: Any, scale: Any, dst_type: Any, quant_mode: Any, block_size: Any,
               round_scale: Any, clamp_limit: Any, dst_type_max: Any, output_origin: Any,
               **outputs: Any) -> Dict[str, Any]:
    return {"x": x, "weight": weight, "group_index": group_index, "scale": scale, "dst_type": dst_type,
            "quant_mode": quant_mode, "block_size": block_size, "round_scale": round_scale,
            "clamp_limit": clamp_limit, "dst_type_max": dst_type_max, "output_origin": output_origin, **outputs}


def _results(out: Mapping[str, Any], output_origin: object) -> Quantised:
    if output_origin:   # (validated: a bool)
        return out["y"], out["y_scale"], out["y_origin"]
    return out["y"], out["y_scale"]


def swiglu_group_quant(x: np.ndarray, weight: Optional[np.ndarray] = None, group_index: Optional[np.ndarray] = None,
                       scale: Optional[np.ndarray] = None, *, dst_type: DstTypeLike, quant_mode: int = 0,
                       block_size: int = 0, round_scale: Optional[bool] = None, clamp_limit: Optional[float] = None,
                       dst_type_max: Optional[float] = None, output_origin: bool = False) -> Quantised:
    """SwiGLU forward with quantisation on NumPy arrays: copies to the device, runs both phases,
    copies back.

    x [..., 2H] float16 or bfloat16 (x[..., :H] is the gate; 2H a multiple of 256, 2-8 dims),
    weight float32 with one value per row (T = prod(leading dims) elements), group_index int64 [G]
    token counts (rows from min(sum, T) on are not computed: they are zero here). ``dst_type``
    names the codes (``"float8_e4m3fn"``, ``"float8_e5m2"``, ``"float4_e2m1fn"``, ``"float4_e1m2"``,
    or the ml_dtypes dtype). quant_mode 0: a float32 scale per 128 elements (powers of two with
    round_scale=True); quant_mode 1 (MX): an E8M0 scale per 32 (round_scale None or True). clamp_limit
    None is off, else > 0. Modes 2 and 3 (HiFloat8; scale, dst_type_max and output_origin) run on a
    real CANN only.

    Returns (y, y_scale): y [..., H] FP8 (ml_dtypes) or [..., H/2] uint8 holding two FP4 codes a
    byte (acl_swiglu.formats.unpack_fp4 reads them); y_scale [..., H/128] float32 (mode 0) or
    [..., H/64, 2] ml_dtypes.float8_e8m0fnu (mode 1; formats.e8m0_scales gives their values). With
    output_origin=True (modes 2 and 3), (y, y_scale, y_origin).
    """
    out = _aclnn.one_shot(_OP, _arguments(x, weight, group_index, scale, dst_type, quant_mode, block_size,
                                          round_scale, clamp_limit, dst_type_max, output_origin))
    return _results(dict(zip(("y", "y_scale", "y_origin"), out)), output_origin)


def swiglu_group_quant_device(x: DeviceArray, weight: Optional[DeviceArray] = None,
                              group_index: Optional[DeviceArray] = None, scale: Optional[DeviceArray] = None, *,
                              dst_type: DstTypeLike, quant_mode: int = 0, block_size: int = 0,
                              round_scale: Optional[bool] = None, clamp_limit: Optional[float] = None,
                              dst_type_max: Optional[float] = None, output_origin: bool = False,
                              y: Optional[DeviceArray] = None, y_scale: Optional[DeviceArray] = None,
                              y_origin: Optional[DeviceArray] = None, stream: Optional[Stream] = None) -> Quantised:
    """Both phases on device arrays, queued on `stream` (default stream if None); returns (y,
    y_scale), or (y, y_scale, y_origin) with output_origin, allocated when not given (y_scale of
    mode 1 may be given as uint8 bytes). Rows past the truncation are left as they were. Does not
    wait: synchronise the stream, or call to_numpy() on an output (which waits for it)."""
    computed = _aclnn.device_call(_OP, _arguments(x, weight, group_index, scale, dst_type, quant_mode, block_size,
                                                  round_scale, clamp_limit, dst_type_max, output_origin, y=y,
                                                  y_scale=y_scale, y_origin=y_origin), stream)
    return _results(dict(zip(("y", "y_scale", "y_origin"), computed)), output_origin)


def get_workspace_size(x: DeviceArray, weight: Optional[DeviceArray] = None, group_index: Optional[DeviceArray] = None,
                       scale: Optional[DeviceArray] = None, *, dst_type: DstTypeLike, quant_mode: int = 0,
                       block_size: int = 0, round_scale: Optional[bool] = None, clamp_limit: Optional[float] = None,
                       dst_type_max: Optional[float] = None, output_origin: bool = False, y: DeviceArray,
                       y_scale: DeviceArray, y_origin: DeviceArray) -> Executor:
    """Phase 1 (aclnnSwigluGroupQuantGetWorkspaceSize) on device arrays: validates, and returns the
    Executor (``.workspace_size`` bytes of workspace needed, ``.launch()`` is phase 2). y_origin is
    required, as by the operator: an empty (0,) array of x's dtype unless output_origin."""
    return _aclnn.workspace_size(_OP, _arguments(x, weight, group_index, scale, dst_type, quant_mode, block_size,
                                                 round_scale, clamp_limit, dst_type_max, output_origin, y=y,
                                                 y_scale=y_scale, y_origin=y_origin))


class SwigluGroupQuantPlan(_plan.Plan):
    """A repeatable executor of the forward for fixed shapes, dtypes and options, for hot loops.

    Built once from device arrays (their layouts are the plan's; their addresses the first
    binding). ``plan(x=None, weight=None, group_index=None, scale=None, *, y=None, y_scale=None,
    y_origin=None, synchronize=False)`` rebinds only the addresses that changed and launches phase 2
    on the plan's stream, returning (y, y_scale), or (y, y_scale, y_origin) with output_origin.
    Calls are serialised, so one plan may be shared between threads.
    """

    _operator = _OP

    def __init__(self, x: DeviceArray, weight: Optional[DeviceArray] = None, group_index: Optional[DeviceArray] = None,
                 scale: Optional[DeviceArray] = None, *, dst_type: DstTypeLike, quant_mode: int = 0,
                 block_size: int = 0, round_scale: Optional[bool] = None, clamp_limit: Optional[float] = None,
                 dst_type_max: Optional[float] = None, output_origin: bool = False,
                 y: Optional[DeviceArray] = None, y_scale: Optional[DeviceArray] = None,
                 y_origin: Optional[DeviceArray] = None, stream: Optional[Stream] = None) -> None:
        super().__init__(_arguments(x, weight, group_index, scale, dst_type, quant_mode, block_size, round_scale,
                                    clamp_limit, dst_type_max, output_origin, y=y, y_scale=y_scale,
                                    y_origin=y_origin), stream)

    def _set_outputs(self) -> None:
        super()._set_outputs()
        if not self._problem.output_origin:
            self._outputs = self._outputs[:2]   # (y_origin is an empty placeholder then)

    @property
    def y(self) -> DeviceArray:
        """The device array the plan writes y into (the one given, or the one it allocated)."""
        return self._arrays["y"]

    @property
    def y_scale(self) -> DeviceArray:
        """The device array the plan writes y_scale into."""
        return self._arrays["y_scale"]
