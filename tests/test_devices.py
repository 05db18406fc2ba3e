"""set_device() with two emulated devices (ACL_EMU_DEVICES=2, in a child interpreter: the
emulator reads the count at aclInit): after set_device(1), one-shot calls, device-level calls on
the default stream and on an own stream, and plans work on device 1, threads bound before follow,
arrays of device 0 are refused naming device 0, and no error of a call on device 1's own arrays
advises device 0; switching back works the same way. What was made on either device is freed."""

from __future__ import annotations

import pytest

from swiglu_cases import run_child

pytestmark = pytest.mark.emulator_only

_TWO_DEVICES = r"""
import json, threading
import numpy as np
import acl_swiglu
from acl_swiglu import emulator, runtime
from swiglu_cases import case, same_bits, want

report = {"errors": []}
gy, x = case(6, 16, seed=81)
expected = want(gy, x, None)


def attempt(name, function):
    try:
        report[name] = function()
    except Exception as error:
        report[name] = f"{type(error).__name__}: {error}"
        report["errors"].append([name, str(error)])


def calls(device):
    # Every kind of call on this device's own arrays; True where the bits are right.
    out = {"current": runtime.current_device() == device}
    out["one-shot"] = same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], expected)
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        for name in ("default", "own"):
            s = acl_swiglu.Stream() if name == "own" else None
            made, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, stream=s)
            with made:
                given, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=made, stream=s)
                out[f"device-{name}"] = same_bits(given.to_numpy(), expected)
            with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, stream=s) as plan:
                plan(synchronize=True)
                out[f"plan-{name}"] = same_bits(plan()[0].to_numpy(), expected)
            if s is not None:
                s.close()
    return out


def foreign(arrays):
    # A device-level call on arrays of the other device: refused, naming the device they belong to.
    try:
        acl_swiglu.swiglu_group_quant_grad_device(*arrays)
        return "ran"
    except acl_swiglu.AclError as error:
        return str(error)


attempt("device 0", lambda: calls(0))
kept0 = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
follow, done, followed = threading.Event(), threading.Event(), {}


def bound_before():   # bound to device 0 now; after set_device(1) it follows
    followed["before"] = runtime.current_device()
    follow.wait(30)
    followed["after"] = runtime.current_device()
    followed["bits"] = same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], expected)
    done.set()


thread = threading.Thread(target=bound_before)
thread.start()
acl_swiglu.set_device(1)
attempt("device 1", lambda: calls(1))
follow.set()
thread.join(30)
report["followed"] = followed
fresh = {}
t = threading.Thread(target=lambda: fresh.update(device=runtime.current_device(),
                                                 bits=same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], expected)))
t.start()
t.join(30)
report["new thread"] = fresh
kept1 = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
report["device 0 arrays on device 1"] = foreign(kept0)
messages_on_1 = [m for _, m in report["errors"]]
acl_swiglu.set_device(0)
attempt("device 0 again", lambda: calls(0))
report["device 1 arrays on device 0"] = foreign(kept1)
report["kept arrays of device 0"] = same_bits(acl_swiglu.swiglu_group_quant_grad_device(*kept0)[0].to_numpy(), expected)
report["messages"] = messages_on_1
for array in kept0:
    array.close()
acl_swiglu.set_device(1)
for array in kept1:
    array.close()
acl_swiglu.set_device(0)
import gc
gc.collect()
acl_swiglu.release_cached()
report["live"] = emulator.live_counts()
print(json.dumps(report))
"""

_FREED_ON_THE_OTHER_DEVICE = r"""
import gc, json
import numpy as np
import acl_swiglu
from acl_swiglu import emulator
from swiglu_cases import case

gy, x = case(6, 16, seed=82)
report = {}
acl_swiglu.set_device(1)
array = acl_swiglu.to_device(gy)
stream = acl_swiglu.Stream()
acl_swiglu.swiglu_group_quant_grad(gy, x)   # device 1's one-shot stream
with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x)[0].close()   # default stream: device 1's pooled workspace
acl_swiglu.set_device(0)
array.close()
stream.close()
gc.collect()
acl_swiglu.release_cached()
report["live"] = emulator.live_counts()
print(json.dumps(report))
"""

# A set_device() that takes effect while a thread makes its one-shot stream (another thread's
# moves this one at its next step into the runtime; here the thread makes it itself, to land at
# that step every time): the stream is made on the new device, and kept as that device's, not as
# the one the call looked up.
_MOVED_WHILE_MAKING_THE_STREAM = r"""
import json
import acl_swiglu
from acl_swiglu import _device, emulator
from swiglu_cases import case, same_bits, want

gy, x = case(6, 16, seed=83)
expected = want(gy, x, None)
report = {}
make = _device.Stream.__init__

def moved_meanwhile(stream):
    acl_swiglu.set_device(1)
    make(stream)

acl_swiglu.set_device(0)
_device.Stream.__init__ = moved_meanwhile
try:
    report["moved"] = same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], expected)
finally:
    _device.Stream.__init__ = make
for device in (0, 1, 0):
    acl_swiglu.set_device(device)
    try:
        report[f"device {device}"] = same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], expected)
    except Exception as exc:
        report[f"device {device}"] = repr(exc)
acl_swiglu.release_cached()
report["live"] = emulator.live_counts()
print(json.dumps(report))
"""


def test_a_one_shot_stream_made_while_the_thread_moves_is_kept_as_the_new_devices(tmp_path):
    report = run_child(_MOVED_WHILE_MAKING_THE_STREAM, tmp_path, ACL_EMU_DEVICES="2")
    assert report["moved"] is True and report["device 0"] is True and report["device 1"] is True, report
    assert not any(report["live"].values()), report

# The same for the default stream's pooled workspace, allocated by a device-level call.
_MOVED_WHILE_ALLOCATING_THE_WORKSPACE = r"""
import json
import acl_swiglu
from acl_swiglu import _device, emulator
from swiglu_cases import case, same_bits, want

gy, x = case(6, 16, seed=84)
expected = want(gy, x, None)
report = {}
allocate = _device.DeviceBuffer.__init__
moves = []

def moved_meanwhile(buffer, nbytes):   # (the call's only allocation: its workspace)
    if not moves:
        moves.append(1)
        acl_swiglu.set_device(1)
    allocate(buffer, nbytes)

acl_swiglu.set_device(0)
with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
        acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
    _device.DeviceBuffer.__init__ = moved_meanwhile
    try:
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out)
        out.to_numpy()
    except Exception as exc:   # (its arrays are on device 0: either outcome, but no stale pool)
        report["moved"] = type(exc).__name__
    finally:
        _device.DeviceBuffer.__init__ = allocate
    acl_swiglu.set_device(0)
    try:
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out)
        report["device 0"] = same_bits(out.to_numpy(), expected)
    except Exception as exc:
        report["device 0"] = repr(exc)
acl_swiglu.release_cached()
report["moves"] = len(moves)
report["live"] = emulator.live_counts()
print(json.dumps(report))
"""


def test_a_pooled_workspace_allocated_while_the_thread_moves_is_kept_as_the_new_devices(tmp_path):
    report = run_child(_MOVED_WHILE_ALLOCATING_THE_WORKSPACE, tmp_path, ACL_EMU_DEVICES="2")
    assert report["moves"] == 1 and report["device 0"] is True, report
    assert not any(report["live"].values()), report

def test_set_device_moves_every_kind_of_call_and_back(tmp_path):
    report = run_child(_TWO_DEVICES, tmp_path, ACL_EMU_DEVICES="2")
    everything = {"current": True, "one-shot": True, "device-default": True, "device-own": True,
                  "plan-default": True, "plan-own": True}
    for name in ("device 0", "device 1", "device 0 again"):
        assert report[name] == everything, (name, report)
    assert report["followed"] == {"before": 0, "after": 1, "bits": True}, report
    assert report["new thread"] == {"device": 1, "bits": True}, report
    assert "device 0" in report["device 0 arrays on device 1"], report
    assert "device 1" in report["device 1 arrays on device 0"], report
    assert report["kept arrays of device 0"], report
    assert not report["errors"], report
    assert not any("aclrtSetDevice(0)" in m or "device 0" in m for m in report["messages"]), report


def test_handles_of_one_device_freed_after_switching_to_the_other(tmp_path):
    report = run_child(_FREED_ON_THE_OTHER_DEVICE, tmp_path, ACL_EMU_DEVICES="2")
    assert not any(report["live"].values()), report
