"""Every argument rule raises the right exception, naming the argument, before anything is
allocated -- for the one-shot NumPy API, the device-level API and the plan -- and errors that come
from the emulator itself carry their real status codes, names, API names and messages."""

from __future__ import annotations

import ctypes
import gc
import math
import os
import pickle
import re
import sys
from contextlib import ExitStack

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import _ffi, emulator, errors  # noqa: E402

BF16 = np.dtype(ml_dtypes.bfloat16)
APIS = ["oneshot", "device", "plan"]
ABI_VALUES = (1, 2)

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
PHASE2 = "aclnnSwigluGroupQuantGrad"


# ----------------------------------------------------------------------------- argument cases


class Closed:
    """Marker: a DeviceArray made from `array`, closed before the call."""

    def __init__(self, array):
        self.array = array


class OtherContainer:
    """Marker: `array` in the container the API does NOT take (DeviceArray for the one-shot
    API, numpy.ndarray for the device-level API and the plan)."""

    def __init__(self, array):
        self.array = array


T, H = 5, 8


def base_args():
    rng = np.random.default_rng(0)
    return {
        "grad_y": rng.uniform(-1, 1, (T, H)).astype(np.float32),
        "x": rng.uniform(-1, 1, (T, 2 * H)).astype(np.float32),
        "weight": np.full((T, 1), 0.5, np.float32),
        "y_origin": rng.uniform(-1, 1, (T, H)).astype(np.float32),
        "group_index": np.array([2, 1], np.int64),
        "clamp_limit": 1.0,
    }


def _set(**changes):
    def mutate(args):
        args.update(changes)
    return mutate


def _drop(*names, **changes):
    def mutate(args):
        for name in names:
            args.pop(name, None)
        args.update(changes)
    return mutate


def _shapes(lead, h, weight=True):
    def mutate(args):
        rng = np.random.default_rng(1)
        args["grad_y"] = rng.uniform(-1, 1, lead + (h,)).astype(np.float32)
        args["x"] = rng.uniform(-1, 1, lead + (2 * h,)).astype(np.float32)
        if weight:
            args["y_origin"] = rng.uniform(-1, 1, lead + (h,)).astype(np.float32)
            args["weight"] = np.ones(lead + (1,), np.float32)
        else:
            args.pop("weight")
            args.pop("y_origin")
    return mutate


def _with(**arrays):
    """Replace arguments by arrays made from the base ones: name=function(base_args) -> value."""
    def mutate(args):
        base = dict(args)
        for name, make in arrays.items():
            args[name] = make(base)
    return mutate


ALL = {"oneshot", "device", "plan"}
DEVICE = {"device", "plan"}

# (id, mutate, exception, names the message must contain, apis, abis)
CASES = [
    # wrong dtypes
    ("grad_y-int32", _with(grad_y=lambda a: a["grad_y"].astype(np.int32)),
     acl_swiglu.ArgumentError, ["grad_y"], ALL, ABI_VALUES),
    ("grad_y-float64", _with(grad_y=lambda a: a["grad_y"].astype(np.float64)),
     acl_swiglu.ArgumentError, ["grad_y"], ALL, ABI_VALUES),
    ("x-float16", _with(x=lambda a: a["x"].astype(np.float16)), acl_swiglu.ArgumentError, ["x"], ALL, ABI_VALUES),
    ("x-bfloat16", _with(x=lambda a: a["x"].astype(BF16)), acl_swiglu.ArgumentError, ["x"], ALL, ABI_VALUES),
    ("y_origin-float16", _with(y_origin=lambda a: a["y_origin"].astype(np.float16)),
     acl_swiglu.ArgumentError, ["y_origin"], ALL, ABI_VALUES),
    ("weight-float64", _with(weight=lambda a: a["weight"].astype(np.float64)),
     acl_swiglu.ArgumentError, ["weight"], ALL, ABI_VALUES),
    ("weight-float16", _with(weight=lambda a: a["weight"].astype(np.float16)),
     acl_swiglu.ArgumentError, ["weight"], ALL, ABI_VALUES),
    ("group_index-float64", _set(group_index=np.array([2.0, 1.0])),
     acl_swiglu.ArgumentError, ["group_index"], ALL, ABI_VALUES),
    ("group_index-int32", _set(group_index=np.array([2, 1], np.int32)),
     acl_swiglu.ArgumentError, ["group_index"], ALL, (2,)),
    # not arrays at all
    ("grad_y-list", _set(grad_y=[[1.0] * H] * T), TypeError, ["grad_y"], ALL, ABI_VALUES),
    ("grad_y-scalar", _set(grad_y=1.0), TypeError, ["grad_y"], ALL, ABI_VALUES),
    ("grad_y-None", _set(grad_y=None), TypeError, ["grad_y"], ALL, ABI_VALUES),
    ("x-list", _set(x=[[1.0] * 2 * H] * T), TypeError, ["x"], ALL, ABI_VALUES),
    ("x-scalar", _set(x=3), TypeError, ["x"], ALL, ABI_VALUES),
    ("x-None", _set(x=None), TypeError, ["x"], ALL, ABI_VALUES),
    ("weight-list", _set(weight=[[0.5]] * T), TypeError, ["weight"], ALL, ABI_VALUES),
    ("y_origin-scalar", _set(y_origin=0.5), TypeError, ["y_origin"], ALL, ABI_VALUES),
    ("group_index-list", _set(group_index=[2, 1]), TypeError, ["group_index"], ALL, (2,)),
    ("grad_y-other-container", _with(grad_y=lambda a: OtherContainer(a["grad_y"])),
     TypeError, ["grad_y"], ALL, ABI_VALUES),
    ("x-other-container", _with(x=lambda a: OtherContainer(a["x"])), TypeError, ["x"], ALL, ABI_VALUES),
    ("weight-other-container", _with(weight=lambda a: OtherContainer(a["weight"])),
     TypeError, ["weight"], ALL, ABI_VALUES),
    # ranks and shapes
    ("grad_y-0d", _drop("weight", "y_origin", grad_y=np.array(1.0, np.float32), x=np.array(1.0, np.float32)),
     acl_swiglu.ArgumentError, ["grad_y"], ALL, ABI_VALUES),
    ("grad_y-9d", _shapes((1,) * 8, H, weight=False), acl_swiglu.ArgumentError, ["grad_y"], ALL, ABI_VALUES),
    ("rank-mismatch", _with(x=lambda a: a["x"][None]), acl_swiglu.ArgumentError, ["x", "grad_y"], ALL, ABI_VALUES),
    ("leading-dims-mismatch", _with(x=lambda a: np.zeros((T + 1, 2 * H), np.float32)), acl_swiglu.ArgumentError,
     ["x", "grad_y"], ALL, ABI_VALUES),
    ("x-odd-last-dim", _with(x=lambda a: np.zeros((T, 2 * H + 1), np.float32)), acl_swiglu.ArgumentError, ["x"], ALL,
     ABI_VALUES),
    ("grad_y-last-not-half", _with(x=lambda a: np.zeros((T, 2 * H + 2), np.float32)), acl_swiglu.ArgumentError,
     ["grad_y", "x"], ALL, ABI_VALUES),
    ("y_origin-shape", _with(y_origin=lambda a: a["y_origin"][:, :-1].copy()), acl_swiglu.ArgumentError, ["y_origin"],
     ALL, ABI_VALUES),
    ("weight-without-y_origin", _drop("y_origin"), acl_swiglu.ArgumentError, ["weight", "y_origin"], ALL, ABI_VALUES),
    ("y_origin-without-weight", _drop("weight"), acl_swiglu.ArgumentError, ["y_origin"], ALL, ABI_VALUES),
    ("weight-count", _set(weight=np.ones((T + 1, 1), np.float32)),
     acl_swiglu.ArgumentError, ["weight"], ALL, ABI_VALUES),
    ("weight-count-flat", _set(weight=np.ones((T - 1,), np.float32)),
     acl_swiglu.ArgumentError, ["weight"], ALL, ABI_VALUES),
    ("weight-9d", _set(weight=np.ones((T,) + (1,) * 8, np.float32)), acl_swiglu.ArgumentError, ["weight"], ALL, (2,)),
    ("rev1-weight-flat", _set(weight=np.ones((T,), np.float32)), acl_swiglu.ArgumentError, ["weight"], ALL, (1,)),
    ("rev1-weight-2d-for-3d", _with(grad_y=lambda a: a["grad_y"].reshape(1, T, H),
                                    x=lambda a: a["x"].reshape(1, T, 2 * H),
                                    y_origin=lambda a: a["y_origin"].reshape(1, T, H)),
     acl_swiglu.ArgumentError, ["weight"], ALL, (1,)),
    ("rev1-weight-1-first", _set(weight=np.ones((1, T), np.float32)), acl_swiglu.ArgumentError, ["weight"], ALL, (1,)),
    ("rev1-rank1", _shapes((), H, weight=False), acl_swiglu.ArgumentError, ["grad_y"], ALL, (1,)),
    ("rev1-rank4", _shapes((1, 1, T), H), acl_swiglu.ArgumentError, ["grad_y"], ALL, (1,)),
    ("group_index-2d", _set(group_index=np.array([[2, 1]], np.int64)), acl_swiglu.ArgumentError, ["group_index"], ALL,
     ABI_VALUES),
    # clamp_limit
    ("clamp-0", _set(clamp_limit=0), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-0.0", _set(clamp_limit=0.0), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp--1", _set(clamp_limit=-1.0), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-nan", _set(clamp_limit=math.nan), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-inf", _set(clamp_limit=math.inf), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp--inf", _set(clamp_limit=-math.inf), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-1e-50", _set(clamp_limit=1e-50), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-1e39", _set(clamp_limit=1e39), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-huge-int", _set(clamp_limit=10 ** 400), acl_swiglu.ArgumentError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-True", _set(clamp_limit=True), TypeError, ["clamp_limit"], ALL, ABI_VALUES),
    ("clamp-string", _set(clamp_limit="1.0"), TypeError, ["clamp_limit"], ALL, ABI_VALUES),
    # outputs (device-level API and plan)
    ("grad_x-shape", _set(grad_x=np.zeros((T, H), np.float32)),
     acl_swiglu.ArgumentError, ["grad_x"], DEVICE, ABI_VALUES),
    ("grad_x-dtype", _set(grad_x=np.zeros((T, 2 * H), np.float16)), acl_swiglu.ArgumentError, ["grad_x"], DEVICE,
     ABI_VALUES),
    ("grad_x-numpy", _set(grad_x=OtherContainer(np.zeros((T, 2 * H), np.float32))), TypeError, ["grad_x"], DEVICE,
     ABI_VALUES),
    ("grad_weight-shape", _set(grad_weight=np.zeros((T + 1, 1), np.float32)), acl_swiglu.ArgumentError,
     ["grad_weight"], DEVICE, ABI_VALUES),
    ("grad_weight-dtype", _set(grad_weight=np.zeros((T, 1), np.float64)), acl_swiglu.ArgumentError, ["grad_weight"],
     DEVICE, ABI_VALUES),
    ("grad_weight-without-weight", _drop("weight", "y_origin", grad_weight=np.zeros((T, 1), np.float32)),
     acl_swiglu.ArgumentError, ["grad_weight"], DEVICE, ABI_VALUES),
    # closed device arrays
] + [
    (f"closed-{name}", _with(**{name: (lambda a, name=name: Closed(a[name]))}), acl_swiglu.HandleClosedError, [name],
     DEVICE, ABI_VALUES if name != "group_index" else (2,))
    for name in ("grad_y", "x", "weight", "y_origin", "group_index")
] + [
    ("closed-grad_x", _set(grad_x=Closed(np.zeros((T, 2 * H), np.float32))), acl_swiglu.HandleClosedError, ["grad_x"],
     DEVICE, ABI_VALUES),
    ("closed-grad_weight", _set(grad_weight=Closed(np.zeros((T, 1), np.float32))), acl_swiglu.HandleClosedError,
     ["grad_weight"], DEVICE, ABI_VALUES),
]

PARAMS = [
    pytest.param(api, abi_value, case, id=f"{case[0]}-{api}-abi{abi_value}", marks=pytest.mark.emulator_only)
    for case in CASES for api in APIS for abi_value in ABI_VALUES
    if api in case[4] and abi_value in case[5]
]


def _names_in(message: str, names) -> bool:
    return all(re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", message) for n in names)


def _to_device_args(stack: ExitStack, args: dict, abi: int) -> dict:
    out = {}
    for name, value in args.items():
        if isinstance(value, Closed):
            array = acl_swiglu.to_device(value.array)
            array.close()
            assert array.closed
            out[name] = array
        elif isinstance(value, OtherContainer):
            out[name] = value.array
        elif name == "group_index" and abi == 1:
            out[name] = value   # revision 1: host values
        elif isinstance(value, np.ndarray):
            out[name] = stack.enter_context(acl_swiglu.to_device(value))
        else:
            out[name] = value
    return out


def _to_oneshot_args(stack: ExitStack, args: dict) -> dict:
    out = {}
    for name, value in args.items():
        if isinstance(value, OtherContainer):
            out[name] = stack.enter_context(acl_swiglu.to_device(value.array))
        else:
            assert not isinstance(value, Closed)
            out[name] = value
    return out


def _call(api: str, args: dict):
    if api == "oneshot":
        return acl_swiglu.swiglu_group_quant_grad(**args)
    if api == "device":
        return acl_swiglu.swiglu_group_quant_grad_device(**args)
    return acl_swiglu.SwigluGroupQuantGradPlan(**args)


@pytest.mark.parametrize("api,abi,case", PARAMS, indirect=["abi"])
def test_argument_rules(api, abi, case):
    case_id, mutate, exc_type, names, _, _ = case
    args = base_args()
    mutate(args)
    with ExitStack() as stack:
        call_args = _to_oneshot_args(stack, args) if api == "oneshot" else _to_device_args(stack, args, abi)
        before = emulator.live_counts()
        with pytest.raises(exc_type) as info:
            result = _call(api, call_args)
            # should not get here; release whatever the call made
            if api == "plan":
                result.close()
            else:
                for r in result:
                    if isinstance(r, acl_swiglu.DeviceArray):
                        r.close()
        after = emulator.live_counts()
    message = str(info.value)
    assert _names_in(message, names), f"{case_id}: message {message!r} does not name {names}"
    if exc_type is acl_swiglu.ArgumentError:
        assert isinstance(info.value, ValueError)
        assert not isinstance(info.value, errors.AclError)
    if exc_type is TypeError:
        assert not isinstance(info.value, errors.AclError)
    # Python-side: nothing was allocated, no handle was made
    assert after == before, f"{case_id}: live handles changed from {before} to {after}"


def test_argument_error_is_a_value_error():
    assert issubclass(acl_swiglu.ArgumentError, ValueError)
    assert issubclass(acl_swiglu.ArgumentError, acl_swiglu.AclSwigluError)
    assert issubclass(acl_swiglu.HandleClosedError, acl_swiglu.AclSwigluError)
    assert not issubclass(acl_swiglu.ArgumentError, errors.AclError)


@pytest.mark.parametrize("abi", [1, 2], indirect=True, ids=["abi1", "abi2"])
def test_valid_base_arguments_work_in_every_api(abi):
    """The base of the error cases is itself valid: every failure above is due to its change."""
    args = base_args()
    want_x, want_w = device_model.swiglu_group_quant_grad_model(**args)
    gx, gw = acl_swiglu.swiglu_group_quant_grad(**args)
    assert np.array_equal(gx, want_x) and np.array_equal(gw, want_w)
    with ExitStack() as stack:
        dev = _to_device_args(stack, args, abi)
        dgx, dgw = acl_swiglu.swiglu_group_quant_grad_device(**dev)
        stack.enter_context(dgx)
        stack.enter_context(dgw)
        assert np.array_equal(dgx.to_numpy(), want_x) and np.array_equal(dgw.to_numpy(), want_w)
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(**dev))
        pgx, pgw = plan()
        assert np.array_equal(pgx.to_numpy(), want_x) and np.array_equal(pgw.to_numpy(), want_w)


# ----------------------------------------------------------------------------- closed streams and bound arrays


def _outcome(fn):
    """Runs fn; returns "ok" (closing what it returned) or "<module>.<class>: <text>" of the error,
    keeping no traceback (a kept frame would keep native handles alive after the test)."""
    try:
        result = fn()
    except Exception as exc:
        return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}", type(exc)
    if isinstance(result, acl_swiglu.SwigluGroupQuantGradPlan):
        try:
            result.close()
        except Exception:
            pass
    elif isinstance(result, tuple):
        for r in result:
            if isinstance(r, acl_swiglu.DeviceArray):
                r.close()
    return "ok", None


HANDLE_CLOSED = f"{acl_swiglu.HandleClosedError.__module__}.{acl_swiglu.HandleClosedError.__qualname__}"


@pytest.mark.parametrize("api", ["device_call", "plan"])   # (an id "device" alone would mark it as a device-only test)
def test_closed_stream_argument_is_a_handle_closed_error(api, monkeypatch):
    """A closed Stream is a closed handle like a closed DeviceArray: HandleClosedError, before
    anything is allocated."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    with ExitStack() as stack:
        d_gy = stack.enter_context(acl_swiglu.to_device(np.ones((4, 8), np.float32)))
        d_x = stack.enter_context(acl_swiglu.to_device(np.ones((4, 16), np.float32)))
        stream = acl_swiglu.Stream()
        stream.close()
        before = emulator.live_counts()
        if api == "device_call":
            text, kind = _outcome(lambda: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, stream=stream))
        else:
            text, kind = _outcome(lambda: acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, stream=stream))
        after = emulator.live_counts()
        stream.release_workspace()   # whatever a wrong path pooled on the dead stream
        gc.collect()
    closed_error = kind is not None and issubclass(kind, acl_swiglu.HandleClosedError)
    assert (closed_error, after == before) == (True, True), f"{text}; live handles {before} -> {after}"


def test_synchronize_closed_stream_is_a_handle_closed_error():
    stream = acl_swiglu.Stream()
    stream.close()
    text, kind = _outcome(stream.synchronize)
    assert kind is not None and issubclass(kind, acl_swiglu.HandleClosedError), text


def test_plan_close_after_its_stream_was_closed_frees_everything(monkeypatch):
    """Closing a plan whose stream is already closed (the stream's close completed its work) must
    not fail half-way and leave the plan's tensors and outputs alive."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    with ExitStack() as stack:
        d_gy = stack.enter_context(acl_swiglu.to_device(np.ones((4, 8), np.float32)))
        d_x = stack.enter_context(acl_swiglu.to_device(np.ones((4, 16), np.float32)))
        baseline = emulator.live_counts()
        stream = acl_swiglu.Stream()
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, stream=stream)
        plan()
        stream.close()
        text, _ = _outcome(plan.close)
        assert plan.closed
        after = emulator.live_counts()
        del plan
        gc.collect()
    assert text == "ok", text
    assert after == baseline, f"plan.close left {after}, expected {baseline}"


@pytest.mark.parametrize("abi", [1, 2], indirect=True, ids=["abi1", "abi2"])
@pytest.mark.parametrize("closed", ["grad_y", "x", "grad_x"])
def test_plan_call_after_a_bound_array_was_closed(abi, closed):
    """A plan keeps using the arrays bound last; once one of them is closed, calling the plan
    without rebinding it is a use after close: HandleClosedError, not a launch on freed memory."""
    arrays = {}
    with ExitStack() as stack:
        arrays["grad_y"] = acl_swiglu.to_device(np.ones((4, 8), np.float32))
        arrays["x"] = acl_swiglu.to_device(np.ones((4, 16), np.float32))
        arrays["grad_x"] = acl_swiglu.DeviceArray.empty((4, 16), np.float32)
        for a in arrays.values():
            stack.callback(a.close)
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(
            arrays["grad_y"], arrays["x"], grad_x=arrays["grad_x"]))
        plan()
        acl_swiglu.default_stream().synchronize()
        arrays[closed].close()
        text, kind = _outcome(plan)
        acl_swiglu.default_stream().synchronize()
    assert kind is not None and issubclass(kind, acl_swiglu.HandleClosedError), text
    assert closed in text


def test_executor_launch_after_an_array_was_closed(monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    with ExitStack() as stack:
        d_gy = stack.enter_context(acl_swiglu.to_device(np.ones((4, 8), np.float32)))
        d_x = acl_swiglu.to_device(np.ones((4, 16), np.float32))
        stack.callback(d_x.close)
        gx = stack.enter_context(acl_swiglu.DeviceArray.empty((4, 16), np.float32))
        executor = stack.enter_context(acl_swiglu.get_workspace_size(d_gy, d_x, grad_x=gx))
        d_x.close()
        text, kind = _outcome(executor.launch)
        acl_swiglu.default_stream().synchronize()
    assert kind is not None and issubclass(kind, acl_swiglu.HandleClosedError), text


def test_non_native_byte_order_input():
    """A big-endian float32 array is float32 data: either it is computed, or the error says
    that the byte order is the problem (not "has dtype float32; it must be float32")."""
    rng = np.random.default_rng(2)
    gy = rng.uniform(-1, 1, (3, 8)).astype(np.float32)
    x = rng.uniform(-3, 3, (3, 16)).astype(np.float32)
    before = emulator.live_counts()
    try:
        grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy.astype(">f4"), x.astype(">f4"))
    except acl_swiglu.ArgumentError as exc:
        message = str(exc)
        assert emulator.live_counts() == before
        assert re.search(r"byte order|endian", message), message
    else:
        want, _ = device_model.swiglu_group_quant_grad_model(gy, x)
        assert np.array_equal(np.asarray(grad_x, np.float32).view(np.uint32), want.view(np.uint32))


# ----------------------------------------------------------------------------- the C API itself

ACL_FLOAT, ACL_FLOAT16, ACL_INT32, ACL_INT64, ACL_BF16 = 0, 1, 3, 9, 27


def _c_api():
    acl_swiglu.runtime.runtime_api()   # aclInit + aclrtSetDevice on this thread
    return _ffi.api()


class CTensors:
    """aclTensor handles (NULL data: phase 1 accepts that) made through the C API, destroyed on exit."""

    def __init__(self, api):
        self.api = api
        self.made = []

    def tensor(self, shape, dtype=ACL_FLOAT):
        dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        handle = self.api.aclCreateTensor(dims, len(shape), dtype, None, 0, 2, dims, len(shape), None)
        self.made.append(handle)
        return handle

    def int_array(self, values):
        arr = (ctypes.c_int64 * max(len(values), 1))(*values)
        handle = self.api.aclCreateIntArray(arr, len(values))
        self.made.append(handle)
        return handle

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for handle in reversed(self.made):
            if isinstance(handle, _ffi.aclIntArray_p):
                self.api.aclDestroyIntArray(handle)
            else:
                self.api.aclDestroyTensor(handle)


def _phase1_raw(api, abi, gy, x, w, yo, group, clamp, gx, gw):
    """Raw phase 1: (status, message); destroys the executor when it succeeds."""
    size = ctypes.c_uint64(12345)
    executor = _ffi.aclOpExecutor_p()
    fn = api.raw.aclnnSwigluGroupQuantGradGetWorkspaceSize   # one prototype: groupIndex is a pointer either way
    status = fn(gy, x, w, yo, group, clamp, gx, gw, ctypes.byref(size), ctypes.byref(executor))
    message = api.get_message()
    message = message.decode() if message else ""
    if status == 0:
        assert executor
        api.aclDestroyAclOpExecutor(executor)
    else:
        assert not executor
    return status, message, size.value


def _phase1_checked(api, abi, gy, x, w, yo, group, clamp, gx, gw):
    size = ctypes.c_uint64()
    executor = _ffi.aclOpExecutor_p()
    fn = api.aclnnSwigluGroupQuantGradGetWorkspaceSize   # one prototype: groupIndex is a pointer either way
    try:
        fn(gy, x, w, yo, group, clamp, gx, gw, ctypes.byref(size), ctypes.byref(executor))
    finally:
        if executor:
            api.aclDestroyAclOpExecutor(executor)


def _std(t, abi, weight=False, group=False, gy_shape=(4, 8), x_shape=(4, 16), gy_dtype=ACL_FLOAT,
         w_shape=(4, 1), w_dtype=ACL_FLOAT, gi_dtype=ACL_INT64, gi_shape=(2,)):
    gy = t.tensor(gy_shape, gy_dtype)
    x = t.tensor(x_shape, gy_dtype)
    gx = t.tensor(x_shape, gy_dtype)
    w = yo = gw = None
    if weight:
        w = t.tensor(w_shape, w_dtype)
        yo = t.tensor(gy_shape, gy_dtype)
        gw = t.tensor(w_shape, ACL_FLOAT)
    gi = None
    if group:
        gi = t.tensor(gi_shape, gi_dtype) if abi == 2 else t.int_array([2, 1])
    return dict(gy=gy, x=x, w=w, yo=yo, group=gi, gx=gx, gw=gw)


# (id, abi, builder(t, abi) -> (args, clamp), code, words the message must contain)
C_CASES = [
    ("clamp-0-rev2", 2, lambda t, a: (_std(t, a), 0.0), 561002, ["clampLimit"]),
    ("clamp-neg2-rev2", 2, lambda t, a: (_std(t, a), -2.0), 561002, ["clampLimit"]),
    # (NaN is off on the emulator's default release, 9.2.0, whose test for "off" is |c + 1| <= 1e-6)
    ("clamp-near-minus-1-rev2", 2, lambda t, a: (_std(t, a), -1.0 - 2.0 ** -19), 561002, ["clampLimit"]),
    ("clamp-neg1-rev1", 1, lambda t, a: (_std(t, a), -1.0), 561002, ["clampLimit"]),
    ("clamp-nan-rev1", 1, lambda t, a: (_std(t, a), math.nan), 561002, ["clampLimit"]),
    ("gradY-int32", 2, lambda t, a: (_std(t, a, gy_dtype=ACL_INT32), -1.0), 161002, ["gradY"]),
    ("gradY-int64-rev1", 1, lambda t, a: (_std(t, a, gy_dtype=ACL_INT64), 0.0), 161002, ["gradY"]),
    ("weight-fp16", 2, lambda t, a: (_std(t, a, weight=True, w_dtype=ACL_FLOAT16), -1.0), 161002, ["weightOptional"]),
    ("groupIndex-int32", 2, lambda t, a: (_std(t, a, group=True, gi_dtype=ACL_INT32), -1.0), 161002,
     ["groupIndexOptional"]),
    ("groupIndex-2d", 2, lambda t, a: (_std(t, a, group=True, gi_shape=(1, 2)), -1.0), 561002, ["groupIndexOptional"]),
    ("gradY-last-not-half", 2, lambda t, a: (_std(t, a, gy_shape=(4, 7)), -1.0), 561002, ["gradY"]),
    ("x-odd", 2, lambda t, a: (_std(t, a, gy_shape=(4, 8), x_shape=(4, 17)), -1.0), 561002, ["x"]),
    ("weight-count", 2, lambda t, a: (_std(t, a, weight=True, w_shape=(5, 1)), -1.0), 561002, ["weightOptional"]),
    ("rank4-rev1", 1, lambda t, a: (_std(t, a, gy_shape=(1, 1, 4, 8), x_shape=(1, 1, 4, 16)), 0.0), 561002, ["gradY"]),
    ("rank9-rev2", 2, lambda t, a: (_std(t, a, gy_shape=(1,) * 8 + (8,), x_shape=(1,) * 8 + (16,)), -1.0), 561002,
     ["gradY"]),
    ("weight-flat-rev1", 1, lambda t, a: (_std(t, a, weight=True, w_shape=(4,)), 0.0), 561002, ["weightOptional"]),
    ("weight-without-yOrigin", 2, lambda t, a: (dict(_std(t, a, weight=True), yo=None), -1.0), 561002,
     ["weightOptional", "yOriginOptional"]),
    ("NULL-gradY", 2, lambda t, a: (dict(_std(t, a), gy=None), -1.0), 161001, ["gradY"]),
    ("NULL-x", 1, lambda t, a: (dict(_std(t, a), x=None), 0.0), 161001, ["x"]),
    ("NULL-gradXOut", 2, lambda t, a: (dict(_std(t, a), gx=None), -1.0), 161001, ["gradXOut"]),
]


@pytest.mark.emulator_only
@pytest.mark.parametrize("case_id,abi,build,code,words", [pytest.param(*c, id=c[0]) for c in C_CASES],
                         indirect=["abi"])
def test_c_api_phase1_status_codes(case_id, abi, build, code, words):
    api = _c_api()
    before = emulator.live_counts()
    with CTensors(api) as t:
        args, clamp = build(t, abi)
        call = (args["gy"], args["x"], args["w"], args["yo"], args["group"], clamp, args["gx"], args["gw"])
        status, message, _ = _phase1_raw(api, abi, *call)
        assert status == code, (status, message)
        # "<api>: <reason> [status N]", naming the parameter as the prototype does
        assert message.startswith(PHASE1), message
        assert f"[status {code}]" in message
        for word in words:
            assert word in message, (word, message)
        # the checked binding raises the code's own class, with the same facts
        with pytest.raises(errors.error_class(code)) as info:
            _phase1_checked(api, abi, *call)
        err = info.value
        assert err.code == code
        assert err.name == errors.STATUS_NAMES[code]
        assert err.api == PHASE1
        for word in words:
            assert word in err.message
        assert err.name in str(err) and str(code) in str(err)
    assert emulator.live_counts() == before


@pytest.mark.emulator_only
def test_c_api_clamp_zero_rev2_is_a_tiling_error(monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    api = _c_api()
    with CTensors(api) as t:
        a = _std(t, 2)
        with pytest.raises(errors.AclnnErrInnerTilingError) as info:
            _phase1_checked(api, 2, a["gy"], a["x"], None, None, None, 0.0, a["gx"], None)
    err = info.value
    assert isinstance(err, errors.AclInternalError) and isinstance(err, errors.AclError)
    assert err.code == 561002 and errors.AclnnErrInnerTilingError.code == 561002
    assert err.name == "ACLNN_ERR_INNER_TILING_ERROR"
    assert err.api == "aclnnSwigluGroupQuantGradGetWorkspaceSize"
    assert "clampLimit" in err.message
    # the message is read once: the thread's text is cleared by reading it
    assert api.get_message() is None


@pytest.mark.emulator_only
@pytest.mark.parametrize("abi,clamp,workspace", [pytest.param(2, -1.0, 16384, id="rev2-off"),
                                                 pytest.param(2, 0.5, 16384, id="rev2-on"),
                                                 pytest.param(1, 0.0, 16384, id="rev1-off")], indirect=["abi"])
def test_c_api_phase1_accepts_the_off_values(abi, clamp, workspace):
    api = _c_api()
    with CTensors(api) as t:
        a = _std(t, abi, weight=True, group=True)
        status, message, size = _phase1_raw(api, abi, a["gy"], a["x"], a["w"], a["yo"], a["group"], clamp, a["gx"],
                                            a["gw"])
        assert status == 0, message
        assert size == workspace


@pytest.mark.emulator_only
@pytest.mark.parametrize("abi", [1, 2], indirect=True)
def test_c_api_phase1_refuses_a_clamp_that_vanishes_in_fp32(abi):
    """One clamp rule: a limit that is on must be > 0 in fp32, so a positive double that rounds to
    0 is refused (it is neither "off" nor a limit)."""
    api = _c_api()
    with CTensors(api) as t:
        a = _std(t, abi, weight=True, group=True)
        status, message, _ = _phase1_raw(api, abi, a["gy"], a["x"], a["w"], a["yo"], a["group"], 1e-50, a["gx"],
                                         a["gw"])
        assert status == 561002
        assert "clampLimit" in message and "in fp32" in message


@pytest.mark.emulator_only
def test_c_api_phase2_null_and_dead_executor(monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    api = _c_api()
    status = api.raw.aclnnSwigluGroupQuantGrad(None, 0, None, None)
    assert status == 161001
    message = api.get_message().decode()
    assert message.startswith(PHASE2) and "[status 161001]" in message
    with pytest.raises(errors.AclnnErrParamNullptr) as info:
        api.aclnnSwigluGroupQuantGrad(None, 0, None, None)
    assert info.value.api == PHASE2
    # a destroyed executor
    with CTensors(api) as t:
        a = _std(t, 2)
        size = ctypes.c_uint64()
        executor = _ffi.aclOpExecutor_p()
        api.aclnnSwigluGroupQuantGradGetWorkspaceSize(a["gy"], a["x"], None, None, None, -1.0, a["gx"], None,
                                                      ctypes.byref(size), ctypes.byref(executor))
        api.aclDestroyAclOpExecutor(executor)
        with pytest.raises(errors.AclnnErrParamInvalid) as info:
            api.aclnnSwigluGroupQuantGrad(None, 0, executor, None)
        assert "destroyed" in info.value.message


@pytest.mark.emulator_only
def test_emulator_error_through_the_device_api(monkeypatch):
    """An error Python does not check (an output overlapping an input) comes from phase 1 with
    the emulator's code and text, and leaves nothing behind."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    gy = np.ones((4, 8), np.float32)
    x = np.ones((4, 16), np.float32)
    with ExitStack() as stack:
        d_gy = stack.enter_context(acl_swiglu.to_device(gy))
        d_x = stack.enter_context(acl_swiglu.to_device(x))
        in_place = stack.enter_context(acl_swiglu.DeviceArray.wrap(d_x.ptr, x.shape, np.float32))
        with pytest.raises(errors.AclnnErrParamInvalid) as info:
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=in_place)
        err = info.value
        assert err.code == 161002 and err.api == PHASE1
        assert "gradXOut" in err.message and "overlaps" in err.message
        assert emulator.live_counts()["executor"] == 0


# ----------------------------------------------------------------------------- exception classes


@pytest.mark.parametrize("code,cls_name,family", [
    (161001, "AclnnErrParamNullptr", errors.AclParameterError),
    (161002, "AclnnErrParamInvalid", errors.AclParameterError),
    (100002, "AclErrorRepeatInitialize", errors.AclParameterError),
    (107002, "AclErrorRtContextNull", errors.AclParameterError),
    (200005, "AclErrorInvalidResourceHandle", errors.AclResourceError),
    (207001, "AclErrorRtMemoryAllocation", errors.AclResourceError),
    (207018, "AclErrorRtDeviceOom", errors.AclResourceError),
    (361001, "AclnnErrRuntimeError", errors.AclRuntimeFailure),
    (500000, "AclErrorInternalError", errors.AclInternalError),
    (507015, "AclErrorRtAicoreException", errors.AclInternalError),
    (561002, "AclnnErrInnerTilingError", errors.AclInternalError),
    (561103, "AclnnErrInnerNullptr", errors.AclInternalError),
])
def test_error_classes(code, cls_name, family):
    cls = errors.error_class(code)
    assert cls is getattr(errors, cls_name)
    assert issubclass(cls, family) and issubclass(cls, errors.AclError)
    assert issubclass(cls, acl_swiglu.AclSwigluError) and issubclass(cls, RuntimeError)
    assert cls.code == code and cls.name == errors.STATUS_NAMES[code]
    err = cls(code, "someApi", "someApi: why [status %d]" % code)
    assert err.code == code and err.api == "someApi" and err.message.startswith("someApi: why")
    assert errors.STATUS_NAMES[code] in str(err) and str(code) in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls
    assert (again.code, again.name, again.api, again.message, str(again)) == \
        (err.code, err.name, err.api, err.message, str(err))


@pytest.mark.parametrize("code,family", [
    (123456, errors.AclParameterError),
    (299999, errors.AclResourceError),
    (300001, errors.AclRuntimeFailure),
    (599999, errors.AclInternalError),
    (999999, errors.AclError),
    (42, errors.AclError),
])
def test_unknown_codes_map_to_their_family(code, family):
    cls = errors.error_class(code)
    assert cls is family
    err = cls(code, "aclSomething")
    assert err.name == f"UNKNOWN_{code}" and err.message == ""
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is family and again.code == code and str(again) == str(err)


def test_package_exceptions_pickle():
    for exc in (acl_swiglu.ArgumentError("grad_y is bad"), acl_swiglu.HandleClosedError("x is closed"),
                acl_swiglu.ConfigurationError("ACL_SWIGLU_ABI=3")):
        again = pickle.loads(pickle.dumps(exc))
        assert type(again) is type(exc) and str(again) == str(exc)


def test_bad_abi_variable_is_a_configuration_error(monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "3")
    before = emulator.live_counts()
    with pytest.raises(acl_swiglu.ConfigurationError, match="ACL_SWIGLU_ABI"):
        acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), np.float32), np.ones((2, 8), np.float32))
    assert emulator.live_counts() == before


# ----------------------------------------------------------------------------- injected faults

FAULTS = [
    ("aclrtMalloc:2:207001", 207001, "AclErrorRtMemoryAllocation", 2),   # the workspace (after the call's arena)
    ("aclrtMalloc:1:207018", 207018, "AclErrorRtDeviceOom", 2),
    ("aclrtCreateStream:1:207001", 207001, "AclErrorRtMemoryAllocation", 2),
    ("aclrtMemcpy:3:507000", 507000, "AclErrorRtInternalError", 2),
    ("aclCreateTensor:3:161002", 161002, "AclnnErrParamInvalid", 2),
    ("aclCreateIntArray:1:561103", 561103, "AclnnErrInnerNullptr", 1),
    ("aclnnSwigluGroupQuantGradGetWorkspaceSize:1:561002", 561002, "AclnnErrInnerTilingError", 2),
    ("aclnnSwigluGroupQuantGrad:1:507015", 507015, "AclErrorRtAicoreException", 2),
    ("aclrtSynchronizeStream:1:507015", 507015, "AclErrorRtAicoreException", 1),
    ("aclrtMemcpy:6:507000", 507000, "AclErrorRtInternalError", 2),   # copying grad_x back (after 5 inputs)
]


@pytest.mark.emulator_only
@pytest.mark.parametrize("plan,code,cls_name,abi", [pytest.param(*f, id=f[0]) for f in FAULTS], indirect=["abi"])
def test_injected_fault_in_one_shot_call(plan, code, cls_name, abi):
    rng = np.random.default_rng(4)
    gy = rng.uniform(-1, 1, (6, 16)).astype(np.float32)
    x = rng.uniform(-3, 3, (6, 32)).astype(np.float32)
    w = np.full((6, 1), 0.75, np.float32)
    yo = rng.uniform(-1, 1, (6, 16)).astype(np.float32)
    gi = np.array([4], np.int64)
    acl_swiglu.release_cached()   # the call makes its stream and workspace inside the block
    api_name = plan.split(":")[0]
    nth = plan.split(":")[1]
    with emulator.inject_faults(plan):
        with pytest.raises(errors.AclError) as info:
            acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, gi, 2.0)
        assert emulator.faults_injected() == 1
    err = info.value
    assert type(err) is getattr(errors, cls_name)
    assert err.code == code
    assert err.name == errors.STATUS_NAMES[code]
    assert err.api == api_name
    # the emulator's own text: "<api>: injected fault (call N of <api>, ...) [status code]"
    assert "injected fault" in err.message and f"call {nth} of {api_name}" in err.message
    assert f"[status {code}]" in err.message
    counts = emulator.live_counts()
    assert counts["tensor"] == 0 and counts["executor"] == 0 and counts["int_array"] == 0, counts
    acl_swiglu.release_cached()
    assert all(v == 0 for v in emulator.live_counts().values()), emulator.live_counts()
    # the next call works and gives the exact bits
    gx, gw = acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, gi, 2.0)
    want_x, want_w = device_model.swiglu_group_quant_grad_model(gy, x, w, yo, gi, 2.0)
    assert np.array_equal(gx.view(np.uint32), want_x.view(np.uint32))
    assert np.array_equal(gw.view(np.uint32), want_w.view(np.uint32))


@pytest.mark.emulator_only
def test_injected_fault_in_plan_call_then_recovery(monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    gy = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    x = np.linspace(-2, 2, 64, dtype=np.float32).reshape(4, 16)
    want = device_model.swiglu_group_quant_grad_model(gy, x)[0]
    with ExitStack() as stack:
        d_gy = stack.enter_context(acl_swiglu.to_device(gy))
        d_x = stack.enter_context(acl_swiglu.to_device(x))
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x))
        with emulator.inject_faults("aclnnSwigluGroupQuantGrad:1:507015"):
            with pytest.raises(errors.AclErrorRtAicoreException) as info:
                plan()
        assert info.value.api == PHASE2
        gx, _ = plan()   # a repeatable executor survives a failed launch
        assert np.array_equal(gx.to_numpy(), want)


@pytest.mark.emulator_only
def test_inject_faults_rejects_a_bad_plan():
    with pytest.raises(errors.ArgumentError, match="inject_faults: faults entry 0 'aclrtMalloc:notanumber'"):
        with emulator.inject_faults("aclrtMalloc:notanumber"):
            pass


# ----------------------------------------------------------------------------- the status table and the error text


def _defined_statuses():
    """Every status macro the emulator's headers define: {code: name}."""
    root = os.path.join(os.path.dirname(__file__), "..", "native", "include")
    found = {}
    for header in ("acl/acl_base.h", "aclnn/acl_meta.h"):
        with open(os.path.join(root, header)) as handle:
            for name, code in re.findall(r"#define\s+(ACL_ERROR_\w+|ACLNN_ERR_\w+)\s+(\d+)", handle.read()):
                found[int(code)] = name
    return found


def test_every_status_the_emulator_can_return_has_its_name_and_class():
    defined = _defined_statuses()
    assert defined[107003] == "ACL_ERROR_RT_STREAM_CONTEXT"
    for code, name in defined.items():
        assert errors.STATUS_NAMES.get(code) == name, (code, name)
        assert errors.error_class(code).name == name
    assert errors.AclErrorRtStreamContext.code == 107003
    assert issubclass(errors.AclErrorRtStreamContext, errors.AclParameterError)


@pytest.mark.emulator_only
def test_an_ignored_cleanup_failure_leaves_no_text_for_the_next_error():
    from acl_swiglu.tensor import AclTensor

    api = _ffi.api()
    _ffi.drop_message(api.get_message)   # start from a clean slate
    with acl_swiglu.to_device(np.ones((2, 4), np.float32)) as array:
        tensor = AclTensor(array)
        handle = tensor._as_parameter_
        with emulator.inject_faults("aclDestroyTensor:1:507000,aclrtMalloc:1:207001"):
            tensor.close()   # the free fails: nothing can act on it, and its text is dropped
            with pytest.raises(errors.AclErrorRtMemoryAllocation) as info:
                acl_swiglu.DeviceBuffer(64)   # an unrelated failure
            assert emulator.faults_injected() == 2
        assert api.raw.aclDestroyTensor(handle) == 0   # (the failed free left it alive)
    message = info.value.message
    assert "aclrtMalloc" in message and "injected fault" in message
    assert "aclDestroyTensor" not in message, message
    assert api.get_message() is None   # read exactly once
