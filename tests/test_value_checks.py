"""A check on values is never skipped because the layout was seen before: with the loaded
release patched to one known to hang the device on some group_index values (9.1.0: 0 < trunc <
min(T, cores)), a safe call of a layout is followed by a hang-inducing group_index of the same
layout, through every way of making the call. Each must be refused (ReleaseLimitationError)
before anything runs, and leave the objects it was given as they were."""

from __future__ import annotations

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator
from acl_swiglu._releases import ReleaseLimitationError

from swiglu_cases import case, same_bits, want

ROWS = 8   # T = 8 < 56 cores: any 0 < trunc < 8 hangs 9.1.0
SAFE = ([0], [8], [5, 5])
HANG = ([3], [2, 5], [1, 2**32])


def _case():
    gy, x = case(ROWS, 4, seed=71)
    return gy, x


def _refused(call):
    with pytest.raises(ReleaseLimitationError) as info:
        call()
    assert "CANN 9.1.0" in str(info.value) and "hangs the device" in str(info.value), str(info.value)


@pytest.mark.parametrize("abi", [1, 2], indirect=True)
def test_one_shot_calls(cann_9_1, abi):
    gy, x = _case()
    for safe in SAFE:
        acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array(safe, np.int64))
        for counts in HANG:
            if len(counts) != len(safe):
                continue   # (the same layout: the same number of groups)
            before = emulator.live_counts()
            _refused(lambda: acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array(counts, np.int64)))
            assert emulator.live_counts() == before
            acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=np.array(safe, np.int64))   # and the safe again


@pytest.mark.parametrize("abi", [1], indirect=True)
def test_device_calls_with_host_counts(cann_9_1, abi):
    gy, x = _case()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for _ in range(2):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=[0], grad_x=out)
        assert not out.to_numpy().any()
        for counts in ([3], np.array([3], np.int64), (3,)):
            _refused(lambda: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=counts, grad_x=out))
        _refused(lambda: acl_swiglu.get_workspace_size(d_gy, d_x, group_index=[3], grad_x=out))
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=[8], grad_x=out)
        assert same_bits(out.to_numpy(), want(gy, x, None))


@pytest.mark.parametrize("abi", [2], indirect=True)
def test_device_calls_with_device_counts(cann_9_1, abi):
    """The counts live in device memory: read back on every call, after their writer."""
    gy, x = _case()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(np.array([0], np.int64)) as safe, acl_swiglu.to_device(np.array([3], np.int64)) as hang, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for _ in range(2):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=safe, grad_x=out)
        _refused(lambda: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=hang, grad_x=out))
        safe.copy_from(np.array([3], np.int64))   # the array the safe calls used, rewritten
        _refused(lambda: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=safe, grad_x=out))
        _refused(lambda: acl_swiglu.get_workspace_size(d_gy, d_x, group_index=safe, grad_x=out))
        safe.copy_from(np.array([8], np.int64))
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, group_index=safe, grad_x=out)
        assert same_bits(out.to_numpy(), want(gy, x, None))


@pytest.mark.parametrize("abi", [2], indirect=True)
def test_plan_calls_with_device_counts(cann_9_1, abi):
    gy, x = _case()
    gy2, _ = case(ROWS, 4, seed=72)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(gy2) as d_gy2, \
            acl_swiglu.to_device(x) as d_x, acl_swiglu.to_device(np.array([8], np.int64)) as counts, \
            acl_swiglu.to_device(np.array([3], np.int64)) as hang, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, group_index=counts, stream=stream) as plan:
        for _ in range(2):
            plan(synchronize=True)   # (the second launches without a check of its bindings)
        _refused(lambda: plan(group_index=hang))   # rebinding
        _refused(lambda: plan(grad_y=d_gy2, group_index=hang))
        assert same_bits(plan(synchronize=True)[0].to_numpy(), want(gy, x, None))   # as it was
        counts.copy_from(np.array([3], np.int64))   # what the plan is bound to, rewritten
        _refused(plan)
        _refused(lambda: plan(d_gy2))   # rebinding something else
        counts.copy_from(np.array([8], np.int64))
        assert same_bits(plan(synchronize=True)[0].to_numpy(), want(gy, x, None))


@pytest.mark.parametrize("abi", [1], indirect=True)
def test_plan_calls_with_host_counts(cann_9_1, abi):
    gy, x = _case()
    gy2, _ = case(ROWS, 4, seed=73)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(gy2) as d_gy2, \
            acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, group_index=[8], stream=stream) as plan:
        for _ in range(2):
            plan(synchronize=True)
        before = emulator.live_counts()
        for counts in ([3], np.array([3], np.int64), [2, 5]):
            _refused(lambda: plan(group_index=counts))
            _refused(lambda: plan(d_gy2, group_index=counts))
        assert emulator.live_counts() == before   # (no executor made for the refused counts)
        assert same_bits(plan(synchronize=True)[0].to_numpy(), want(gy, x, None))   # old grad_y, old counts
        plan(group_index=[0], synchronize=True)
        assert not plan.grad_x.to_numpy().any()
        _refused(lambda: plan(group_index=[3]))
        assert not plan(synchronize=True)[0].to_numpy().any()   # still [0]
