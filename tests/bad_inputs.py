"""The catalogue of invalid inputs (and of valid but unusual ones), as data.

Every entry of ``BAD_CASES`` is one call that must fail: the API it goes through, the argument
at fault, what is wrong with it, a factory that builds the call on small shapes, the exception
class it must raise and the words its message must contain (naming the argument the way the
Python API names it). ``VALID_CASES`` lists inputs that look odd but are valid: each must give
the same bits as the plain contiguous copy of its inputs.

``tests/test_bad_inputs.py`` runs both lists; ``render_markdown()`` renders them as
``docs/bad_inputs.md`` (``python tests/bad_inputs.py`` rewrites that page, and a test checks
that the page is exactly what this module renders).

Importing this module loads no native library: the factories do their work when called.
"""

from __future__ import annotations

import fractions
import math
import os
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

import acl_swiglu
from acl_swiglu import errors

BF16 = np.dtype(acl_swiglu.bfloat16)
F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)

T, H = 4, 8              # rows and hidden size of the base call
GROUPS = (3, 1)          # group_index of the base call (sum 4 = T)
CLAMP = 1.0              # clamp_limit of the base call

APIS = ("one-shot", "device", "plan-build", "plan-call", "phases", "cli")
API_TEXT = {
    "one-shot": "`swiglu_group_quant_grad(...)` on NumPy arrays",
    "device": "`swiglu_group_quant_grad_device(...)` on `DeviceArray`s, plus the device arrays themselves "
              "(`DeviceArray.empty`, `DeviceArray.wrap`, `to_device`)",
    "plan-build": "`SwigluGroupQuantGradPlan(...)`",
    "plan-call": "`plan(...)`: calling a built plan (rebinding arrays)",
    "phases": "`get_workspace_size(...)` (phase 1) and `Executor.launch(...)` / `make_repeatable()`",
    "cli": "`acl-swiglu-sample` / `python -m acl_swiglu`",
}
ARRAY_APIS = ("one-shot", "device", "plan-build", "phases")   # take the operator's arguments
DEVICE_APIS = ("device", "plan-build", "phases")              # take DeviceArrays and outputs

# ---------------------------------------------------------------------------------------------
# what a factory builds


@dataclass
class Call:
    """One prepared call. ``run()`` makes it (and disposes of anything it returns, should it not
    raise). The rest is what the test checks afterwards."""

    run: Optional[Callable[[], Any]] = None
    host: Dict[str, np.ndarray] = field(default_factory=dict)      # NumPy arrays handed over (or copied
    #                                                                 to the device): byte-identical after
    device: Dict[str, Tuple[Any, np.ndarray]] = field(default_factory=dict)   # name -> (DeviceArray input,
    #                                                                 its host source): still the same values
    device_arrays: List[Any] = field(default_factory=list)         # every DeviceArray handed to the API
    other: Dict[str, Any] = field(default_factory=dict)            # other mutable arguments (lists): equal after
    argv: Optional[List[str]] = None                               # cli: the command line
    subprocess: bool = False                                       # cli: run `python -m acl_swiglu`


@dataclass(frozen=True)
class BadCase:
    id: str
    api: str
    argument: str
    bad_input: str
    rule: str
    factory: Callable[[ExitStack], Call]
    exception: type                     # SystemExit for the CLI (exit_status says which)
    fragments: Tuple[str, ...]          # each must appear in the message (identifiers as whole words)
    abi: int = 2
    exit_status: Optional[int] = None   # cli only
    slug: str = ""                      # the rule's id, shared by the APIs it is generated for

    @property
    def side(self) -> str:
        """Where the input is rejected: by the Python layer (before anything is allocated) or
        by the library (a status code)."""
        if self.api == "cli":
            return "library" if self.exit_status == 3 else "argparse"
        if issubclass(self.exception, MemoryError):
            return "host allocator"
        return "library" if issubclass(self.exception, errors.AclError) else "Python"

    @property
    def status(self) -> Optional[str]:
        if isinstance(self.exception, type) and issubclass(self.exception, errors.AclError):
            return f"{self.exception.name} ({self.exception.code})"
        return None


@dataclass(frozen=True)
class ValidCase:
    id: str
    api: str
    argument: str
    description: str
    make: Callable[[], Dict[str, Any]]                   # the call's arguments, in host form
    device: Optional[Callable[[ExitStack, str, Any], Any]] = None   # custom host -> DeviceArray
    slug: str = ""


# ---------------------------------------------------------------------------------------------
# inputs


class Other:
    """The array in the container the API does NOT take: a DeviceArray for the one-shot API,
    the NumPy array itself for the device-level APIs."""

    def __init__(self, array: np.ndarray):
        self.array = array


class Closed:
    """A DeviceArray made from the array and closed before the call."""

    def __init__(self, array: np.ndarray):
        self.array = array


def _rng(seed=7):
    return np.random.default_rng(seed)


def base_args(dtype=F32, lead=(T,), h=H, weight=True, group=True, clamp=True) -> Dict[str, Any]:
    """A valid call: every bad case changes one thing of it."""
    rng = _rng()
    args: Dict[str, Any] = {
        "grad_y": rng.uniform(-1, 1, lead + (h,)).astype(dtype),
        "x": rng.uniform(-3, 3, lead + (2 * h,)).astype(dtype),
    }
    if weight:
        args["weight"] = rng.uniform(0.5, 1.5, lead + (1,)).astype(np.float32)
        args["y_origin"] = rng.uniform(-1, 1, lead + (h,)).astype(dtype)
    if group:
        args["group_index"] = np.array(GROUPS, np.int64)
    if clamp:
        args["clamp_limit"] = CLAMP
    return args


def _with(base=None, drop=(), **changes):
    """A maker: base_args() (or `base()`), without `drop`, with `changes` (a value, or a
    function of the base arguments)."""
    def make():
        args = (base or base_args)()
        original = dict(args)
        for name in drop:
            args.pop(name, None)
        for name, value in changes.items():
            args[name] = value(original) if callable(value) and not isinstance(value, type) else value
        return args
    return make


def _astype(name, dtype):
    return lambda a: a[name].astype(dtype)


def _arrays_in(args) -> Dict[str, np.ndarray]:
    out = {}
    for name, value in args.items():
        if isinstance(value, (Other, Closed)):
            value = value.array
        if isinstance(value, np.ndarray):
            out[name] = value
    return out


def _lists_in(args) -> Dict[str, Any]:
    return {name: list(value) for name, value in args.items() if isinstance(value, list)}


# ---------------------------------------------------------------------------------------------
# running a call through each API


def _dispose(result) -> str:
    """Releases whatever a call that should have failed returned."""
    if isinstance(result, (acl_swiglu.SwigluGroupQuantGradPlan, acl_swiglu.Executor)):
        result.close()
    elif isinstance(result, tuple):
        if any(isinstance(r, acl_swiglu.DeviceArray) for r in result):
            acl_swiglu.synchronize_device()
        for r in result:
            if isinstance(r, acl_swiglu.DeviceArray):
                r.close()
    return "returned without raising"


def _to_device(stack: ExitStack, call: Call, name: str, value, abi: int):
    if isinstance(value, Closed):
        array = acl_swiglu.to_device(value.array)
        array.close()
        call.device_arrays.append(array)
        return array
    if isinstance(value, Other):
        return value.array
    if name == "group_index" and abi == 1:
        return value          # revision 1: host values
    if isinstance(value, np.ndarray):
        array = stack.enter_context(acl_swiglu.to_device(value))
        call.device[name] = (array, value)
        call.device_arrays.append(array)
        return array
    if isinstance(value, acl_swiglu.DeviceArray):
        call.device_arrays.append(value)
    return value


def _like(value, shape, dtype):
    """Shape and dtype of an output for `value` (the input it mirrors) when that is a sensible
    array, else the base call's."""
    if isinstance(value, np.ndarray) and value.dtype in (F32, F16, BF16) and value.ndim >= 1:
        return value.shape, value.dtype.newbyteorder("=")
    return shape, dtype


def _api_call(api: str, make: Callable[[], Dict[str, Any]], abi: int = 2,
              tweak: Optional[Callable[[ExitStack, Call, Dict[str, Any]], None]] = None):
    """A factory: the arguments from `make()` through `api` (`tweak` may replace device arguments)."""
    def factory(stack: ExitStack) -> Call:
        args = make()
        call = Call(host=_arrays_in(args), other=_lists_in(args))
        if api == "one-shot":
            kwargs = {}
            for name, value in args.items():
                if isinstance(value, Other):
                    value = stack.enter_context(acl_swiglu.to_device(value.array))
                kwargs[name] = value
            call.run = lambda: _dispose(acl_swiglu.swiglu_group_quant_grad(**kwargs))
            return call
        kwargs = {name: _to_device(stack, call, name, value, abi) for name, value in args.items()}
        if api == "phases":
            if "grad_x" not in kwargs:
                shape, dtype = _like(args.get("x"), (T, 2 * H), F32)
                kwargs["grad_x"] = stack.enter_context(acl_swiglu.DeviceArray.empty(shape, dtype))
                call.device_arrays.append(kwargs["grad_x"])
            if "grad_weight" not in kwargs and args.get("weight") is not None:
                shape, _ = _like(args.get("weight"), (T, 1), F32)
                kwargs["grad_weight"] = stack.enter_context(acl_swiglu.DeviceArray.empty(shape, F32))
                call.device_arrays.append(kwargs["grad_weight"])
        if tweak is not None:
            tweak(stack, call, kwargs)
        fn = {"device": acl_swiglu.swiglu_group_quant_grad_device,
              "plan-build": acl_swiglu.SwigluGroupQuantGradPlan,
              "phases": acl_swiglu.get_workspace_size}[api]
        call.run = lambda: _dispose(fn(**kwargs))
        return call
    return factory


# ---------------------------------------------------------------------------------------------
# rules of the operator's arguments, generated for every API that takes them

A = acl_swiglu.ArgumentError
TE = TypeError
CLOSED = acl_swiglu.HandleClosedError


@dataclass(frozen=True)
class Rule:
    slug: str
    argument: str
    bad_input: str
    rule: str
    make: Callable[[], Dict[str, Any]]
    exception: type
    fragments: Tuple[str, ...]
    apis: Tuple[str, ...] = ARRAY_APIS
    abi: int = 2


def _r(slug, argument, bad_input, rule, make, exception, fragments=None, apis=ARRAY_APIS, abi=2):
    return Rule(slug, argument, bad_input, rule, make, exception, tuple(fragments or (argument,)), apis, abi)


def _no_weight(**kw):
    return lambda: base_args(weight=False, **kw)


def _shapes(lead, h, weight=False, gy_lead=None, x_h=None):
    """grad_y [gy_lead..., h], x [lead..., 2*x_h] and matching y_origin/weight when asked."""
    def make():
        rng = _rng(3)
        args = base_args(weight=False)
        args["grad_y"] = rng.uniform(-1, 1, (gy_lead if gy_lead is not None else lead) + (h,)).astype(np.float32)
        args["x"] = rng.uniform(-1, 1, lead + (2 * (x_h if x_h is not None else h),)).astype(np.float32)
        if weight:
            args["y_origin"] = rng.uniform(-1, 1, lead + (h,)).astype(np.float32)
            args["weight"] = np.ones(lead + (1,), np.float32)
        return args
    return make


DTYPE_RULE = "grad_y's dtype must be float32, float16 or bfloat16"
SAME_DTYPE = "x and y_origin must have grad_y's dtype"
WEIGHT_DTYPE = "weight must be float32"
GROUP_DTYPE = "group_index must be int64"
ARRAY_TYPE = "must be a numpy.ndarray (one-shot) / DeviceArray (device-level APIs)"
CLAMP_RULE = "clamp_limit must be None (off) or a finite number > 0 that stays > 0 and finite in float32"

RULES: List[Rule] = [
    # -- wrong dtypes
    _r("grad_y-int32", "grad_y", "int32 array", DTYPE_RULE, _with(grad_y=_astype("grad_y", np.int32)), A),
    _r("grad_y-int64", "grad_y", "int64 array", DTYPE_RULE, _with(grad_y=_astype("grad_y", np.int64)), A),
    _r("grad_y-float64", "grad_y", "float64 array", DTYPE_RULE, _with(grad_y=_astype("grad_y", np.float64)), A),
    _r("grad_y-bool", "grad_y", "bool array", DTYPE_RULE, _with(grad_y=lambda a: a["grad_y"] > 0), A),
    _r("grad_y-complex64", "grad_y", "complex64 array", DTYPE_RULE,
       _with(grad_y=_astype("grad_y", np.complex64)), A),
    _r("grad_y-object", "grad_y", "object array", DTYPE_RULE, _with(grad_y=_astype("grad_y", object)), A,
       apis=("one-shot",)),
    _r("grad_y-unicode", "grad_y", "array of str (`<U3`)", DTYPE_RULE,
       _with(grad_y=lambda a: np.full(a["grad_y"].shape, "abc")), A, apis=("one-shot",)),
    _r("grad_y-fp16-x-fp32", "x", "x float32 while grad_y and y_origin are float16", SAME_DTYPE,
       _with(grad_y=_astype("grad_y", np.float16), y_origin=_astype("y_origin", np.float16)), A),
    _r("x-float16", "x", "float16 array (grad_y float32)", SAME_DTYPE, _with(x=_astype("x", np.float16)), A),
    _r("x-bfloat16", "x", "bfloat16 array (grad_y float32)", SAME_DTYPE, _with(x=_astype("x", BF16)), A),
    _r("x-float64", "x", "float64 array", SAME_DTYPE, _with(x=_astype("x", np.float64)), A),
    _r("x-int32", "x", "int32 array", SAME_DTYPE, _with(x=_astype("x", np.int32)), A),
    _r("y_origin-float16", "y_origin", "float16 array (grad_y float32)", SAME_DTYPE,
       _with(y_origin=_astype("y_origin", np.float16)), A),
    _r("y_origin-bfloat16", "y_origin", "bfloat16 array (grad_y float32)", SAME_DTYPE,
       _with(y_origin=_astype("y_origin", BF16)), A),
    _r("y_origin-float64", "y_origin", "float64 array", SAME_DTYPE, _with(y_origin=_astype("y_origin", np.float64)), A),
    _r("weight-float16", "weight", "float16 array", WEIGHT_DTYPE, _with(weight=_astype("weight", np.float16)), A),
    _r("weight-float64", "weight", "float64 array", WEIGHT_DTYPE, _with(weight=_astype("weight", np.float64)), A),
    _r("weight-bfloat16", "weight", "bfloat16 array", WEIGHT_DTYPE, _with(weight=_astype("weight", BF16)), A),
    _r("weight-int32", "weight", "int32 array", WEIGHT_DTYPE, _with(weight=_astype("weight", np.int32)), A),
    _r("group_index-int32", "group_index", "int32 array", GROUP_DTYPE,
       _with(group_index=_astype("group_index", np.int32)), A),
    _r("group_index-uint64", "group_index", "uint64 array", GROUP_DTYPE,
       _with(group_index=_astype("group_index", np.uint64)), A),
    _r("group_index-float64", "group_index", "float64 array", GROUP_DTYPE,
       _with(group_index=_astype("group_index", np.float64)), A),
    _r("group_index-bool", "group_index", "bool array", GROUP_DTYPE,
       _with(group_index=lambda a: a["group_index"] > 0), A),
    # -- not arrays
    _r("grad_y-list", "grad_y", "nested list of floats", ARRAY_TYPE, _with(grad_y=lambda a: a["grad_y"].tolist()), TE),
    _r("grad_y-float", "grad_y", "Python float `1.0`", ARRAY_TYPE, _with(grad_y=1.0), TE),
    _r("grad_y-numpy-scalar", "grad_y", "`numpy.float32(1)` (a scalar, not an array)", ARRAY_TYPE,
       _with(grad_y=np.float32(1)), TE),
    _r("grad_y-None", "grad_y", "`None` (required)", ARRAY_TYPE, _with(grad_y=None), TE),
    _r("grad_y-str", "grad_y", "a str", ARRAY_TYPE, _with(grad_y="grad_y"), TE),
    _r("grad_y-memoryview", "grad_y", "memoryview of a float32 array", ARRAY_TYPE,
       _with(grad_y=lambda a: memoryview(a["grad_y"])), TE),
    _r("grad_y-other-container", "grad_y", "DeviceArray to the one-shot API / NumPy array to a device-level API",
       ARRAY_TYPE, _with(grad_y=lambda a: Other(a["grad_y"])), TE),
    _r("x-list", "x", "nested list", ARRAY_TYPE, _with(x=lambda a: a["x"].tolist()), TE),
    _r("x-int", "x", "Python int `3`", ARRAY_TYPE, _with(x=3), TE),
    _r("x-None", "x", "`None` (required)", ARRAY_TYPE, _with(x=None), TE),
    _r("x-other-container", "x", "DeviceArray to the one-shot API / NumPy array to a device-level API", ARRAY_TYPE,
       _with(x=lambda a: Other(a["x"])), TE),
    _r("weight-list", "weight", "list `[[0.5]] * T`", ARRAY_TYPE + " or None", _with(weight=lambda a: [[0.5]] * T), TE),
    _r("weight-float", "weight", "Python float `0.5`", ARRAY_TYPE + " or None", _with(weight=0.5), TE),
    _r("weight-other-container", "weight", "DeviceArray to the one-shot API / NumPy array to a device-level API",
       ARRAY_TYPE + " or None", _with(weight=lambda a: Other(a["weight"])), TE),
    _r("y_origin-list", "y_origin", "nested list", ARRAY_TYPE + " or None",
       _with(y_origin=lambda a: a["y_origin"].tolist()), TE),
    _r("y_origin-float", "y_origin", "Python float `0.5`", ARRAY_TYPE + " or None", _with(y_origin=0.5), TE),
    _r("y_origin-other-container", "y_origin", "DeviceArray to the one-shot API / NumPy array to a device-level API",
       ARRAY_TYPE + " or None", _with(y_origin=lambda a: Other(a["y_origin"])), TE),
    _r("group_index-list", "group_index", "list `[3, 1]`", ARRAY_TYPE + " (int64, 1-D) or None",
       _with(group_index=lambda a: list(GROUPS)), TE),
    _r("group_index-tuple", "group_index", "tuple `(3, 1)`", ARRAY_TYPE + " (int64, 1-D) or None",
       _with(group_index=GROUPS), TE),
    _r("group_index-int", "group_index", "Python int `4`", ARRAY_TYPE + " (int64, 1-D) or None",
       _with(group_index=4), TE),
    _r("group_index-other-container", "group_index",
       "DeviceArray to the one-shot API / NumPy array to a device-level API", ARRAY_TYPE + " (int64, 1-D) or None",
       _with(group_index=lambda a: Other(a["group_index"])), TE),
    # -- ranks and shapes
    _r("grad_y-0d", "grad_y", "0-d grad_y and x (no weight)", "grad_y must be [..., H] with 1 to 8 dims",
       _with(_no_weight(), grad_y=np.array(1.0, np.float32), x=np.array(1.0, np.float32)), A),
    _r("grad_y-9d", "grad_y", "9-d grad_y [1]*8+[H] and x [1]*8+[2H]", "grad_y must have 1 to 8 dims",
       _shapes((1,) * 8, H), A),
    _r("x-0d", "x", "0-d x (grad_y 2-D)", "x must have grad_y's rank", _with(x=np.array(1.0, np.float32)), A),
    _r("x-9d", "x", "9-d x (grad_y 2-D)", "x must have grad_y's rank",
       _with(x=lambda a: a["x"].reshape((1,) * 7 + (T, 2 * H))), A),
    _r("x-rank-mismatch", "x", "x [1, T, 2H] with grad_y [T, H]", "x must have grad_y's rank",
       _with(x=lambda a: a["x"][None]), A),
    _r("x-leading-dims", "x", "x [T+1, 2H] with grad_y [T, H]", "x must have grad_y's leading dims",
       _with(x=lambda a: np.zeros((T + 1, 2 * H), np.float32)), A),
    _r("x-leading-dims-3d", "x", "x [2, 2, 2H] with grad_y [1, 4, H]", "x must have grad_y's leading dims",
       _shapes((2, 2), H, gy_lead=(1, 4)), A),
    _r("x-odd-last-dim", "x", "x [T, 2H+1]", "x's last dim must be even (2H)",
       _with(x=lambda a: np.zeros((T, 2 * H + 1), np.float32)), A),
    _r("grad_y-last-not-half", "grad_y", "grad_y [T, H+1] with x [T, 2H]", "grad_y's last dim must be half of x's",
       _shapes((T,), H + 1, x_h=H), A, ("grad_y", "x")),
    _r("x-last-not-double", "x", "x [T, 2H+2] with grad_y [T, H]", "grad_y's last dim must be half of x's",
       _with(x=lambda a: np.zeros((T, 2 * H + 2), np.float32)), A, ("grad_y", "x")),
    _r("y_origin-shape", "y_origin", "y_origin [T, H-1]", "y_origin must have grad_y's shape",
       _with(y_origin=lambda a: a["y_origin"][:, :-1].copy()), A),
    _r("y_origin-transposed", "y_origin", "y_origin [H, T]", "y_origin must have grad_y's shape",
       _with(y_origin=lambda a: np.ascontiguousarray(a["y_origin"].T)), A),
    _r("y_origin-0d", "y_origin", "0-d y_origin", "y_origin must have grad_y's shape",
       _with(y_origin=np.array(0.5, np.float32)), A),
    _r("y_origin-9d", "y_origin", "9-d y_origin [1]*7+[T, H]", "y_origin must have grad_y's shape",
       _with(y_origin=lambda a: a["y_origin"].reshape((1,) * 7 + (T, H))), A),
    _r("weight-count-more", "weight", "weight [T+1, 1]", "weight must hold T elements in 1 to 8 dims",
       _with(weight=np.ones((T + 1, 1), np.float32)), A),
    _r("weight-count-less", "weight", "weight [T-1]", "weight must hold T elements in 1 to 8 dims",
       _with(weight=np.ones((T - 1,), np.float32)), A),
    _r("weight-empty", "weight", "weight [0]", "weight must hold T elements in 1 to 8 dims",
       _with(weight=np.ones((0,), np.float32)), A),
    _r("weight-0d", "weight", "0-d weight", "weight must hold T elements in 1 to 8 dims",
       _with(weight=np.array(0.5, np.float32)), A),
    _r("weight-9d", "weight", "9-d weight [T]+[1]*8 (T elements)", "weight must hold T elements in 1 to 8 dims",
       _with(weight=np.ones((T,) + (1,) * 8, np.float32)), A),
    _r("weight-without-y_origin", "weight", "weight given, y_origin omitted", "weight needs y_origin",
       _with(drop=("y_origin",)), A, ("weight", "y_origin")),
    _r("y_origin-without-weight", "y_origin", "y_origin given, weight omitted", "y_origin is only used with weight",
       _with(drop=("weight",)), A),
    _r("group_index-0d", "group_index", "0-d int64 array", "group_index must be 1-D [G]",
       _with(group_index=np.array(4, np.int64)), A),
    _r("group_index-2d", "group_index", "int64 [1, 2]", "group_index must be 1-D [G]",
       _with(group_index=np.array([GROUPS], np.int64)), A),
    _r("group_index-9d", "group_index", "int64 [1]*8+[2]", "group_index must be 1-D [G]",
       _with(group_index=np.array(GROUPS, np.int64).reshape((1,) * 8 + (2,))), A),
    # -- clamp_limit
    _r("clamp-0", "clamp_limit", "`0`", CLAMP_RULE, _with(clamp_limit=0), A),
    _r("clamp-0.0", "clamp_limit", "`0.0`", CLAMP_RULE, _with(clamp_limit=0.0), A),
    _r("clamp--0.0", "clamp_limit", "`-0.0`", CLAMP_RULE, _with(clamp_limit=-0.0), A),
    _r("clamp--1", "clamp_limit", "`-1.0` (the C API's own 'off' value)", CLAMP_RULE, _with(clamp_limit=-1.0), A),
    _r("clamp--0.5", "clamp_limit", "`-0.5`", CLAMP_RULE, _with(clamp_limit=-0.5), A),
    _r("clamp-nan", "clamp_limit", "`math.nan`", CLAMP_RULE, _with(clamp_limit=math.nan), A),
    _r("clamp-float32-nan", "clamp_limit", "`numpy.float32('nan')`", CLAMP_RULE,
       _with(clamp_limit=np.float32("nan")), A),
    _r("clamp-inf", "clamp_limit", "`math.inf`", CLAMP_RULE, _with(clamp_limit=math.inf), A),
    _r("clamp--inf", "clamp_limit", "`-math.inf`", CLAMP_RULE, _with(clamp_limit=-math.inf), A),
    _r("clamp-1e-50", "clamp_limit", "`1e-50` (0 in float32)", CLAMP_RULE, _with(clamp_limit=1e-50), A),
    _r("clamp-1e39", "clamp_limit", "`1e39` (inf in float32)", CLAMP_RULE, _with(clamp_limit=1e39), A),
    _r("clamp-10**400", "clamp_limit", "`10**400` (an int beyond float)", CLAMP_RULE, _with(clamp_limit=10 ** 400), A),
    _r("clamp-True", "clamp_limit", "`True`", CLAMP_RULE, _with(clamp_limit=True), TE),
    _r("clamp-str", "clamp_limit", "`'1.0'`", CLAMP_RULE, _with(clamp_limit="1.0"), TE),
    _r("clamp-0d-array", "clamp_limit", "`numpy.array(1.0)`", CLAMP_RULE, _with(clamp_limit=lambda a: np.array(1.0)),
       TE),
    _r("clamp-complex", "clamp_limit", "`1+0j`", CLAMP_RULE, _with(clamp_limit=1 + 0j), TE),
    _r("clamp-Decimal", "clamp_limit", "`Decimal('1.0')`", CLAMP_RULE, _with(clamp_limit=Decimal("1.0")), TE),
    _r("clamp-list", "clamp_limit", "`[1.0]`", CLAMP_RULE, _with(clamp_limit=lambda a: [1.0]), TE),
    # -- closed device arrays (use after close)
] + [
    _r(f"closed-{name}", name, "a DeviceArray closed before the call", "a closed DeviceArray cannot be used",
       _with(**{name: (lambda a, name=name: Closed(a[name]))}), CLOSED, apis=DEVICE_APIS)
    for name in ("grad_y", "x", "weight", "y_origin", "group_index")
] + [
    _r("closed-grad_x", "grad_x", "a DeviceArray closed before the call", "a closed DeviceArray cannot be used",
       _with(grad_x=lambda a: Closed(np.zeros((T, 2 * H), np.float32))), CLOSED, apis=DEVICE_APIS),
    _r("closed-grad_weight", "grad_weight", "a DeviceArray closed before the call",
       "a closed DeviceArray cannot be used",
       _with(grad_weight=lambda a: Closed(np.zeros((T, 1), np.float32))), CLOSED, apis=DEVICE_APIS),
    # -- outputs of the wrong shape, dtype or kind
    _r("grad_x-shape", "grad_x", "grad_x [T, H]", "grad_x must have x's shape and dtype",
       _with(grad_x=lambda a: np.zeros((T, H), np.float32)), A, apis=DEVICE_APIS),
    _r("grad_x-rank", "grad_x", "grad_x [T, 2H, 1]", "grad_x must have x's shape and dtype",
       _with(grad_x=lambda a: np.zeros((T, 2 * H, 1), np.float32)), A, apis=DEVICE_APIS),
    _r("grad_x-dtype", "grad_x", "float16 grad_x for float32 x", "grad_x must have x's shape and dtype",
       _with(grad_x=lambda a: np.zeros((T, 2 * H), np.float16)), A, apis=DEVICE_APIS),
    _r("grad_x-numpy", "grad_x", "a NumPy array", "grad_x must be a DeviceArray or None",
       _with(grad_x=lambda a: Other(np.zeros((T, 2 * H), np.float32))), TE, apis=DEVICE_APIS),
    _r("grad_x-list", "grad_x", "a list", "grad_x must be a DeviceArray or None",
       _with(grad_x=lambda a: [0.0] * (T * 2 * H)), TE, apis=DEVICE_APIS),
    _r("grad_weight-shape", "grad_weight", "grad_weight [T+1, 1]", "grad_weight must have weight's shape, float32",
       _with(grad_weight=lambda a: np.zeros((T + 1, 1), np.float32)), A, apis=DEVICE_APIS),
    _r("grad_weight-dtype", "grad_weight", "float64 grad_weight", "grad_weight must have weight's shape, float32",
       _with(grad_weight=lambda a: np.zeros((T, 1), np.float64)), A, apis=DEVICE_APIS),
    _r("grad_weight-numpy", "grad_weight", "a NumPy array", "grad_weight must be a DeviceArray or None",
       _with(grad_weight=lambda a: Other(np.zeros((T, 1), np.float32))), TE, apis=DEVICE_APIS),
    _r("grad_weight-without-weight", "grad_weight", "grad_weight given, weight and y_origin omitted",
       "grad_weight only exists with weight",
       _with(drop=("weight", "y_origin"), grad_weight=lambda a: np.zeros((T, 1), np.float32)), A, apis=DEVICE_APIS),
    # -- ABI revision 1 (ACL_SWIGLU_ABI=1): ranks 2-3, weight [leading dims, 1], group_index host ints
    _r("rev1-grad_y-1d", "grad_y", "1-D grad_y [H], x [2H]", "revision 1: grad_y must have 2 or 3 dims",
       _shapes((), H), A, apis=("one-shot", "device"), abi=1),
    _r("rev1-grad_y-4d", "grad_y", "4-D grad_y [1, 1, T, H]", "revision 1: grad_y must have 2 or 3 dims",
       _shapes((1, 1, T), H), A, apis=("one-shot", "device"), abi=1),
    _r("rev1-weight-flat", "weight", "weight [T]", "revision 1: weight must be grad_y's leading dims + [1]",
       _with(weight=np.ones((T,), np.float32)), A, apis=("one-shot", "device"), abi=1),
    _r("rev1-weight-1xT", "weight", "weight [1, T]", "revision 1: weight must be grad_y's leading dims + [1]",
       _with(weight=np.ones((1, T), np.float32)), A, apis=("one-shot", "device"), abi=1),
    _r("rev1-group_index-float", "group_index", "float64 values `[3.0, 1.0]`", "group_index must hold integers",
       _with(group_index=np.array(GROUPS, np.float64)), A, apis=("one-shot", "device"), abi=1),
    _r("rev1-group_index-2d", "group_index", "values of shape [1, 2]", "group_index must be 1-D",
       _with(group_index=np.array([GROUPS], np.int64)), A, apis=("one-shot", "device"), abi=1),
    _r("rev1-clamp-0", "clamp_limit", "`0.0` (revision 1's C 'off' value)", CLAMP_RULE, _with(clamp_limit=0.0), A,
       apis=("one-shot", "device"), abi=1),
]


def _rule_cases() -> List[BadCase]:
    cases = []
    for rule in RULES:
        for api in rule.apis:
            cases.append(BadCase(f"{api}-{rule.slug}", api, rule.argument, rule.bad_input, rule.rule,
                                 _api_call(api, rule.make, rule.abi), rule.exception, rule.fragments, rule.abi,
                                 slug=rule.slug))
    return cases


# ---------------------------------------------------------------------------------------------
# memory: what only the library can see, and sizes that cannot be allocated

HUGE_X = (2 ** 20, 2 ** 20, 64)          # 2**46 float32 elements: 256 TiB, beyond any address space
HUGE_DEVICE_X = (2 ** 20, 2 ** 12, 16)   # 2**36 float32 elements: 256 GiB on the device
HUGE_EMPTY_BYTES = 2 ** 40               # DeviceArray.empty: 1 TiB


def _huge_broadcast_args(x_shape):
    def make():
        lead, two_h = x_shape[:-1], x_shape[-1]
        return {"grad_y": np.broadcast_to(np.float32(0.5), lead + (two_h // 2,)),
                "x": np.broadcast_to(np.float32(0.25), x_shape)}
    return make


def _device_empty(shape, dtype):
    def factory(stack: ExitStack) -> Call:
        return Call(run=lambda: _dispose((acl_swiglu.DeviceArray.empty(shape, dtype),)))
    return factory


def _device_wrap(ptr_of, shape, dtype=F32, strides=None, offset=0, nbytes=None):
    """DeviceArray.wrap of a live 64-byte allocation (or of the address `ptr_of` gives)."""
    def factory(stack: ExitStack) -> Call:
        buffer = stack.enter_context(acl_swiglu.DeviceBuffer(64))
        ptr = ptr_of(buffer)
        return Call(run=lambda: _dispose((acl_swiglu.DeviceArray.wrap(ptr, shape, dtype, strides, offset, nbytes),)))
    return factory


def _to_device_of(value):
    def factory(stack: ExitStack) -> Call:
        call = Call(other=_lists_in({"array": value}))
        call.run = lambda: _dispose((acl_swiglu.to_device(value),))
        return call
    return factory


def _wrap(stack: ExitStack, call: Call, ptr: int, shape, dtype, strides=None):
    array = stack.enter_context(acl_swiglu.DeviceArray.wrap(ptr, shape, dtype, strides))
    call.device_arrays.append(array)
    return array


def _grad_x_on_x(stack, call, kw):
    kw["grad_x"] = _wrap(stack, call, kw["x"].ptr, (T, 2 * H), F32)


def _grad_x_zero_strides(stack, call, kw):
    base = stack.enter_context(acl_swiglu.DeviceArray.empty((2 * H,), F32))
    kw["grad_x"] = _wrap(stack, call, base.ptr, (T, 2 * H), F32, strides=(0, 1))


def _grad_x_on_host(stack, call, kw):
    host = np.zeros((T, 2 * H), np.float32)
    call.host["grad_x (host memory)"] = host
    kw["grad_x"] = _wrap(stack, call, host.ctypes.data, (T, 2 * H), F32)


def _grad_weight_on_grad_x(stack, call, kw):
    grad_x = stack.enter_context(acl_swiglu.DeviceArray.empty((T, 2 * H), F32))
    call.device_arrays.append(grad_x)
    kw["grad_x"] = grad_x
    kw["grad_weight"] = _wrap(stack, call, grad_x.ptr, (T, 1), F32)


def _grad_y_past_allocation(stack, call, kw):
    small = stack.enter_context(acl_swiglu.DeviceArray.empty((1, H), F32))
    kw["grad_y"] = _wrap(stack, call, small.ptr, (T, H), F32)


def _x_on_host(stack, call, kw):
    host = np.ascontiguousarray(call.host["x"])
    call.host["x (host memory)"] = host
    kw["x"] = _wrap(stack, call, host.ctypes.data, (T, 2 * H), F32)


def _memory_cases() -> List[BadCase]:
    P = errors.AclnnErrParamInvalid
    alloc = errors.AclErrorRtMemoryAllocation
    huge_device_bytes = str(int(np.prod(HUGE_DEVICE_X)) * 4)
    cases = [
        BadCase("one-shot-huge-broadcast", "one-shot", "grad_x",
                f"broadcast (zero-stride) grad_y/x of shape {list(HUGE_X)}: tiny device span, 256 TiB outputs",
                "an output that cannot be allocated fails cleanly, naming what could not be allocated",
                _api_call("one-shot", _huge_broadcast_args(HUGE_X)), MemoryError, ("grad_x",),
                slug="huge-broadcast"),
        BadCase("device-empty-huge", "device", "shape", f"`DeviceArray.empty(({HUGE_EMPTY_BYTES // 4},), float32)` "
                "(1 TiB, beyond the emulated device memory)",
                "an allocation beyond the device memory fails with the ACL status, naming the sizes",
                _device_empty((HUGE_EMPTY_BYTES // 4,), F32), alloc, (str(HUGE_EMPTY_BYTES), "aclrtMalloc"),
                slug="empty-huge"),
        BadCase("device-empty-overflow", "device", "shape", "`DeviceArray.empty((2**62, 4), float32)` "
                "(2**66 bytes: overflows int64)", "a shape whose byte size is not representable is rejected",
                _device_empty((2 ** 62, 4), F32), A, ("shape",), slug="empty-overflow"),
        BadCase("device-empty-negative", "device", "shape", "`DeviceArray.empty((-1, 4), float32)`",
                "dims must be >= 0", _device_empty((-1, 4), F32), A, ("shape",), slug="empty-negative"),
        BadCase("device-empty-two-negative", "device", "shape", "`DeviceArray.empty((-2, -4), float32)` "
                "(positive product)", "dims must be >= 0", _device_empty((-2, -4), F32), A, ("shape",),
                slug="empty-two-negative"),
        BadCase("device-empty-float-dim", "device", "shape", "`DeviceArray.empty((2.5, 4), float32)`",
                "dims must be integers (as in `numpy.empty`)", _device_empty((2.5, 4), F32), TE, ("shape",),
                slug="empty-float-dim"),
        BadCase("device-wrap-negative-dim", "device", "shape", "`DeviceArray.wrap(ptr, (-1, 4), float32)`",
                "dims must be >= 0", _device_wrap(lambda b: b.ptr, (-1, 4)), A, ("shape",),
                slug="wrap-negative-dim"),
        BadCase("device-wrap-negative-stride", "device", "strides", "`DeviceArray.wrap(ptr, (2, 4), float32, "
                "strides=(4, -1))`", "strides must be >= 0, one per dim",
                _device_wrap(lambda b: b.ptr, (2, 4), strides=(4, -1)), A, ("strides",), slug="wrap-negative-stride"),
        BadCase("device-wrap-strides-rank", "device", "strides", "`DeviceArray.wrap(ptr, (2, 4), float32, "
                "strides=(4,))`", "strides must be >= 0, one per dim",
                _device_wrap(lambda b: b.ptr, (2, 4), strides=(4,)), A, ("strides",), slug="wrap-strides-rank"),
        BadCase("device-wrap-negative-offset", "device", "offset", "`DeviceArray.wrap(ptr, (2, 4), float32, "
                "offset=-1)`", "offset must be >= 0", _device_wrap(lambda b: b.ptr, (2, 4), offset=-1), A,
                ("offset",), slug="wrap-negative-offset"),
        BadCase("device-wrap-nbytes-short", "device", "nbytes", "`DeviceArray.wrap(ptr, (4, 4), float32, "
                "nbytes=32)` (the view needs 64)", "nbytes must cover the view",
                _device_wrap(lambda b: b.ptr, (4, 4), nbytes=32), A, ("nbytes",), slug="wrap-nbytes-short"),
        BadCase("device-wrap-null", "device", "ptr", "`DeviceArray.wrap(0, (2, 4), float32)`",
                "ptr must be a non-zero device address", _device_wrap(lambda b: 0, (2, 4)), A, ("ptr",),
                slug="wrap-null"),
        BadCase("device-to_device-list", "device", "array", "`to_device([1.0, 2.0])`",
                "to_device copies a numpy.ndarray", _to_device_of([1.0, 2.0]), TE, ("to_device",),
                slug="to_device-list"),
    ]
    for api in ("device", "plan-build"):
        cases.append(BadCase(
            f"{api}-huge-broadcast", api, "grad_x",
            f"zero-stride device views grad_y/x of shape {list(HUGE_DEVICE_X)}; grad_x (256 GiB) left to the API",
            "an output beyond the device memory fails with the ACL status, naming the sizes, leaving nothing "
            "allocated", _api_call(api, _huge_broadcast_args(HUGE_DEVICE_X)), alloc,
            (huge_device_bytes, "aclrtMalloc"),
            slug="huge-broadcast"))
    library = [
        ("grad_x-aliases-x", "grad_x", "grad_x a view of x's device memory", "the operator does not work in "
         "place: an output must not overlap an input", _grad_x_on_x, DEVICE_APIS),
        ("grad_x-zero-strides", "grad_x", "grad_x [T, 2H] with strides (0, 1) (like a read-only broadcast)",
         "an output's elements must not share addresses", _grad_x_zero_strides, DEVICE_APIS),
        ("grad_x-host-memory", "grad_x", "`DeviceArray.wrap` of a NumPy array's host pointer",
         "tensor data must be device memory", _grad_x_on_host, ("device",)),
        ("grad_weight-aliases-grad_x", "grad_weight", "grad_weight a view of grad_x's memory",
         "outputs must not overlap each other", _grad_weight_on_grad_x, ("device",)),
        ("grad_y-past-allocation", "grad_y", "`DeviceArray.wrap` of a 32-byte allocation as [T, H] float32",
         "a view must lie inside one live device allocation", _grad_y_past_allocation, ("device",)),
        ("x-host-memory", "x", "`DeviceArray.wrap` of a NumPy array's host pointer",
         "tensor data must be device memory", _x_on_host, ("device",)),
    ]
    for slug, argument, bad, rule, tweak, apis in library:
        for api in apis:
            make = _with(drop=("weight", "y_origin")) if argument != "grad_weight" else _with()
            cases.append(BadCase(f"{api}-{slug}", api, argument, bad, rule, _api_call(api, make, 2, tweak), P,
                                 (argument,), slug=slug))
    return cases


# ---------------------------------------------------------------------------------------------
# streams, workspaces, executors


def _with_stream(value_maker):
    def tweak(stack, call, kw):
        kw["stream"] = value_maker(stack)
    return tweak


def _closed_stream(stack):
    stream = acl_swiglu.Stream()
    stream.close()
    return stream


def _executor_call(action):
    """A factory for the phases: phase 1 on the base call, then `action(stack, executor)` is the
    call that must fail."""
    def factory(stack: ExitStack) -> Call:
        call = Call()
        args = base_args(weight=False)
        call.host = _arrays_in(args)
        kwargs = {name: _to_device(stack, call, name, value, 2) for name, value in args.items()}
        grad_x = stack.enter_context(acl_swiglu.DeviceArray.empty((T, 2 * H), F32))
        executor = stack.enter_context(acl_swiglu.get_workspace_size(**kwargs, grad_x=grad_x))
        run = action(stack, executor)

        def go():
            try:
                return _dispose((run(),))
            finally:
                acl_swiglu.synchronize_device()
        call.run = go
        return call
    return factory


def _launched(stack, executor):
    executor.launch()
    acl_swiglu.default_stream().synchronize()
    return executor


def _closed(stack, executor):
    executor.close()
    return executor


def _stream_cases() -> List[BadCase]:
    cases = []
    stream_values = [
        ("closed", "a Stream closed before the call", _closed_stream, CLOSED),
        ("int", "the int `0` (not a Stream)", lambda stack: 0, TE),
        ("str", "the str `'default'`", lambda stack: "default", TE),
    ]
    for slug, bad, maker, exc in stream_values:
        for api in ("device", "plan-build"):
            cases.append(BadCase(f"{api}-stream-{slug}", api, "stream", bad,
                                 "stream must be an open Stream or None (the default stream)",
                                 _api_call(api, _with(drop=("weight", "y_origin")), 2, _with_stream(maker)), exc,
                                 ("stream",), slug=f"stream-{slug}"))
        cases.append(BadCase(f"phases-launch-stream-{slug}", "phases", "stream", bad,
                             "stream must be an open Stream or None (the default stream)",
                             _executor_call(lambda stack, ex, maker=maker: (lambda s=maker(stack): ex.launch(s))), exc,
                             ("stream",), slug=f"launch-stream-{slug}"))

    def small_workspace(stack, ex):
        buffer = stack.enter_context(acl_swiglu.DeviceBuffer(64))
        return lambda: ex.launch(workspace=buffer)

    def closed_workspace(stack, ex):
        buffer = acl_swiglu.DeviceBuffer(ex.workspace_size)
        buffer.close()
        return lambda: ex.launch(workspace=buffer)

    def numpy_workspace(stack, ex):
        host = np.zeros(ex.workspace_size, np.uint8)
        return lambda: ex.launch(workspace=host)

    cases += [
        BadCase("phases-launch-workspace-small", "phases", "workspace", "a 64-byte DeviceBuffer (16384 needed)",
                "the workspace must hold what phase 1 asked for", _executor_call(small_workspace), A, ("workspace",),
                slug="launch-workspace-small"),
        BadCase("phases-launch-workspace-closed", "phases", "workspace", "a DeviceBuffer closed before the call",
                "a closed DeviceBuffer cannot be used", _executor_call(closed_workspace), CLOSED, ("workspace",),
                slug="launch-workspace-closed"),
        BadCase("phases-launch-workspace-numpy", "phases", "workspace", "a NumPy array (host memory)",
                "workspace must be a DeviceBuffer or None", _executor_call(numpy_workspace), TE, ("workspace",),
                slug="launch-workspace-numpy"),
        BadCase("phases-launch-twice", "phases", "executor", "a single-use Executor launched a second time",
                "phase 2 consumes a single-use executor",
                _executor_call(lambda stack, ex: (lambda ex=_launched(stack, ex): ex.launch())), CLOSED,
                ("Executor",), slug="launch-twice"),
        BadCase("phases-launch-closed", "phases", "executor", "an Executor closed before launch",
                "a closed Executor cannot be used",
                _executor_call(lambda stack, ex: (lambda ex=_closed(stack, ex): ex.launch())), CLOSED,
                ("Executor",), slug="launch-closed"),
        BadCase("phases-repeatable-closed", "phases", "executor", "`make_repeatable()` on a closed Executor",
                "a closed Executor cannot be used",
                _executor_call(lambda stack, ex: (lambda ex=_closed(stack, ex): ex.make_repeatable())), CLOSED,
                ("Executor",), slug="repeatable-closed"),
        BadCase("phases-repeatable-consumed", "phases", "executor",
                "`make_repeatable()` on a single-use Executor already launched", "phase 2 consumes a single-use "
                "executor", _executor_call(lambda stack, ex: (lambda ex=_launched(stack, ex): ex.make_repeatable())),
                CLOSED, ("Executor",), slug="repeatable-consumed"),
        BadCase("phases-grad_x-None", "phases", "grad_x", "`grad_x=None`", "phase 1 needs the output tensor",
                _api_call("phases", _with(drop=("weight", "y_origin"), grad_x=None)), A, ("grad_x",),
                slug="grad_x-None"),
        BadCase("phases-grad_x-missing", "phases", "grad_x", "grad_x not passed",
                "grad_x is a required keyword argument of phase 1",
                _executor_free_phase1(), TE, ("grad_x",), slug="grad_x-missing"),
        BadCase("phases-grad_weight-None", "phases", "grad_weight", "weight given, `grad_weight=None`",
                "phase 1 needs grad_weight when weight is given",
                _api_call("phases", _with(grad_weight=None)), A, ("grad_weight",), slug="grad_weight-None"),
    ]
    return cases


def _executor_free_phase1():
    def factory(stack: ExitStack) -> Call:
        call = Call()
        args = base_args(weight=False)
        call.host = _arrays_in(args)
        kwargs = {name: _to_device(stack, call, name, value, 2) for name, value in args.items()}
        call.run = lambda: _dispose(acl_swiglu.get_workspace_size(**kwargs))
        return call
    return factory


# ---------------------------------------------------------------------------------------------
# calling a built plan


def _plan_call(action, weight=True, group=True, abi=2, grad_x_given=False):
    """Builds a plan on the base call (device copies), runs it once, then `action(stack, call,
    plan, dev)` returns the keyword arguments of the call that must fail."""
    def factory(stack: ExitStack) -> Call:
        call = Call()
        args = base_args(weight=weight, group=group)
        call.host = _arrays_in(args)
        dev = {name: _to_device(stack, call, name, value, abi) for name, value in args.items()}
        if grad_x_given:
            dev["grad_x"] = stack.enter_context(acl_swiglu.DeviceArray.empty((T, 2 * H), F32))
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(**dev))
        plan()
        plan.stream.synchronize()
        kwargs = action(stack, call, plan, dev)

        def go():
            try:
                plan(**kwargs)
                return "returned without raising"
            finally:
                if not plan.stream.closed:
                    plan.stream.synchronize()
        call.run = go
        return call
    return factory


def _rebind(name, maker):
    def action(stack, call, plan, dev):
        return {name: maker(stack, call, dev)}
    return action


def _device_of(array):
    def maker(stack, call, dev):
        d = stack.enter_context(acl_swiglu.to_device(array() if callable(array) else array))
        call.device_arrays.append(d)
        return d
    return maker


def _closed_copy(name):
    def maker(stack, call, dev):
        d = acl_swiglu.to_device(call.host[name] if name in call.host else np.zeros((T, 2 * H), np.float32))
        d.close()
        return d
    return maker


def _close_bound(name):
    def action(stack, call, plan, dev):
        dev[name].close()
        call.device.pop(name, None)
        return {}
    return action


def _close_plan(stack, call, plan, dev):
    plan.close()
    return {}


def _plan_call_cases() -> List[BadCase]:
    layout = "a rebound array must have the plan's layout (shape, dtype, strides, offset)"
    rows = [
        ("closed-plan", "plan", "a plan closed before the call", "a closed plan cannot be used",
         _plan_call(_close_plan), CLOSED, ("SwigluGroupQuantGradPlan",)),
        ("grad_y-shape", "grad_y", "DeviceArray [T+1, H]", layout,
         _plan_call(_rebind("grad_y", _device_of(lambda: np.zeros((T + 1, H), np.float32)))), A, ("grad_y",)),
        ("x-dtype", "x", "float16 DeviceArray [T, 2H]", layout,
         _plan_call(_rebind("x", _device_of(lambda: np.zeros((T, 2 * H), np.float16)))), A, ("x",)),
        ("x-fortran", "x", "Fortran-ordered DeviceArray [T, 2H] (other strides)", layout,
         _plan_call(_rebind("x", _device_of(lambda: np.asfortranarray(np.zeros((T, 2 * H), np.float32))))), A,
         ("x",)),
        ("weight-flat", "weight", "DeviceArray [T] (plan built with [T, 1])", layout,
         _plan_call(_rebind("weight", _device_of(lambda: np.ones((T,), np.float32)))), A, ("weight",)),
        ("y_origin-numpy", "y_origin", "a NumPy array", "a rebound array must be a DeviceArray",
         _plan_call(_rebind("y_origin", lambda stack, call, dev: np.zeros((T, H), np.float32))), TE, ("y_origin",)),
        ("group_index-list", "group_index", "list `[3, 1]`", "a rebound array must be a DeviceArray",
         _plan_call(_rebind("group_index", lambda stack, call, dev: list(GROUPS))), TE, ("group_index",)),
        ("group_index-int32", "group_index", "int32 DeviceArray [2]", layout,
         _plan_call(_rebind("group_index", _device_of(lambda: np.array(GROUPS, np.int32)))), A, ("group_index",)),
        ("grad_x-closed", "grad_x", "a DeviceArray closed before the call", "a closed DeviceArray cannot be used",
         _plan_call(_rebind("grad_x", _closed_copy("grad_x"))), CLOSED, ("grad_x",)),
        ("grad_weight-shape", "grad_weight", "DeviceArray [T+1, 1]", layout,
         _plan_call(_rebind("grad_weight", _device_of(lambda: np.zeros((T + 1, 1), np.float32)))), A,
         ("grad_weight",)),
        ("bound-x-closed", "x", "the x the plan was built with, closed before the call (not rebound)",
         "every bound array must still be open", _plan_call(_close_bound("x")), CLOSED, ("x",)),
        ("bound-grad_x-closed", "grad_x", "the caller's grad_x the plan was built with, closed before the call",
         "every bound array must still be open", _plan_call(_close_bound("grad_x"), grad_x_given=True), CLOSED,
         ("grad_x",)),
        ("weight-not-in-plan", "weight", "weight for a plan built without weight", "a plan's arguments are fixed "
         "at build", _plan_call(_rebind("weight", _device_of(lambda: np.ones((T, 1), np.float32))), weight=False), A,
         ("weight",)),
        ("group_index-not-in-plan", "group_index", "group_index for a plan built without it",
         "a plan's arguments are fixed at build",
         _plan_call(_rebind("group_index", _device_of(lambda: np.array(GROUPS, np.int64))), group=False), A,
         ("group_index",)),
        ("clamp_limit-keyword", "clamp_limit", "`clamp_limit=2.0`", "clamp_limit is fixed at build",
         _plan_call(lambda stack, call, plan, dev: {"clamp_limit": 2.0}), TE, ("clamp_limit",)),
        ("rev1-group_index-float", "group_index", "float values `[2.5, 1.5]` (ABI revision 1)",
         "group_index must hold integers",
         _plan_call(_rebind("group_index", lambda stack, call, dev: np.array([2.5, 1.5])), abi=1), A,
         ("group_index",)),
        ("grad_x-aliases-x", "grad_x", "grad_x rebound to a view of x's device memory (same layout)",
         "the operator does not work in place: an output must not overlap an input",
         _plan_call(_rebind("grad_x", lambda stack, call, dev: _wrap(stack, call, dev["x"].ptr, (T, 2 * H), F32))),
         errors.AclnnErrParamInvalid, ("grad_x",)),
    ]
    cases = []
    for slug, argument, bad, rule, factory, exc, fragments in rows:
        abi = 1 if slug.startswith("rev1-") else 2
        cases.append(BadCase(f"plan-call-{slug}", "plan-call", argument, bad, rule, factory, exc, fragments, abi,
                             slug=slug))
    return cases


# ---------------------------------------------------------------------------------------------
# the CLI

CLI_SMALL = ["--tokens", "4", "--hidden", "8"]


def _cli(argv, subprocess=False):
    def factory(stack: ExitStack) -> Call:
        return Call(argv=list(argv), subprocess=subprocess)
    return factory


def _cli_cases() -> List[BadCase]:
    rows = [
        ("tokens-negative", "--tokens", ["--tokens", "-1"], "must be a whole number >= 0"),
        ("tokens-word", "--tokens", ["--tokens", "x"], "must be a whole number >= 0"),
        ("tokens-float", "--tokens", ["--tokens", "1.5"], "must be a whole number >= 0"),
        ("tokens-missing", "--tokens", ["--tokens"], "needs a value"),
        ("hidden-word", "--hidden", ["--hidden", "x"], "must be a whole number >= 0"),
        ("hidden-negative", "--hidden", ["--hidden", "-2"], "must be a whole number >= 0"),
        ("batch-0", "--batch", ["--batch", "0"], "must be a whole number >= 1"),
        ("clamp-0", "--clamp", ["--clamp", "0"], "must be a finite number > 0 or 'none'"),
        ("clamp-negative", "--clamp", ["--clamp", "-1"], "must be a finite number > 0 or 'none'"),
        ("clamp-nan", "--clamp", ["--clamp", "nan"], "must be a finite number > 0 or 'none'"),
        ("clamp-inf", "--clamp", ["--clamp", "inf"], "must be a finite number > 0 or 'none'"),
        ("clamp-word", "--clamp", ["--clamp", "abc"], "must be a finite number > 0 or 'none'"),
        ("clamp-1e-50", "--clamp", CLI_SMALL + ["--clamp", "1e-50"], "must stay > 0 in float32"),
        ("clamp-1e39", "--clamp", CLI_SMALL + ["--clamp", "1e39"], "must stay finite in float32"),
        ("group-index-word", "--group-index", ["--group-index", "1,a"], "must be comma-separated ints or 'none'"),
        ("group-index-float", "--group-index", ["--group-index", "1.5"], "must be comma-separated ints or 'none'"),
        ("dtype-fp64", "--dtype", ["--dtype", "fp64"], "must be fp32, fp16 or bf16"),
        ("abi-3", "--abi", ["--abi", "3"], "must be 1 or 2"),
        ("backend-gpu", "--backend", ["--backend", "gpu"], "must be auto, cann or emulator"),
        ("repeat-0", "--repeat", ["--repeat", "0"], "must be a whole number >= 1"),
        ("repeat-word", "--repeat", ["--repeat", "x"], "must be a whole number >= 1"),
        ("seed-word", "--seed", ["--seed", "x"], "must be an int"),
        ("device-id-negative", "--device-id", ["--device-id", "-1"], "must be a whole number >= 0"),
        ("unknown-option", "--frobnicate", ["--frobnicate"], "no such option"),
    ]
    cases = []
    for slug, option, argv, rule in rows:
        fragment = "unrecognized arguments: --frobnicate" if slug == "unknown-option" else f"argument {option}"
        cases.append(BadCase(f"cli-{slug}", "cli", option, "`" + " ".join(argv) + "`", rule, _cli(argv), SystemExit,
                             (fragment,), exit_status=2, slug=slug))
    cases.append(BadCase(
        "cli-device-id-absent", "cli", "--device-id", "`--device-id 99 --tokens 4 --hidden 8` (the emulator has one "
        "device), run as `python -m acl_swiglu`", "a device that does not exist: the ACL status, exit status 3",
        _cli(["--device-id", "99"] + CLI_SMALL, subprocess=True), SystemExit,
        ("ACL_ERROR_RT_INVALID_DEVICEID", "aclrtSetDevice"), exit_status=3, slug="device-id-absent"))
    return cases


# ---------------------------------------------------------------------------------------------
# the catalogue

BAD_CASES: List[BadCase] = (_rule_cases() + _memory_cases() + _stream_cases() + _plan_call_cases() + _cli_cases())
BAD_CASES.sort(key=lambda c: APIS.index(c.api))   # stable: rule order within an API

_ids = [c.id for c in BAD_CASES]
assert len(set(_ids)) == len(_ids), "duplicate case ids"

# ---------------------------------------------------------------------------------------------
# valid but unusual inputs


def unaligned(array: np.ndarray, shift: int = 1) -> np.ndarray:
    """A copy of `array` living `shift` bytes into a uint8 buffer: a misaligned view."""
    array = np.ascontiguousarray(array)
    raw = np.zeros(array.nbytes + shift, np.uint8)
    view = raw[shift:].view(array.dtype).reshape(array.shape)
    view[...] = array
    assert array.size == 0 or view.ctypes.data % array.dtype.itemsize != 0
    return view


def read_only(array: np.ndarray) -> np.ndarray:
    """The same array (or view), made read-only."""
    array.flags.writeable = False
    return array


def _step_view(array: np.ndarray) -> np.ndarray:
    """The same values as a view with steps (every other row and column of a larger array)."""
    big = np.zeros(tuple(2 * d for d in array.shape), array.dtype)
    view = big[tuple(slice(None, None, 2) for _ in array.shape)]
    view[...] = array
    return view


def _reversed(array: np.ndarray) -> np.ndarray:
    """The same values as a view with negative strides on every axis."""
    big = np.ascontiguousarray(array[tuple(slice(None, None, -1) for _ in array.shape)])
    return big[tuple(slice(None, None, -1) for _ in array.shape)]


def _transposed(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.T).T


def _fortran(array: np.ndarray) -> np.ndarray:
    return np.asfortranarray(array)


def _swapped(array: np.ndarray) -> np.ndarray:
    return array.astype(array.dtype.newbyteorder(">" if sys.byteorder == "little" else "<"))


def _all(transform, names=("grad_y", "x", "weight", "y_origin", "group_index"), base=None):
    def make():
        args = (base or base_args)()
        for name in names:
            if isinstance(args.get(name), np.ndarray):
                args[name] = transform(args[name])
        return args
    return make


def _combined(array):
    """Byte-swapped values in a read-only view with step 2 on every axis, 1 byte into a uint8 buffer."""
    array = _swapped(array)
    big_shape = tuple(2 * d for d in array.shape)
    raw = np.zeros(int(np.prod(big_shape)) * array.dtype.itemsize + 1, np.uint8)
    view = raw[1:].view(array.dtype).reshape(big_shape)[tuple(slice(None, None, 2) for _ in big_shape)]
    view[...] = array
    return read_only(view)


def _broadcast_args():
    args = base_args()
    rng = _rng(5)
    args["grad_y"] = np.broadcast_to(rng.uniform(-1, 1, H).astype(np.float32), (T, H))
    args["x"] = np.broadcast_to(rng.uniform(-3, 3, (1, 2 * H)).astype(np.float32), (T, 2 * H))
    args["weight"] = np.broadcast_to(np.float32(0.75), (T, 1))
    args["y_origin"] = np.broadcast_to(rng.uniform(-1, 1, (T, 1)).astype(np.float32), (T, H))
    return args


def _special_values():
    args = base_args(clamp=False)
    gy, x = args["grad_y"], args["x"]
    gy[0, :4] = [np.nan, np.inf, -0.0, 1e-45]
    x[1, :4] = [np.nan, -np.inf, 100.0, -100.0]
    x[2, H:H + 3] = [np.inf, 1e-40, -0.0]
    return args


def plain(value):
    """The plain version of an argument: a native, C-contiguous copy (a float for a clamp)."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value.astype(value.dtype.newbyteorder("="))).copy()
    if value is None:
        return None
    return float(value)


def _offset_device(stack: ExitStack, name: str, array: np.ndarray):
    """A DeviceArray at an element offset into a larger allocation (a framework-style view)."""
    array = plain(array)
    pad = 5
    if array.size == 0:
        return stack.enter_context(acl_swiglu.to_device(array))
    buffer = acl_swiglu.DeviceBuffer((array.size + pad) * array.dtype.itemsize)
    buffer.copy_from_address(array.ctypes.data, array.nbytes, pad * array.dtype.itemsize)
    return stack.enter_context(acl_swiglu.DeviceArray(buffer, array.shape, array.dtype, None, pad))


ALL_VALID_APIS = ("one-shot", "device", "plan-build", "phases")

_VALID_ROWS = [
    ("read-only", "all", "every array read-only (`flags.writeable = False`)", _all(read_only), ALL_VALID_APIS),
    ("unaligned-fp32", "all", "every array (float32 data, float32 weight, int64 group_index) a view 1 byte into a "
     "uint8 buffer: misaligned", _all(unaligned), ALL_VALID_APIS),
    ("unaligned-fp16", "grad_y, x, y_origin", "float16 views 1 byte into uint8 buffers",
     _all(unaligned, ("grad_y", "x", "y_origin"), base=lambda: base_args(F16)), ALL_VALID_APIS),
    ("unaligned-bf16", "grad_y, x, y_origin", "bfloat16 views 3 bytes into uint8 buffers",
     _all(lambda a: unaligned(a, 3), ("grad_y", "x", "y_origin"), base=lambda: base_args(BF16)), ("one-shot",)),
    ("fortran", "all", "Fortran-ordered 2-D arrays", _all(_fortran), ALL_VALID_APIS),
    ("fortran-3d", "grad_y, x, y_origin, weight", "Fortran-ordered 3-D arrays [2, 2, ...]",
     _all(_fortran, base=lambda: base_args(lead=(2, 2))), ALL_VALID_APIS),
    ("sliced-steps", "all", "views with step 2 on every axis of larger arrays", _all(_step_view), ALL_VALID_APIS),
    ("negative-steps", "all", "views with negative strides on every axis", _all(_reversed), ALL_VALID_APIS),
    ("transposed", "grad_y, x, y_origin, weight", "transposes of contiguous arrays (column-major views)",
     _all(_transposed, ("grad_y", "x", "y_origin", "weight")), ALL_VALID_APIS),
    ("broadcast", "grad_y, x, weight, y_origin", "`numpy.broadcast_to` views (zero strides)", _broadcast_args,
     ALL_VALID_APIS),
    ("non-native-fp32", "all", "non-native byte order (`>f4`, weight `>f4`, group_index `>i8`)", _all(_swapped),
     ALL_VALID_APIS),
    ("non-native-fp16", "grad_y, x, y_origin", "non-native byte order `>f2`",
     _all(_swapped, ("grad_y", "x", "y_origin"), base=lambda: base_args(F16)), ("one-shot", "device")),
    ("read-only-unaligned-non-native-sliced", "all", "all four at once: read-only, misaligned, byte-swapped views "
     "with steps",
     _all(_combined), ("one-shot", "device")),
    ("bf16-sliced", "grad_y, x, y_origin", "bfloat16 views with steps",
     _all(_step_view, ("grad_y", "x", "y_origin"), base=lambda: base_args(BF16)), ("one-shot", "device")),
    ("1-d", "all", "1-D grad_y [H], x [2H], y_origin [H], weight [1], group_index [1]",
     _with(lambda: base_args(lead=()), group_index=np.array([1], np.int64)), ALL_VALID_APIS),
    ("8-d", "all", "8-D grad_y [1, 2, 1, 1, 1, 1, 2, H] and the rest to match",
     lambda: base_args(lead=(1, 2, 1, 1, 1, 1, 2)), ALL_VALID_APIS),
    ("empty-rows", "all", "T = 0: grad_y [0, H], x [0, 2H], weight [0, 1], group_index []",
     _with(lambda: base_args(lead=(0,)), group_index=np.zeros(0, np.int64)), ALL_VALID_APIS),
    ("empty-hidden", "grad_y, x, y_origin", "H = 0: grad_y [T, 0], x [T, 0] (grad_weight is all zeros)",
     lambda: base_args(h=0), ALL_VALID_APIS),
    ("empty-groups", "group_index", "group_index [] (G = 0: every row is zero)",
     _with(group_index=np.zeros(0, np.int64)), ALL_VALID_APIS),
    ("weight-1d", "weight", "weight [T] (not [T, 1])",
     _with(weight=lambda a: a["weight"].reshape(T)), ("one-shot", "device")),
    ("weight-8d", "weight", "weight 8-D [T, 1, 1, 1, 1, 1, 1, 1]",
     _with(weight=lambda a: a["weight"].reshape((T,) + (1,) * 7)), ("one-shot", "device")),
    ("group_index-sliced", "group_index", "group_index `[3, 9, 1, 9][::2]` (a strided view)",
     _with(group_index=lambda a: np.array([3, 9, 1, 9], np.int64)[::2]), ALL_VALID_APIS),
    ("group_index-odd-counts", "group_index", "counts summing past T, and a negative count (uint32 wrap)",
     _with(group_index=np.array([2, 9, -3], np.int64)), ("one-shot", "device")),
    ("clamp-numpy-float32", "clamp_limit", "`numpy.float32(1.5)`", _with(clamp_limit=np.float32(1.5)),
     ("one-shot", "device")),
    ("clamp-int", "clamp_limit", "the int `2`", _with(clamp_limit=2), ("one-shot",)),
    ("clamp-fraction", "clamp_limit", "`fractions.Fraction(3, 2)`", _with(clamp_limit=fractions.Fraction(3, 2)),
     ("one-shot",)),
    ("clamp-tiny", "clamp_limit", "`1e-45` (the smallest float32 subnormal)", _with(clamp_limit=1e-45),
     ("one-shot",)),
    ("special-values", "grad_y, x", "NaN, +-inf, -0.0 and subnormals in the data", _special_values, ("one-shot",)),
]


def _valid_cases() -> List[ValidCase]:
    cases = []
    for slug, argument, description, make, apis in _VALID_ROWS:
        for api in apis:
            cases.append(ValidCase(f"{api}-{slug}", api, argument, description, make, slug=slug))
    for api in ("device", "plan-build", "phases"):
        cases.append(ValidCase(f"{api}-offset-views", api, "all",
                               "DeviceArrays at an element offset of 5 into larger allocations",
                               base_args, device=_offset_device, slug="offset-views"))
    return cases


VALID_CASES: List[ValidCase] = _valid_cases()
_valid_ids = [c.id for c in VALID_CASES]
assert len(set(_valid_ids)) == len(_valid_ids), "duplicate valid case ids"


def run_valid(case: ValidCase, stack: ExitStack, args: Dict[str, Any]):
    """Runs a valid case through its API; returns (grad_x, grad_weight) as NumPy arrays."""
    if case.api == "one-shot":
        return acl_swiglu.swiglu_group_quant_grad(**args)
    convert = case.device or (lambda stack, name, value: stack.enter_context(acl_swiglu.to_device(value)))
    dev = {name: convert(stack, name, value) if isinstance(value, np.ndarray) else value
           for name, value in args.items()}
    if case.api == "device":
        grad_x, grad_weight = acl_swiglu.swiglu_group_quant_grad_device(**dev)
        stack.enter_context(grad_x)
        if grad_weight is not None:
            stack.enter_context(grad_weight)
    elif case.api == "plan-build":
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(**dev))
        grad_x, grad_weight = plan()
    else:
        x, weight = plain(args["x"]), args.get("weight")
        grad_x = stack.enter_context(acl_swiglu.DeviceArray.empty(x.shape, x.dtype))
        grad_weight = (stack.enter_context(acl_swiglu.DeviceArray.empty(weight.shape, F32))
                       if weight is not None else None)
        executor = stack.enter_context(acl_swiglu.get_workspace_size(**dev, grad_x=grad_x, grad_weight=grad_weight))
        executor.launch()
        acl_swiglu.default_stream().synchronize()
    return grad_x.to_numpy(), (grad_weight.to_numpy() if grad_weight is not None else None)


# ---------------------------------------------------------------------------------------------
# the page

INTRO = """\
# Bad inputs: what every API rejects, and how

This page is generated from `tests/bad_inputs.py` by `render_markdown()` (rewrite it with
`python tests/bad_inputs.py`); `tests/test_bad_inputs.py` runs every row and checks that this page
is exactly what the catalogue renders, so the two cannot drift apart.

## What is checked where

- **The Python layer** (`acl_swiglu/_validate.py`, the runtime objects, the plan and argparse in
  the CLI) checks every rule it can see from the arguments themselves: types, dtypes, ranks,
  shapes, the weight / y_origin pairing, `group_index`, `clamp_limit`, outputs, closed handles.
  It raises `acl_swiglu.ArgumentError` (a `ValueError`), `TypeError` or
  `acl_swiglu.HandleClosedError` **before anything is allocated**: no device memory, no tensor,
  no executor, no stream.
- **The library** (CANN, or the bundled emulator that stands in for it) checks what only it can
  see: how much device memory there is, whether an address is device memory, whether a view lies
  inside its allocation, whether outputs overlap inputs, each other or themselves. These fail with
  the status code as an `acl_swiglu.errors.AclError` subclass (for example
  `AclErrorRtMemoryAllocation`, 207001, from `aclrtMalloc`; `AclnnErrParamInvalid`, 161002, from
  phase 1), and whatever was allocated for the call is freed again.
- The one-shot API has no output parameters (it returns fresh arrays). On the device side an
  output cannot be "read-only"; the nearest things are an output whose elements share addresses
  (zero strides, like a NumPy broadcast view) and an output that aliases an input or the other
  output, which the library rejects.
- **The CLI** exits with status 2 and an argparse-style `error: argument --option: ...` line for
  a bad option, 3 when an ACL call fails.

Every row is a test: the call raises the class given (or a subclass) and the message contains
each of the names given (identifiers as whole words), naming the argument the way the Python API
names it (`grad_y`, `x`, `weight`, `y_origin`, `group_index`, `clamp_limit`, `grad_x`,
`grad_weight`, `stream`, ...). Nothing crashes or hangs; the NumPy arrays handed over are
byte-identical afterwards (read-only ones included) and the device copies of the inputs still
hold their values; `acl_swiglu.emulator.live_counts()` is the same after the failing call as
before it (for library-side failures, aclTensor handles cached on the caller's own DeviceArrays
are the only difference allowed, and they go with those arrays), and everything is freed once
the caller's objects are closed.

The base call is small: grad_y [T, H] = [4, 8] float32, x [4, 16], weight [4, 1], y_origin
[4, 8], group_index int64 [3, 1], clamp_limit 1.0; each row changes one thing of it. ABI
revision 2 (the default) unless the row says revision 1 (`ACL_SWIGLU_ABI=1`, where
`group_index` is host integers for the device-level APIs). Rows that apply to several APIs are
listed once; their test ids are `<api>-<id>`.

"""

VALID_INTRO = """\
## Valid unusual inputs

These look odd but are valid and must work: each gives the same bits as the same call on plain
(native byte order, C-contiguous) copies of its inputs, through the APIs listed (device-level
APIs receive `to_device` copies, which keep non-negative strides; the `offset-views` rows build
DeviceArrays at an element offset into a larger allocation). The inputs are unchanged afterwards.

"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _exception_text(case: BadCase) -> str:
    if case.api == "cli":
        return f"exit status {case.exit_status}"
    exc = case.exception
    if issubclass(exc, errors.AclError):
        return f"`{exc.__name__}` ({exc.name}, {exc.code})"
    if exc.__module__.startswith("acl_swiglu"):
        return f"`acl_swiglu.{exc.__name__}`"
    return f"`{exc.__name__}`"


def _group_rows(cases: Sequence[BadCase]):
    """Cases that differ only by API, in first-appearance order."""
    groups: Dict[tuple, List[BadCase]] = {}
    for case in cases:
        key = (case.slug, case.argument, case.bad_input, case.rule, case.exception, case.fragments, case.abi,
               case.exit_status)
        groups.setdefault(key, []).append(case)
    return list(groups.values())


SECTIONS = [
    ("The operator's arguments: one-shot, device-level, plan and phase 1",
     lambda c: c.api in ARRAY_APIS and c.slug in {r.slug for r in RULES}),
    ("Memory: device arrays, sizes that cannot be allocated, and what only the library can see",
     lambda c: c.api in ARRAY_APIS and c.slug not in {r.slug for r in RULES} and
     (c.side == "library" or c.slug.startswith(("huge", "empty", "wrap", "to_device")))),
    ("Streams, workspaces, executors and phase 1's outputs",
     lambda c: c.api in ARRAY_APIS and c.slug not in {r.slug for r in RULES} and
     not (c.side == "library" or c.slug.startswith(("huge", "empty", "wrap", "to_device")))),
    ("Calling a built plan", lambda c: c.api == "plan-call"),
    ("The CLI", lambda c: c.api == "cli"),
]


def render_markdown() -> str:
    lines = [INTRO]
    bad_count = len(BAD_CASES)
    rows_total = 0
    lines.append("APIs: " + "; ".join(f"**{api}** = {API_TEXT[api]}" for api in APIS) + ".\n")
    seen = set()
    for title, belongs in SECTIONS:
        cases = [c for c in BAD_CASES if c.id not in seen and belongs(c)]
        seen.update(c.id for c in cases)
        if not cases:
            continue
        lines.append(f"## {title}\n")
        lines.append("| id | API | argument | bad input | rule | checked by | exception | message names |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for group in _group_rows(cases):
            case = group[0]
            apis = ", ".join(c.api for c in group)
            rid = case.slug + (" (rev 1)" if case.abi == 1 and not case.slug.startswith("rev1") else "")
            names = ", ".join(f"`{f}`" for f in case.fragments)
            lines.append(f"| `{_cell(rid)}` | {apis} | `{_cell(case.argument)}` | {_cell(case.bad_input)} | "
                         f"{_cell(case.rule)} | {case.side} | {_exception_text(case)} | {_cell(names)} |")
            rows_total += 1
        lines.append("")
    assert seen == {c.id for c in BAD_CASES}, "a case belongs to no section"
    lines.append(VALID_INTRO)
    lines.append("| id | APIs | argument | input |")
    lines.append("|---|---|---|---|")
    valid_groups: Dict[str, List[ValidCase]] = {}
    for case in VALID_CASES:
        valid_groups.setdefault(case.slug, []).append(case)
    for slug, group in valid_groups.items():
        case = group[0]
        lines.append(f"| `{slug}` | {', '.join(c.api for c in group)} | {_cell(case.argument)} | "
                     f"{_cell(case.description)} |")
    lines.append("")
    lines.append(f"{bad_count} bad cases in {rows_total} rows; {len(VALID_CASES)} valid cases in "
                 f"{len(valid_groups)} rows.")
    return "\n".join(lines) + "\n"


DOC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "bad_inputs.md")

if __name__ == "__main__":
    with open(DOC_PATH, "w", encoding="utf-8") as f:
        f.write(render_markdown())
    print(f"wrote {DOC_PATH}: {len(BAD_CASES)} bad cases, {len(VALID_CASES)} valid cases")
