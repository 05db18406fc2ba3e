"""Plans launch through the small C helper (libaclswiglu_hotpath.so) when it is installed, and
through two ctypes calls otherwise: both give the same bits and report failures the same way."""

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _plan, emulator, errors

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
