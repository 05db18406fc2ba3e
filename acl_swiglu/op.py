"""aclnnSwigluGroupQuantGrad: its description for the generic aclnn layer, and its public calls
(one-shot NumPy call, device-level call, the two phases, and a reusable plan)."""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence, Tuple, Union, cast

import numpy as np

from . import _aclnn, _device_info, _ffi, _loader, _plan, _releases
from ._aclnn import release_cached
from ._device import DeviceArray, Stream
from ._operator import DOUBLE, HOST_INTS, INPUT, OUTPUT, Executor, OperatorDescription, Param, Revision
from ._validate import Problem, Rules, host_counts, validate

__all__ = ["Executor", "SwigluGroupQuantGradPlan", "get_workspace_size", "release_cached",
           "swiglu_group_quant_grad", "swiglu_group_quant_grad_device", "SWIGLU_GROUP_QUANT_GRAD"]


def _params(group_index_kind: str) -> Tuple[Param, ...]:
    return (Param("grad_y", "gradY", INPUT), Param("x", "x", INPUT), Param("weight", "weightOptional", INPUT),
            Param("y_origin", "yOriginOptional", INPUT), Param("group_index", "groupIndexOptional", group_index_kind),
            Param("clamp_limit", "clampLimit", DOUBLE), Param("grad_x", "gradXOut", OUTPUT),
            Param("grad_weight", "gradWeightOutOptional", OUTPUT))


# Revision 1 (the first published form of the operator): groupIndex an aclIntArray of host
# counts, clamp 0 = off, ranks 2-3 and weight [..., 1]. Revision 2 (every CANN release):
# groupIndex an INT64 aclTensor in device memory, clamp -1.0 = off, ranks 1-8, weight T elements.
REVISIONS = {
    1: Revision(1, _params(HOST_INTS), Rules("ABI revision 1", 2, 3, True)),
    2: Revision(2, _params(INPUT), Rules("ABI revision 2", 1, 8, False)),
}
_CLAMP_OFF = {1: 0.0, 2: -1.0}


def _validate(arguments: Mapping[str, Any], revision: Revision, device: bool) -> Problem:
    get = arguments.get
    problem = validate(get("grad_y"), get("x"), get("weight"), get("y_origin"), get("group_index"),
                       get("clamp_limit"), rules=cast(Rules, revision.rules),
                       array_types=(DeviceArray,) if device else (np.ndarray,),
                       array_text="a DeviceArray" if device else "a numpy.ndarray", group_host=revision.abi == 1,
                       grad_x=get("grad_x"), grad_weight=get("grad_weight"), check_outputs=device)
    if not _ffi.api().libraries.is_emulator:   # (the emulator computes the clean result of these shapes)
        _releases.warn_hazards(math.prod(problem.x_shape[:-1]), problem.x_shape[-1] // 2, problem.dtype.itemsize,
                               get("group_index") is not None, _device_info.current_vector_cores(), emulator=False)
    return problem


def _scalars(problem: Problem, revision: Revision) -> Tuple[float]:
    return (_CLAMP_OFF[revision.abi] if problem.clamp_limit is None else problem.clamp_limit,)


def _guard(problem: Problem, arguments: Mapping[str, Any], revision: Revision) -> bool:
    """Refuses what the installed release is known to hang on; True when the counts are in
    device memory (they may change between calls of a plan: check them on each)."""
    group_index = arguments.get("group_index")
    if group_index is None or not _releases.guard_active():
        return False
    tokens = math.prod(problem.x_shape[:-1])
    if isinstance(group_index, DeviceArray):
        counts = group_index.to_numpy()   # (waits for its writer)
        _releases.check_group_counts(counts, tokens, cores=_device_info.current_vector_cores)
        return True
    _releases.check_group_counts(host_counts(group_index), tokens, cores=_device_info.current_vector_cores)
    return False


def _host_values(name: str, value: Union[np.ndarray, Sequence[int]]) -> np.ndarray:
    return np.array(host_counts(value), dtype=np.int64)


SWIGLU_GROUP_QUANT_GRAD = _aclnn.register(OperatorDescription(
    name="SwigluGroupQuantGrad",
    phase1="aclnnSwigluGroupQuantGradGetWorkspaceSize",
    phase2="aclnnSwigluGroupQuantGrad",
    thunk="acl_swiglu_phase1_swiglu_group_quant_grad",
    revisions=REVISIONS, revision=_loader.call_revision,
    validate=_validate, scalars=_scalars, host_values=_host_values, guard=_guard,
))
_OP = SWIGLU_GROUP_QUANT_GRAD

#: group_index of the device-level calls: host ints (revision 1) or an int64 DeviceArray (revision 2).
GroupIndex = Union[DeviceArray, np.ndarray, Sequence[int], None]


def describe_arguments(message: str) -> str:
    """'gradXOut is the grad_x argument, ...' for the operator parameters a CANN message names."""
    return _OP.describe_arguments(message)


def swiglu_group_quant_grad(grad_y: np.ndarray, x: np.ndarray, weight: Optional[np.ndarray] = None,
                            y_origin: Optional[np.ndarray] = None, group_index: Optional[np.ndarray] = None,
                            clamp_limit: Optional[float] = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """SwiGLU backward on NumPy arrays: copies to the device, runs both phases, copies back.

    grad_y [..., H], x [..., 2H] (float32, float16 or ml_dtypes.bfloat16, 1-8 dims), weight
    (float32, T = prod(leading dims) elements) with y_origin (grad_y's shape and dtype),
    group_index (int64 [G] token counts: only the first min(sum, T) rows are computed, the
    rest are zero), clamp_limit None (off) or > 0. Returns fresh arrays (grad_x like x,
    grad_weight like weight or None). Inputs are never modified.
    """
    grad_x, grad_weight = _aclnn.one_shot(_OP, {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin,
                                                "group_index": group_index, "clamp_limit": clamp_limit})
    return grad_x, grad_weight   # type: ignore[return-value]   # (grad_x is always computed)


def swiglu_group_quant_grad_device(grad_y: DeviceArray, x: DeviceArray, weight: Optional[DeviceArray] = None,
                                   y_origin: Optional[DeviceArray] = None, group_index: GroupIndex = None,
                                   clamp_limit: Optional[float] = None, *, grad_x: Optional[DeviceArray] = None,
                                   grad_weight: Optional[DeviceArray] = None,
                                   stream: Optional[Stream] = None) -> Tuple[DeviceArray, Optional[DeviceArray]]:
    """Both phases on device arrays, queued on `stream` (default stream if None); returns
    (grad_x, grad_weight), allocated when not given. Does not wait: synchronise the stream, or
    call to_numpy() on an output (which waits for it). Revision 1 takes group_index as host
    ints; revision 2 as an int64 DeviceArray."""
    return _aclnn.device_call(   # type: ignore[return-value]   # (grad_x is always computed)
        _OP, {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin, "group_index": group_index,
              "clamp_limit": clamp_limit, "grad_x": grad_x, "grad_weight": grad_weight}, stream)


def get_workspace_size(grad_y: DeviceArray, x: DeviceArray, weight: Optional[DeviceArray] = None,
                       y_origin: Optional[DeviceArray] = None, group_index: GroupIndex = None,
                       clamp_limit: Optional[float] = None, *, grad_x: DeviceArray,
                       grad_weight: Optional[DeviceArray] = None) -> Executor:
    """Phase 1 (aclnnSwigluGroupQuantGradGetWorkspaceSize) on device arrays: validates, and
    returns the Executor (``.workspace_size`` bytes of workspace needed, ``.launch()`` is phase 2).
    Revision 1 takes group_index as host ints; revision 2 as an int64 DeviceArray."""
    return _aclnn.workspace_size(_OP, {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin,
                                       "group_index": group_index, "clamp_limit": clamp_limit, "grad_x": grad_x,
                                       "grad_weight": grad_weight})


class SwigluGroupQuantGradPlan(_plan.Plan):
    """A repeatable executor for fixed shapes, dtypes and options, for hot loops.

    Built once from device arrays (their layouts are the plan's; their addresses the first
    binding). ``plan(grad_y=None, x=None, weight=None, y_origin=None, group_index=None, *,
    grad_x=None, grad_weight=None, synchronize=False)`` rebinds only the addresses that changed
    and launches phase 2 on the plan's stream, returning (grad_x, grad_weight). Calls are
    serialised, so one plan may be shared between threads.
    """

    _operator = _OP

    def __init__(self, grad_y: DeviceArray, x: DeviceArray, weight: Optional[DeviceArray] = None,
                 y_origin: Optional[DeviceArray] = None, group_index: GroupIndex = None,
                 clamp_limit: Optional[float] = None, *, grad_x: Optional[DeviceArray] = None,
                 grad_weight: Optional[DeviceArray] = None, stream: Optional[Stream] = None) -> None:
        super().__init__({"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin,
                          "group_index": group_index, "clamp_limit": clamp_limit, "grad_x": grad_x,
                          "grad_weight": grad_weight}, stream)

    @property
    def grad_x(self) -> DeviceArray:
        """The device array the plan writes grad_x into (the one given, or the one it allocated)."""
        return self._arrays["grad_x"]

    @property
    def grad_weight(self) -> Optional[DeviceArray]:
        """The device array the plan writes grad_weight into, or None when the plan has no weight."""
        return self._arrays.get("grad_weight")
