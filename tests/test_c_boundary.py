"""What crosses into C is checked first: integers (ctypes would truncate them silently), the
dtypes of device arrays, and the device and ACL state another framework may have set up."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _ffi, runtime

F32 = np.dtype(np.float32)


@pytest.mark.parametrize("call,names", [
    (lambda: acl_swiglu.Stream.from_handle(2**64), "stream handle"),
    (lambda: acl_swiglu.Stream.from_handle(-1), "stream handle"),
    (lambda: acl_swiglu.Stream.from_handle(1.0), "stream handle"),
    (lambda: acl_swiglu.DeviceArray.wrap(2**64, (4,), F32), "ptr"),
    (lambda: acl_swiglu.DeviceBuffer.wrap(2**64, 16), "ptr"),
    (lambda: acl_swiglu.DeviceBuffer.wrap(4096, 2**64), "nbytes"),
    (lambda: acl_swiglu.DeviceArray.wrap(4096, (2, 2), F32, strides=(2.0, 1)), "strides"),
    (lambda: acl_swiglu.DeviceArray.wrap(4096, (2, 2), F32, strides=(2**63, 1)), "strides"),
    (lambda: acl_swiglu.DeviceArray.wrap(4096, (2, 2), F32, offset=1.0), "offset"),
    (lambda: acl_swiglu.DeviceArray.wrap(4096, (2, 2), F32, offset=2**63), "offset"),
    (lambda: acl_swiglu.set_device(2**32 + 3), "device_id"),
    (lambda: acl_swiglu.set_device(2**31), "device_id"),
    (lambda: acl_swiglu.set_device(1.0), "device_id"),
])
def test_integers_for_c_are_range_checked(call, names):
    with pytest.raises(acl_swiglu.ArgumentError) as info:
        call()
    assert names in str(info.value)


def test_a_device_id_from_the_environment_beyond_int32_is_a_configuration_error(tmp_path):
    # (a fresh process: the variable counts only until set_device() chooses a device)
    script = tmp_path / "first_use.py"
    script.write_text(textwrap.dedent(r"""
        import threading
        import numpy as np
        import acl_swiglu
        box = {}

        def first_use():   # a new thread binds its device on its first call
            try:
                acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), np.float32), np.ones((2, 8), np.float32))
            except Exception as exc:
                box["error"] = exc

        thread = threading.Thread(target=first_use)
        thread.start()
        thread.join(60)
        print(type(box.get("error")).__name__, box.get("error"))
    """))
    env = dict(os.environ, **{runtime.ENV_DEVICE_ID: "4294967296"})
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("ConfigurationError "), proc.stdout
    assert runtime.ENV_DEVICE_ID in proc.stdout


@pytest.mark.parametrize("dtype", [object, "V0", "S0", "U3", [("a", "i4")]])
@pytest.mark.parametrize("make", ["empty", "wrap", "to_device"])
def test_device_arrays_hold_only_dtypes_a_tensor_can_describe(make, dtype):
    with pytest.raises(acl_swiglu.ArgumentError) as info:
        if make == "empty":
            acl_swiglu.DeviceArray.empty((2,), dtype)
        elif make == "wrap":
            acl_swiglu.DeviceArray.wrap(4096, (2,), dtype)
        else:
            acl_swiglu.to_device(np.zeros(2, dtype))
    assert "float32, float16, bfloat16, int64" in str(info.value)   # says which are allowed


# ---- a device another framework set on the thread ----

_GET_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int32))


def _run_on_new_thread(monkeypatch, reported_device, framework_sets_device: bool):
    """A new thread's first call, with aclrtGetDevice reporting `reported_device` (None: fails
    as on a thread without a device); returns the devices the package set on that thread."""
    api = _ffi.api()

    def get_device(out):
        if reported_device is None:
            return 107002
        out[0] = reported_device
        return 0

    fake = _GET_DEVICE(get_device)
    monkeypatch.setattr(api.raw, "aclrtGetDevice", fake)
    set_by_package = []
    real_set = api.aclrtSetDevice

    def recording_set(device):
        if threading.current_thread() is not threading.main_thread():
            set_by_package.append(device)
        return real_set(device)

    monkeypatch.setattr(api, "aclrtSetDevice", recording_set)
    box = {}

    def work():
        try:
            if framework_sets_device:
                assert api.raw.aclrtSetDevice(reported_device) == 0   # as torch_npu does
            gy, x = np.ones((2, 4), F32), np.ones((2, 8), F32)
            box["result"] = acl_swiglu.swiglu_group_quant_grad(gy, x)[0]
        except Exception as exc:
            box["error"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert "error" not in box, box
    return set_by_package


@pytest.mark.emulator_only
def test_a_thread_with_a_current_device_keeps_it(monkeypatch):
    assert _run_on_new_thread(monkeypatch, 0, framework_sets_device=True) == []


@pytest.mark.emulator_only
def test_a_thread_without_a_device_gets_the_configured_one(monkeypatch):
    assert _run_on_new_thread(monkeypatch, None, framework_sets_device=False) == [0]


@pytest.mark.emulator_only
def test_a_runtime_without_aclrtGetDevice_binds_the_configured_device(monkeypatch):
    monkeypatch.setattr(_ffi.api().raw, "aclrtGetDevice", None)
    set_by_package = []
    api = _ffi.api()
    real_set = api.aclrtSetDevice
    monkeypatch.setattr(api, "aclrtSetDevice", lambda device: (set_by_package.append(device), real_set(device))[1])
    thread = threading.Thread(target=lambda: acl_swiglu.swiglu_group_quant_grad(np.ones((1, 2), F32),
                                                                               np.ones((1, 4), F32)))
    thread.start()
    thread.join(60)
    assert set_by_package == [0]


@pytest.mark.emulator_only
def test_acl_initialised_by_someone_else_is_never_finalised(tmp_path):
    script = tmp_path / "init_first.py"
    script.write_text(textwrap.dedent(r"""
        import atexit
        import numpy as np
        from acl_swiglu import _ffi, runtime
        api = _ffi.api()
        assert api.raw.aclInit(None) == 0                  # a framework initialised ACL first
        atexit.register(lambda: print("finalize by its owner:", api.raw.aclFinalize(), flush=True))
        import acl_swiglu
        acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), np.float32), np.ones((2, 8), np.float32))
        print("initialised here:", runtime._runtime.initialized_here, flush=True)
        acl_swiglu.release_cached()
    """))
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "initialised here: False" in proc.stdout
    assert "finalize by its owner: 0" in proc.stdout, proc.stdout   # 100037 had the package finalised it
