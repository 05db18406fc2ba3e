"""Plans launch through the small C helper (libaclswiglu_hotpath.so) when it is installed, and
through two ctypes calls otherwise: both give the same bits and report failures the same way."""

import ml_dtypes
import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _ffi, _plan, _scratch, emulator, errors

import device_model


@pytest.fixture(params=["helper", "python"])
def launch_path(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(_plan, "_hotpath_function", [None])
    else:
        assert _plan._hotpath() is not None, "the installed package has no libaclswiglu_hotpath.so"
    return request.param


def _inputs():
    rng = np.random.default_rng(11)
    gy = rng.standard_normal((6, 24)).astype(np.float32)
    x = rng.standard_normal((6, 48)).astype(np.float32)
    return gy, x


def test_plan_bits_on_both_paths(launch_path):
    gy, x = _inputs()
    want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.5)[0]
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, stream=stream) as plan:
        assert (plan._hot_call is not None) == (launch_path == "helper")
        grad_x, _ = plan(synchronize=True)
        assert grad_x.pending is None   # waited already: nothing left to wait for
        assert np.array_equal(grad_x.to_numpy(sync=False).view(np.uint32), want.view(np.uint32))
        grad_x, _ = plan()
        assert grad_x.pending is stream
        assert np.array_equal(grad_x.to_numpy().view(np.uint32), want.view(np.uint32))


@pytest.mark.emulator_only
@pytest.mark.parametrize("fault,api,code", [
    ("aclnnSwigluGroupQuantGrad:1:507015", "aclnnSwigluGroupQuantGrad", 507015),
    ("aclrtSynchronizeStream:1:507015", "aclrtSynchronizeStream", 507015),
])
def test_failures_name_the_failing_call(launch_path, fault, api, code):
    gy, x = _inputs()
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, stream=stream) as plan:
        with emulator.inject_faults(fault):
            with pytest.raises(errors.AclError) as info:
                plan(synchronize=True)
        assert info.value.api == api and info.value.code == code
        assert "injected fault" in info.value.message
        grad_x, _ = plan(synchronize=True)   # and the plan still works
        want = device_model.swiglu_group_quant_grad_model(gy, x)[0]
        assert np.array_equal(grad_x.to_numpy(sync=False).view(np.uint32), want.view(np.uint32))


@pytest.fixture(params=["helper", "python"])
def arena_path(request, monkeypatch):
    """One-shot calls copy and make tensors through the C helper's arena functions, or one
    ctypes call per step without them."""
    monkeypatch.setattr(_scratch, "_arena_helpers", {})
    if request.param == "python":
        monkeypatch.setattr(_scratch, "_helper", [None])
    else:
        assert _scratch.helper_library() is not None, "the installed package has no libaclswiglu_hotpath.so"
    return request.param


def _weighted_inputs(dtype):
    rng = np.random.default_rng(12)
    gy = rng.standard_normal((5, 2, 8)).astype(np.float32).astype(dtype)
    x = rng.standard_normal((5, 2, 16)).astype(np.float32).astype(dtype)
    weight = (rng.random((5, 2, 1)) + 0.5).astype(np.float32)
    y_origin = rng.standard_normal((5, 2, 8)).astype(np.float32).astype(dtype)
    return gy, x, weight, y_origin


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_one_shot_bits_on_both_paths(arena_path, dtype):
    gy, x, weight, y_origin = _weighted_inputs(dtype)
    groups = np.array([4, 3], np.int64)
    want_x, want_w = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, groups, 1.5)
    readonly = x.copy()
    readonly.flags.writeable = False   # (its address comes another way)
    strided = np.repeat(gy, 2, axis=-1)[..., ::2]            # positive strides: staged as they are
    flipped = np.ascontiguousarray(weight[::-1])[::-1]      # negative strides: copied in C order
    for _ in range(2):   # the second call uses the layout cached by the first
        grad_x, grad_w = acl_swiglu.swiglu_group_quant_grad(strided, readonly, flipped, y_origin, groups, 1.5)
        assert (_scratch.arena_helper(_ffi.api(), "aclnnSwigluGroupQuantGrad") is not None) == (arena_path == "helper")
        assert np.array_equal(grad_x.view(np.uint8), want_x.view(np.uint8))
        assert np.array_equal(grad_w.view(np.uint32), want_w.view(np.uint32))
    empty_x, _ = acl_swiglu.swiglu_group_quant_grad(gy[:0], x[:0])
    assert empty_x.shape == (0, 2, 16)


@pytest.mark.emulator_only
@pytest.mark.parametrize("fault,api,code", [
    ("aclrtMemcpy:2:507000", "aclrtMemcpy", 507000),       # the second copy in
    ("aclCreateTensor:3:561103", "aclCreateTensor", 561103),
    ("aclrtMemcpy:5:507000", "aclrtMemcpy", 507000),       # the copy back of grad_x
])
def test_one_shot_failures_name_the_failing_call(arena_path, fault, api, code):
    gy, x, weight, y_origin = _weighted_inputs(np.float32)
    acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)   # makes the thread's stream
    before = emulator.live_counts()
    with emulator.inject_faults(fault):
        with pytest.raises(errors.AclError) as info:
            acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)
    assert info.value.api == api and info.value.code == code
    assert emulator.live_counts() == before   # everything the call made was released
    grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)
    want = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, None, 1.5)[0]
    assert np.array_equal(grad_x.view(np.uint32), want.view(np.uint32))
