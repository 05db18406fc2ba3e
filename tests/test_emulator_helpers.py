"""acl_swiglu.emulator as a user meets it: its public names, and inject_faults() refusing a bad
plan by naming its own argument and the rule (not the environment variable that can set a plan
too), and saying who planned a fault when it fires."""

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator


def test_the_module_declares_its_public_names():
    assert sorted(emulator.__all__) == sorted(
        ["KINDS", "KERNEL_VARIANTS", "FaultPlan", "NotEmulatorError", "faults_injected", "inject_faults",
         "is_active", "live_counts", "live_handles", "set_kernel_variant", "set_threads", "version"])
    assert all(hasattr(emulator, name) for name in emulator.__all__)
    namespace = {}
    exec("from acl_swiglu.emulator import *", namespace)
    assert "contextlib" not in namespace and "_ffi" not in namespace and "inject_faults" in namespace


BAD_PLANS = [
    ("aclrtMalloc:notanumber", "faults entry 0 'aclrtMalloc:notanumber' must be name:N:code"),
    ("aclrtMalloc:1:x", "faults entry 0 'aclrtMalloc:1:x': N and code must be whole numbers"),
    ("aclrtMalloc:1:207001,aclrtFree:0:1", "faults entry 1 'aclrtFree:0:1': N .* must be a whole number >= 1"),
    ("aclrtMalloc:1:0", "the status code must be a non-zero whole number"),
    (":1:207001", "the API name must be a non-empty string"),
    ([("aclrtMalloc", 1)], r"faults\[0\] must be a \(name, N, code\) tuple"),
    ([("aclrtMalloc", 1, 207001), ("x y", 1, 1)], r"faults\[1\]: the API name must be .* got 'x y'"),
    ([("aclrtMalloc", -1, 207001)], r"faults\[0\]: N .* got -1"),
    ([("aclrtMalloc", True, 207001)], r"faults\[0\]: N .* got True"),
    ([("aclrtMalloc", 1, 2**31)], r"faults\[0\]: the status code .* int32"),
    ([("a" * 64, 1, 1)], "longer than 63 bytes"),
    ([("aclrtMalloc", 1, 207001)] * 33, "faults has 33 entries; the emulator holds at most 32"),
]


@pytest.mark.emulator_only
@pytest.mark.parametrize("faults,message", BAD_PLANS, ids=[m[:40] for _, m in BAD_PLANS])
def test_a_bad_plan_is_refused_naming_the_argument(faults, message):
    with pytest.raises(acl_swiglu.ArgumentError, match="^inject_faults: .*" + message) as error:
        with emulator.inject_faults(faults):
            pass
    assert "ACL_EMU_FAIL" not in str(error.value)
    assert emulator.faults_injected() == 0


@pytest.mark.emulator_only
def test_a_plan_that_is_not_text_or_entries_is_a_type_error():
    with pytest.raises(TypeError, match="faults must be a 'name:N:code"):
        with emulator.inject_faults(42):
            pass


@pytest.mark.emulator_only
@pytest.mark.parametrize("faults", ["aclrtMalloc:1:207001", " aclrtMalloc:1:207001 , ", [("aclrtMalloc", 1, 207001)],
                                    (("aclrtMalloc", 1, 207001),)])
def test_a_fired_fault_says_it_was_planned_by_the_function(faults):
    x = np.zeros((2, 8), np.float32)
    with emulator.inject_faults(faults):
        with pytest.raises(acl_swiglu.AclError) as error:
            acl_swiglu.swiglu_group_quant_grad(np.zeros((2, 4), np.float32), x)
    assert error.value.code == 207001 and error.value.api == "aclrtMalloc"
    assert "injected fault (call 1 of aclrtMalloc, planned by aclEmuSetFaults)" in error.value.message
    assert emulator.inject_faults.last_injected == 1
