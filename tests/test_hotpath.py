"""Plans launch through the small C helper (libaclswiglu_hotpath.so) when it is installed, and
through two ctypes calls otherwise: both give the same bits and report failures the same way."""

import json
import os
import subprocess
import sys

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


@pytest.mark.emulator_only
@pytest.mark.parametrize("fault,api,code", [
    ("aclrtMalloc:1:207001", "aclrtMalloc", 207001),                 # the arena
    ("aclnnSwigluGroupQuantGrad:1:561103", "aclnnSwigluGroupQuantGrad", 561103),   # phase 2
    ("aclrtSynchronizeStream:1:507035", "aclrtSynchronizeStream", 507035),
    ("aclrtMemcpy:6:507000", "aclrtMemcpy", 507000),                 # the copy back of grad_weight
])
def test_one_shot_failures_after_the_copies_in(arena_path, fault, api, code):
    """Every step of the call's device side: the error names the step that failed first and
    carries its message alone, and everything the call made is released."""
    gy, x, weight, y_origin = _weighted_inputs(np.float32)
    acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)   # the layout and the stream
    before = emulator.live_counts()
    with emulator.inject_faults(fault):
        with pytest.raises(errors.AclError) as info:
            acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)
    assert info.value.api == api and info.value.code == code
    assert info.value.message.count("injected fault") == 1, info.value.message
    assert emulator.live_counts() == before
    # Nothing of that failure lingers in the next error of this thread.
    with pytest.raises(errors.ArgumentError):
        acl_swiglu.swiglu_group_quant_grad(gy, x[:, :1], weight, y_origin, None, 1.5)
    with emulator.inject_faults("aclrtMemcpy:1:507000"):
        with pytest.raises(errors.AclError) as later:
            acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)
    assert later.value.api == "aclrtMemcpy" and later.value.message.count("injected fault") == 1, later.value.message
    grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, None, 1.5)
    want = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, None, 1.5)[0]
    assert np.array_equal(grad_x.view(np.uint32), want.view(np.uint32))


_RELEASE_FAILURES = r"""
import json, sys
import numpy as np
import acl_swiglu
from acl_swiglu import emulator, errors

rng = np.random.default_rng(3)
gy = rng.standard_normal((4, 8)).astype(np.float32)
x = rng.standard_normal((4, 16)).astype(np.float32)
acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
report = {}
for name, faults in (("destroy", "aclDestroyTensor:2:161001"), ("free", "aclrtFree:1:507000"),
                     ("launch-then-destroy", "aclnnSwigluGroupQuantGrad:1:561103,aclDestroyTensor:1:161001")):
    with emulator.inject_faults(faults):
        try:
            acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
            first = None
        except errors.AclError as error:
            first = [error.api, error.code, error.message]
    with emulator.inject_faults("aclrtMemcpy:1:507000"):
        try:
            acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
            later = None
        except errors.AclError as error:
            later = [error.api, error.message]
    report[name] = {"first": first, "later": later}
json.dump(report, sys.stdout)
"""


@pytest.mark.emulator_only
def test_one_shot_release_failures_on_the_helper_path(tmp_path):
    """A failed destroy or free in the release (whose handle the fault leaves live, hence a child
    process): the call fails naming it; a failed launch stays the error when a destroy fails
    after it, with its message only; no text of either shows up in the thread's next error."""
    assert _scratch.helper_library() is not None, "the installed package has no libaclswiglu_hotpath.so"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_FAULT")}
    proc = subprocess.run([sys.executable, "-c", _RELEASE_FAILURES], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)   # (not the source tree: the installed package)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["destroy"]["first"][:2] == ["aclDestroyTensor", 161001]
    assert report["free"]["first"][:2] == ["aclrtFree", 507000]
    launch = report["launch-then-destroy"]["first"]
    assert launch[:2] == ["aclnnSwigluGroupQuantGrad", 561103]
    assert "aclDestroyTensor" not in launch[2], launch[2]
    for name, entry in report.items():
        assert entry["first"][2].count("injected fault") == 1, (name, entry["first"][2])
        assert entry["later"][0] == "aclrtMemcpy", (name, entry["later"])
        assert entry["later"][1].count("injected fault") == 1, (name, entry["later"][1])


def test_one_shot_workspace_comes_from_the_arena_after_the_first_call():
    """On the C helper's path, the first call of a layout takes its workspace from the thread
    stream's pool and remembers the size; later calls of that layout hold it in their own arena."""
    assert _scratch.helper_library() is not None, "the installed package has no libaclswiglu_hotpath.so"
    gy, x = _inputs()
    gy, x = gy[:5], x[:5]   # a layout no other test used
    acl_swiglu.release_cached()
    before = emulator.live_counts()["allocation"]
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.75)
    assert emulator.live_counts()["allocation"] == before + 1   # the thread stream's pooled workspace
    acl_swiglu.release_cached()
    for _ in range(3):
        grad_x, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.75)
        assert emulator.live_counts()["allocation"] == before
    want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=0.75)[0]
    assert np.array_equal(grad_x.view(np.uint32), want.view(np.uint32))


def _device_inputs():
    gy, x = _inputs()
    return acl_swiglu.to_device(gy), acl_swiglu.to_device(x), gy, x


def test_device_call_takes_the_lean_path_once_the_layout_is_known(monkeypatch):
    """The first call of a layout (or one that allocates its outputs) goes the general way; a
    repeat with every output given goes the lean way, with the same bits."""
    from acl_swiglu import _aclnn
    general = []
    real = _aclnn._general_device_call
    monkeypatch.setattr(_aclnn, "_general_device_call", lambda *a: general.append(1) or real(*a))
    d_gy, d_x, gy, x = _device_inputs()
    want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.25)[0]
    with acl_swiglu.Stream() as stream, d_gy, d_x, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for round_ in range(3):
            grad_x, grad_w = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.25, grad_x=out,
                                                                     stream=stream)
            assert grad_x is out and grad_w is None
            assert np.array_equal(grad_x.to_numpy().view(np.uint32), want.view(np.uint32))
            assert len(general) == 1, round_   # only the first call validated
        made, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.25, stream=stream)
        with made:
            assert len(general) == 2   # an output to allocate: the general path
            assert np.array_equal(made.to_numpy().view(np.uint32), want.view(np.uint32))
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        assert len(general) == 3   # another clamp: another layout to validate


def test_device_call_lean_path_refuses_what_was_closed():
    d_gy, d_x, gy, x = _device_inputs()
    with acl_swiglu.Stream() as stream, d_x, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for _ in range(2):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
        d_gy.close()
        with pytest.raises(errors.HandleClosedError, match="grad_y is a closed DeviceArray"):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
        other = acl_swiglu.Stream()
        other.close()
        with pytest.raises(errors.HandleClosedError, match="stream"):
            acl_swiglu.swiglu_group_quant_grad_device(acl_swiglu.to_device(gy), d_x, grad_x=out, stream=other)


def test_device_call_lean_path_without_a_pooled_workspace_and_across_streams():
    """With the stream's workspace pool emptied between calls, and with an input written on
    another stream just before, the lean path still gives the model's bits."""
    d_gy, d_x, gy, x = _device_inputs()
    first = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=2.0)[0]
    second = device_model.swiglu_group_quant_grad_model(gy, first, clamp_limit=2.0)[0]
    with acl_swiglu.Stream() as writer, acl_swiglu.Stream() as reader, d_gy, d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as middle, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for _ in range(3):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=2.0, grad_x=middle, stream=writer)
            writer.release_workspace()
            reader.release_workspace()
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, middle, clamp_limit=2.0, grad_x=out, stream=reader)
            assert middle.pending is None   # waited for: written on the other stream
            assert np.array_equal(out.to_numpy().view(np.uint32), second.view(np.uint32))
