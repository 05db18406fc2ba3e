"""Calls made from code that runs inside another call of the package: a gc callback (a garbage
collection can start at any allocation, also inside a call), or a signal handler: here a
DeviceArray subclass whose address record runs the code, the one point a call reads it at. Each such call either works or is
refused with a clear error; none may deadlock. (Plans refusing calls from inside their own calls
are test_plan.py's.)

Every scenario runs in a child interpreter, each on a thread the child waits for a bounded
time: a deadlock shows as a scenario that did not finish, and cannot hold a lock the rest of the
test run needs. The children run side by side.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from swiglu_cases import CHILD_TIMEOUT, child_env

WAIT = 6.0   # seconds a child waits for a scenario that takes milliseconds (a deadlock waits this long)

_CHILD = r"""
import gc, json, os, sys, threading
import numpy as np
import acl_swiglu
from swiglu_cases import Rigged, case, want, same_bits

gc.collect()
gc.freeze()   # (collections at every allocation below stay cheap)
WAIT = float(sys.argv[1])


def device_call(d_gy, d_x, out, stream=None):
    return acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)


def arrays(rows, hidden, seed):
    gy, x = case(rows, hidden, seed=seed)
    return (acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.DeviceArray.empty(x.shape, np.float32),
            want(gy, x, None))


def collecting_on_this_thread(action):
    # A gc callback that runs action() at each collection that starts on the calling thread (not
    # inside itself); returns how to stop it and how often it ran.
    me, inside, ran = threading.get_ident(), [False], [0]

    def callback(phase, info):
        if phase != "start" or inside[0] or threading.get_ident() != me:
            return
        inside[0] = True
        try:
            action()
            ran[0] += 1
        finally:
            inside[0] = False

    gc.callbacks.append(callback)
    gc.set_threshold(1)

    def stop():
        gc.set_threshold(700)
        gc.callbacks.remove(callback)

    return stop, ran


def same_layout_from_an_array_hook():
    d_gy, d_x, out, expected = arrays(5, 40, 1)
    device_call(d_gy, d_x, out)
    rigged = Rigged.over(d_x)
    rigged.arm(lambda: device_call(d_gy, d_x, out))   # runs while the call binds its arrays
    device_call(d_gy, rigged, out)
    return {"bits": same_bits(out.to_numpy(), expected)}


def same_layout_from_a_gc_callback():
    d_gy, d_x, out, expected = arrays(5, 44, 2)
    device_call(d_gy, d_x, out)
    stop, ran = collecting_on_this_thread(lambda: device_call(d_gy, d_x, out))
    try:
        for _ in range(5):
            device_call(d_gy, d_x, out)
    finally:
        stop()
    return {"bits": same_bits(out.to_numpy(), expected), "nested": ran[0]}


def release_cached_from_a_gc_callback_inside_release_cached():
    gy, x = case(3, 48, seed=3)
    runs = 0
    for _ in range(5):
        acl_swiglu.swiglu_group_quant_grad(gy, x)   # (a thread stream for release_cached to close)
        stop, ran = collecting_on_this_thread(acl_swiglu.release_cached)
        try:
            acl_swiglu.release_cached()
        finally:
            stop()
        runs += ran[0]
    return {"nested": runs}


def other_calls_from_inside_a_device_call():
    # Code inside a device-level call makes a device-level call of another layout, a one-shot
    # call, a plan call, and release_cached(): each works, and so does the call around them.
    d_gy, d_x, out, expected = arrays(5, 52, 4)
    o_gy, o_x, o_out, o_expected = arrays(3, 52, 5)
    host = case(2, 52, seed=6)
    plan = acl_swiglu.SwigluGroupQuantGradPlan(o_gy, o_x, grad_x=o_out)
    checks = {}

    def inside():
        device_call(o_gy, o_x, o_out)
        checks["one-shot"] = same_bits(acl_swiglu.swiglu_group_quant_grad(*host)[0], want(*host, None))
        plan(synchronize=True)
        acl_swiglu.release_cached()
        checks["inner"] = same_bits(o_out.to_numpy(), o_expected)

    device_call(d_gy, d_x, out)
    rigged = Rigged.over(d_x)
    rigged.arm(inside)
    device_call(d_gy, rigged, out)
    checks["outer"] = same_bits(out.to_numpy(), expected)
    plan.close()
    return checks


def a_device_call_from_inside_a_plan_call():
    d_gy, d_x, out, expected = arrays(5, 56, 7)
    o_gy, o_x, o_out, o_expected = arrays(5, 56, 8)
    plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=out)
    plan(synchronize=True)
    device_call(o_gy, o_x, o_out)
    rigged = Rigged.over(d_x)
    rigged.arm(lambda: device_call(o_gy, o_x, o_out))   # the plan's layout, through the kept executor
    plan(x=rigged, synchronize=True)
    checks = {"plan": same_bits(out.to_numpy(), expected), "inner": same_bits(o_out.to_numpy(), o_expected)}
    plan.close()
    return checks


def one_shot_calls_from_gc_callbacks_inside_release_cached():
    gy, x = case(3, 60, seed=9)
    expected = want(gy, x, None)
    bits = []
    runs = 0
    for _ in range(5):
        acl_swiglu.swiglu_group_quant_grad(gy, x)
        stop, ran = collecting_on_this_thread(lambda: bits.append(same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0],
                                                                            expected)))
        try:
            acl_swiglu.release_cached()
        finally:
            stop()
        runs += ran[0]
    return {"nested": runs, "bits": all(bits)}


report = {}
for name in sys.argv[2:]:
    box = {}

    def run(name=name, box=box):
        try:
            box["checks"] = globals()[name]()
        except BaseException as error:
            box["error"] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(WAIT)
    report[name] = dict(box, finished=not thread.is_alive())
    if thread.is_alive():
        break   # (it may hold what the next scenario needs)
print(json.dumps(report), flush=True)
os._exit(0)   # (a thread stuck in the package must not keep the child alive)
"""

CHILDREN = {
    "same_layout_from_an_array_hook": ["same_layout_from_an_array_hook"],
    "same_layout_from_a_gc_callback": ["same_layout_from_a_gc_callback"],
    "release_cached_from_a_gc_callback_inside_release_cached": [
        "release_cached_from_a_gc_callback_inside_release_cached"],
    "others": ["other_calls_from_inside_a_device_call", "a_device_call_from_inside_a_plan_call",
               "one_shot_calls_from_gc_callbacks_inside_release_cached"],
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """Every child started at once, then each one's report (by scenario name)."""
    cwd = tmp_path_factory.mktemp("reentrancy")
    procs = {key: subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CHILD), str(WAIT), *names], cwd=str(cwd),
                                   env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   start_new_session=True)
             for key, names in CHILDREN.items()}
    out = {}
    for key, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            out[key] = {"child failed": (proc.returncode, stdout[-2000:], stderr[-3000:])}
        else:
            out.update(json.loads(lines[-1]))
    return out


def _finished(reports, name):
    report = reports.get(name)
    assert report is not None, reports
    assert report["finished"], f"{name}: deadlocked ({report})"
    assert "error" not in report, report
    return report["checks"]




def test_a_device_call_of_the_same_layout_from_inside_a_device_call(reports):
    checks = _finished(reports, "same_layout_from_an_array_hook")
    assert checks["bits"], checks


def test_a_device_call_of_the_same_layout_from_a_gc_callback_inside_a_device_call(reports):
    checks = _finished(reports, "same_layout_from_a_gc_callback")
    assert checks["bits"] and checks["nested"] > 0, checks


def test_release_cached_from_a_gc_callback_inside_release_cached(reports):
    checks = _finished(reports, "release_cached_from_a_gc_callback_inside_release_cached")
    assert checks["nested"] > 0, checks


def test_calls_of_other_kinds_from_inside_a_device_call(reports):
    checks = _finished(reports, "other_calls_from_inside_a_device_call")
    assert checks == {"one-shot": True, "inner": True, "outer": True}, checks


def test_a_device_call_from_inside_a_plan_call(reports):
    checks = _finished(reports, "a_device_call_from_inside_a_plan_call")
    assert checks == {"plan": True, "inner": True}, checks


def test_one_shot_calls_from_gc_callbacks_inside_release_cached(reports):
    checks = _finished(reports, "one_shot_calls_from_gc_callbacks_inside_release_cached")
    assert checks["bits"] and checks["nested"] > 0, checks
