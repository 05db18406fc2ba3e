"""Reusable plans (SwigluGroupQuantGradPlan) as a careless or hostile user drives them: repeated
calls with and without synchronisation, rebinding (also refused rebinding, which must leave the
plan exactly as it was), sharing between threads, closing (also from code that runs inside a
call), calls from inside a call of the same plan, an exception in the middle of a call, and plans
dropped without close(). Every result is compared bit for bit with tests/device_model.py.

Code "inside a call" is run through the user's own objects: a DeviceArray subclass whose address
getter runs a hook (a call reads the addresses of what it binds while it holds the plan), and a
Stream subclass whose synchronize() runs one (close() synchronises the plan's stream)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator, errors

from swiglu_cases import (CLAMP, JOIN_TIMEOUT, Rigged, RiggedStream, case, idle_counts, on_thread, raiser,
                          run_child, run_threads, same_bits, use_the_package_on_this_thread, want)

PHASE2 = "aclnnSwigluGroupQuantGrad"


@pytest.fixture(params=["own-stream", "default-stream"])
def plan_setup(request):
    """A plan over (d_gy, d_x) writing `out`, on its own stream or the default one, with the
    bits it must give; and a second grad_y / x of the same layout with other data."""
    gy, x = case(6, 24, seed=21)
    gy2, x2 = case(6, 24, seed=22)
    stream = acl_swiglu.Stream() if request.param == "own-stream" else None
    try:
        with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
                acl_swiglu.to_device(gy2) as d_gy2, acl_swiglu.to_device(x2) as d_x2, \
                acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out, \
                acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream) as plan:
            yield {"plan": plan, "gy": d_gy, "x": d_x, "gy2": d_gy2, "x2": d_x2, "out": out,
                   "want": want(gy, x), "want_gy2": want(gy2, x), "want_x2": want(gy, x2), "want_both2": want(gy2, x2)}
    finally:
        if stream is not None:
            stream.close()


# ---- calls ----


def test_repeated_calls_give_the_bits_with_and_without_synchronize(plan_setup):
    s = plan_setup
    plan, out = s["plan"], s["out"]
    for _ in range(5):
        grad_x, grad_w = plan(synchronize=True)
        assert grad_x is out and grad_w is None
        assert same_bits(out.to_numpy(sync=False), s["want"])   # synchronize=True waited already
    for _ in range(3):
        grad_x, _ = plan()
        assert grad_x.pending is plan.stream   # queued on the plan's stream, and marked so
        assert same_bits(grad_x.to_numpy(), s["want"])
    with acl_swiglu.DeviceArray.empty((2,), np.float32):
        pass   # (an unrelated close between calls)
    for _ in range(2):
        assert same_bits(plan(synchronize=True)[0].to_numpy(), s["want"])


def test_each_call_returns_the_outputs_it_launched_with(plan_setup):
    s = plan_setup
    plan, out = s["plan"], s["out"]
    plan(synchronize=True)
    with acl_swiglu.DeviceArray.empty(out.shape, np.float32) as other:
        grad_x, _ = plan(grad_x=other, synchronize=True)
        assert grad_x is other and plan.grad_x is other
        assert plan()[0] is other   # the new binding stays
        assert same_bits(other.to_numpy(), s["want"])
        grad_x, _ = plan(grad_x=out)
        assert grad_x is out and plan.grad_x is out and same_bits(out.to_numpy(), s["want"])


def test_rebinding_some_arguments_keeps_the_others(plan_setup):
    s = plan_setup
    plan = s["plan"]
    assert same_bits(plan(s["gy2"])[0].to_numpy(), s["want_gy2"])
    assert same_bits(plan()[0].to_numpy(), s["want_gy2"])            # grad_y stays rebound
    assert same_bits(plan(x=s["x2"])[0].to_numpy(), s["want_both2"])
    assert same_bits(plan(s["gy"], s["x"])[0].to_numpy(), s["want"])
    assert same_bits(plan(s["gy"], s["x"])[0].to_numpy(), s["want"])   # the same arrays again: nothing to rebind


@pytest.mark.emulator_only
@pytest.mark.parametrize("fault,api", [(f"{PHASE2}:1:507015", PHASE2),
                                       ("aclrtSynchronizeStream:1:507035", "aclrtSynchronizeStream")])
def test_a_failed_launch_names_the_call_and_the_plan_goes_on(plan_setup, fault, api):
    s = plan_setup
    plan = s["plan"]
    plan(synchronize=True)
    for arguments in ({}, {"grad_y": s["gy2"]}):   # a plain call and a rebinding one
        with emulator.inject_faults(fault):
            with pytest.raises(errors.AclError) as info:
                plan(**arguments, synchronize=True)
        assert info.value.api == api and "injected fault" in info.value.message
    assert same_bits(plan(s["gy"], synchronize=True)[0].to_numpy(), s["want"])


def test_a_closed_plan_refuses_every_call(plan_setup):
    s = plan_setup
    plan = s["plan"]
    plan(synchronize=True)
    plan.close()
    assert plan.closed and plan.workspace_size == 0 and "closed" in repr(plan)
    for arguments in ((), (s["gy2"],)):
        with pytest.raises(errors.HandleClosedError, match="was closed"):
            plan(*arguments, synchronize=True)
    plan.close()   # (twice: nothing more happens)


def test_closing_what_the_plan_is_bound_to_fails_its_calls_until_it_is_rebound(plan_setup):
    s = plan_setup
    plan = s["plan"]
    with acl_swiglu.to_device(s["x2"].to_numpy()) as x3:
        plan(x=x3, synchronize=True)
        plan(synchronize=True)
        x3.close()
        for _ in range(2):
            with pytest.raises(errors.HandleClosedError, match="x"):
                plan(synchronize=True)
        grad_x, _ = plan(x=s["x"], synchronize=True)   # rebound to an open array: calls work again
        assert same_bits(grad_x.to_numpy(), s["want"])
        assert same_bits(plan()[0].to_numpy(), s["want"])


@pytest.mark.parametrize("value,accepted", [
    (True, True), (False, True), (1, True), (0, True), (np.True_, True), (np.False_, True),
    (2, False), (None, False), (1.0, False), ("yes", False)])
def test_synchronize_values_behave_alike_with_and_without_rebinding(plan_setup, value, accepted):
    s = plan_setup
    plan, out = s["plan"], s["out"]
    plan(synchronize=True)
    for arguments in ((), (s["gy2"],)):
        if accepted:
            plan(*arguments, synchronize=value)
            plan.stream.synchronize()
            assert same_bits(out.to_numpy(), s["want_gy2"] if arguments else s["want"])
            plan(s["gy"], synchronize=True)
        else:
            with pytest.raises(TypeError, match="synchronize"):
                plan(*arguments, synchronize=value)
            # refused before anything was rebound
            assert same_bits(plan(synchronize=True)[0].to_numpy(), s["want"])


# ---- a refused rebinding leaves the plan exactly as it was ----


def _refusals(s):
    gy, x = s["gy"], s["x"]
    return {
        "x of another shape": (lambda: acl_swiglu.DeviceArray.empty((x.shape[0] - 1, x.shape[1]), np.float32),
                               errors.ArgumentError),
        "x of another dtype": (lambda: acl_swiglu.DeviceArray.empty(x.shape, np.float16), errors.ArgumentError),
        "x at another offset": (lambda: acl_swiglu.DeviceArray(s["x2"].buffer, (x.shape[0] - 1, x.shape[1]),
                                                               np.float32, offset=x.shape[1]), errors.ArgumentError),
        "a closed x": (lambda: _closed(acl_swiglu.to_device(np.zeros(x.shape, np.float32))), errors.HandleClosedError),
        "a NumPy x": (lambda: np.zeros(x.shape, np.float32), TypeError),
        "grad_x of another shape": (lambda: acl_swiglu.DeviceArray.empty(gy.shape, np.float32), errors.ArgumentError),
        "a weight the plan was built without": (lambda: acl_swiglu.DeviceArray.empty((x.shape[0],), np.float32),
                                                errors.ArgumentError),
        "an unknown argument": (lambda: None, TypeError),
        "grad_y twice": (lambda: None, TypeError),
        "seven positional arrays": (lambda: None, TypeError),
    }


def _closed(array):
    array.close()
    return array


@pytest.mark.parametrize("refusal", list(_refusals({"gy": np.zeros((6, 24)), "x": np.zeros((6, 48))})))
def test_a_refused_rebinding_leaves_the_plan_as_it_was(plan_setup, refusal):
    s = plan_setup
    plan, out, new_gy = s["plan"], s["out"], s["gy2"]
    plan(synchronize=True)
    make, error = _refusals(s)[refusal]
    bad = make()
    try:
        with pytest.raises(error):
            if refusal == "an unknown argument":
                plan(grad_y=new_gy, gradY=new_gy)
            elif refusal == "grad_y twice":
                plan(new_gy, grad_y=new_gy)
            elif refusal == "seven positional arrays":
                plan(new_gy, s["x"], None, None, None, out, None)
            elif refusal.startswith("grad_x"):
                plan(grad_y=new_gy, grad_x=bad)
            elif refusal.startswith("a weight"):
                plan(grad_y=new_gy, weight=bad)
            else:
                plan(grad_y=new_gy, x=bad)
        for _ in range(2):
            grad_x, grad_w = plan(synchronize=True)
            assert grad_x is out and plan.grad_x is out and grad_w is None
            assert same_bits(out.to_numpy(), s["want"]), "the refused call changed what the plan computes"
    finally:
        if isinstance(bad, acl_swiglu.DeviceArray) and bad.buffer is not s["x2"].buffer:
            bad.close()


@pytest.mark.emulator_only
@pytest.mark.parametrize("nth", [1, 2])
def test_a_rebinding_whose_address_setter_fails_leaves_the_plan_as_it_was(plan_setup, nth):
    """grad_y and x rebound at once, the first or the second aclSetInputTensorAddr failing: the
    call fails naming it and the next call computes with the old arrays."""
    s = plan_setup
    plan = s["plan"]
    plan(synchronize=True)
    with emulator.inject_faults(f"aclSetInputTensorAddr:{nth}:161002"):
        with pytest.raises(errors.AclError) as info:
            plan(grad_y=s["gy2"], x=s["x2"], synchronize=True)
    assert info.value.api == "aclSetInputTensorAddr"
    assert same_bits(plan(synchronize=True)[0].to_numpy(), s["want"])
    assert same_bits(plan(s["gy2"], s["x2"], synchronize=True)[0].to_numpy(), s["want_both2"])


def test_a_plan_rebound_onto_an_overlapping_output_fails_each_call_then_recovers(plan_setup):
    """grad_x rebound onto x: every launch is refused with the emulator's code and nothing is
    written into x; rebinding the real output back gives its bits again."""
    s = plan_setup
    plan, out, d_x = s["plan"], s["out"], s["x"]
    plan(synchronize=True)
    x_before = d_x.to_numpy()
    for arguments in ({"grad_x": d_x}, {}, {}):
        with pytest.raises(acl_swiglu.AclError, match="overlaps x") as caught:
            plan(**arguments, synchronize=True)
        assert caught.value.code == 161002
    assert same_bits(d_x.to_numpy(), x_before)
    grad_x, _ = plan(grad_x=out, synchronize=True)
    assert grad_x is out and same_bits(out.to_numpy(), s["want"])
    for _ in range(2):
        grad_x, _ = plan()
        assert grad_x is out and same_bits(grad_x.to_numpy(), s["want"])


# ---- threads ----


def test_calls_from_another_thread_and_back(plan_setup):
    s = plan_setup
    plan, out = s["plan"], s["out"]
    plan(synchronize=True)
    results = []

    def other():
        use_the_package_on_this_thread()
        results.extend(plan(synchronize=True)[0] for _ in range(3))

    assert not run_threads([other])
    assert results == [out] * 3 and same_bits(out.to_numpy(), s["want"])
    assert same_bits(plan(synchronize=True)[0].to_numpy(), s["want"])


@pytest.mark.parametrize("first_call", ["plain", "rebinding"])
def test_a_threads_first_use_of_the_package_can_be_a_plan_call(plan_setup, first_call):
    """Twenty rounds of short-lived threads (thread identities are reused once a thread ended),
    each one's first use of the package a call of the plan: each works."""
    s = plan_setup
    plan, out = s["plan"], s["out"]
    arguments = (s["gy2"],) if first_call == "rebinding" else ()
    for round_ in range(20):
        plan(s["gy"], synchronize=True)   # (checked: a plain call may launch at once)
        finished, value = on_thread(lambda: plan(*arguments, synchronize=True)[0])
        assert finished and value is out, (round_, value)
    assert same_bits(out.to_numpy(), s["want_gy2"] if arguments else s["want"])


def test_a_call_from_another_thread_waits_for_the_call_in_progress(plan_setup):
    """Thread A is inside a call (held in the address getter of the array it rebinds); thread B's
    call must not run until A's call ended, then both calls hold the right bits."""
    s = plan_setup
    plan = s["plan"]
    plan(synchronize=True)
    rigged = Rigged.over(s["x2"])
    inside, leave = threading.Event(), threading.Event()
    order = []

    def hold():
        order.append("A inside")
        inside.set()
        leave.wait(JOIN_TIMEOUT)
        order.append("A leaves")

    rigged.arm(hold)
    a = threading.Thread(target=lambda: (use_the_package_on_this_thread(), plan(x=rigged, synchronize=True),
                                         order.append("A done")), daemon=True)
    b = threading.Thread(target=lambda: (use_the_package_on_this_thread(), inside.wait(JOIN_TIMEOUT),
                                         plan(synchronize=True), order.append("B done")), daemon=True)
    a.start()
    try:
        assert inside.wait(JOIN_TIMEOUT)
        b.start()
        b.join(0.2)
        assert "B done" not in order, "a call ran while another thread's call of the same plan was in progress"
    finally:
        leave.set()
        a.join(JOIN_TIMEOUT)
        b.join(JOIN_TIMEOUT)
    assert not a.is_alive() and not b.is_alive()
    assert order.index("B done") > order.index("A leaves"), order
    assert same_bits(s["out"].to_numpy(), s["want_x2"])   # B kept A's binding


def test_threads_sharing_a_plan_some_rebinding_its_output():
    """Four threads share one plan: some call it as it is, others rebind its output to their own.
    Every call returns an output that is one of the plan's and holds the right bits."""
    gy, x = case(4, 16, seed=5)
    expected = want(gy, x)
    threads, iterations = 4, 60
    problems = []
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        outs = [acl_swiglu.DeviceArray.empty(x.shape, np.float32) for _ in range(threads)]
        try:
            with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, grad_x=outs[0],
                                                     stream=stream) as plan:
                barrier = threading.Barrier(threads)

                def worker(k):
                    use_the_package_on_this_thread()
                    barrier.wait(JOIN_TIMEOUT)
                    for i in range(iterations):
                        if k % 2 and i % 3 == 0:
                            got, _ = plan(grad_x=outs[k], synchronize=True)
                            if got is not outs[k]:
                                problems.append((k, i, "a rebinding call returned another output"))
                        else:
                            got, _ = plan(synchronize=True)
                        if all(got is not o for o in outs):
                            problems.append((k, i, "an output that is not the plan's"))
                        elif not same_bits(got.to_numpy(sync=False), expected):
                            problems.append((k, i, "wrong bits"))

                failures = run_threads([lambda k=k: worker(k) for k in range(threads)])
                assert not failures and not problems, (failures, problems[:5])
        finally:
            for out in outs:
                out.close()


# ---- code run inside a call: reentrancy, exceptions ----


def test_a_plan_called_or_closed_from_inside_its_own_call_is_refused(plan_setup):
    s = plan_setup
    plan = s["plan"]
    plan(synchronize=True)
    rigged = Rigged.over(s["x2"])
    seen = []

    def reenter():
        for attempt in (plan, plan.close):
            try:
                attempt()
                seen.append("returned")
            except RuntimeError as exc:
                seen.append("refused" if "inside one of its own calls" in str(exc) else repr(exc))

    rigged.arm(reenter)
    finished, value = on_thread(lambda: (use_the_package_on_this_thread(), plan(x=rigged, synchronize=True))[1])
    assert finished, "a call made from inside a call of the same plan deadlocked"
    assert seen == ["refused", "refused"], seen
    assert value == (s["out"], None) and not plan.closed
    assert same_bits(s["out"].to_numpy(), s["want_x2"])


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit, ValueError])
def test_an_exception_in_the_middle_of_a_rebinding_leaves_the_plan_usable(plan_setup, exception):
    """The exception arrives while the call reads the address of the second array it rebinds
    (the first is rebound already): the plan computes with its old arrays afterwards, from this
    thread and from another, and takes the new ones when asked again."""
    s = plan_setup
    plan = s["plan"]
    plan(synchronize=True)
    rigged = Rigged.over(s["x2"])
    rigged.arm(raiser(exception("at a bad moment")))
    with pytest.raises(exception):
        plan(grad_y=s["gy2"], x=rigged, synchronize=True)
    assert same_bits(plan(synchronize=True)[0].to_numpy(), s["want"])
    finished, value = on_thread(lambda: (use_the_package_on_this_thread(), plan(synchronize=True)[0].to_numpy())[1])
    assert finished and same_bits(value, s["want"]), value
    assert same_bits(plan(grad_y=s["gy2"], x=rigged, synchronize=True)[0].to_numpy(), s["want_both2"])


def test_a_plan_called_from_inside_its_own_close_is_refused():
    gy, x = case(4, 16, seed=31)
    seen = []
    with RiggedStream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream)
        assert same_bits(plan(synchronize=True)[0].to_numpy(), want(gy, x))

        def reenter():
            try:
                plan()
                seen.append("returned")
            except (RuntimeError, errors.HandleClosedError) as exc:
                seen.append(type(exc).__name__)

        stream.arm(reenter)
        finished, value = on_thread(plan.close)
        assert finished, "a call made from inside the plan's close() deadlocked"
        assert value is None and plan.closed
        assert seen in (["RuntimeError"], ["HandleClosedError"]), seen


@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
def test_an_exception_in_the_middle_of_close_still_releases_everything(exception):
    gy, x = case(4, 16, seed=33)
    before = idle_counts()
    with RiggedStream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream)
        plan()   # (queued: close synchronises)
        stream.arm(raiser(exception("at a bad moment")))
        with pytest.raises(exception):
            plan.close()
        assert plan.closed
        finished, value = on_thread(plan.close)
        assert finished and value is None
        with pytest.raises(errors.HandleClosedError):
            plan()
        stream.synchronize()
    assert idle_counts() == before


_GC_CALLBACKS = r"""
import collections, gc, json, threading
import numpy as np
import acl_swiglu
from swiglu_cases import Rigged, case, want, same_bits

gy, x = case(6, 24, seed=1)
expected = want(gy, x)
stream = acl_swiglu.Stream()
d_gy, d_x, d_x2 = acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.to_device(x)
plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, stream=stream)
plan(synchronize=True)
rigged = Rigged.over(d_x2)
caller = [threading.get_ident()]
seen = collections.Counter()
active = [False]

def callback(phase, info):
    # The hostile user: at every collection on the calling thread, call the plan.
    if phase != "start" or not active[0] or threading.get_ident() != caller[0]:
        return
    active[0] = False
    try:
        plan()
        seen["returned"] += 1
    except RuntimeError as error:
        seen["refused" if "inside one of its own calls" in str(error) else "other: " + str(error)] += 1
    except acl_swiglu.HandleClosedError:
        seen["closed"] += 1
    except Exception as error:
        seen["other: " + repr(error)] += 1
    finally:
        active[0] = True

class Finalized:
    # Garbage in a reference cycle whose finalizer calls the plan (it runs at whichever
    # collection finds it: between the plan's calls or inside one).
    def __init__(self):
        self.cycle = self

    def __del__(self):
        callback("start", None)


report = {}
for stage in ("finalizers", "calls", "close"):
    seen.clear()
    if stage != "finalizers":
        gc.callbacks.append(callback)
    gc.set_threshold(1)   # a collection at (nearly) every allocation, also inside the plan's calls
    active[0] = True
    try:
        if stage == "close":
            plan.close()
        else:
            for i in range(100):
                if stage == "finalizers" and i % 2:
                    rigged.arm(Finalized)   # garbage made inside the call, collected there
                    plan(d_gy, rigged)
                else:
                    plan(d_gy, d_x2 if i % 2 else d_x)   # rebinding calls
    finally:
        active[0] = False
        gc.set_threshold(700)
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)
    gc.collect()
    report[stage] = dict(seen)
    if stage == "calls":
        report["bits"] = same_bits(plan.grad_x.to_numpy(), expected)
report["closed"] = plan.closed
print(json.dumps(report))
"""


def test_a_plan_called_from_gc_callbacks_and_finalizers_during_its_calls_and_its_close(tmp_path):
    """(A child process: a deadlock must not stop the run.) Every call made from a collection
    (a gc callback, or the finalizer of garbage it collects) that ran inside one of the plan's
    calls or inside its close() is refused; those made between calls work; nothing deadlocks and
    the plan's result stays right."""
    report = run_child(_GC_CALLBACKS, tmp_path)
    for stage in ("calls", "close"):
        outcomes = report[stage]
        assert not [k for k in outcomes if k.startswith("other")], report
        assert outcomes.get("refused", 0) >= 1, report
    finalizers = report["finalizers"]
    assert not [k for k in finalizers if k.startswith("other")], report
    assert finalizers.get("refused", 0) >= 1 and finalizers.get("refused", 0) + finalizers.get("returned", 0) >= 50, \
        report
    assert report["bits"] and report["closed"], report


# ---- dropped without close ----


def test_a_plan_dropped_without_close_frees_everything_it_owned():
    gy, x = case(4, 16, seed=43)
    before = idle_counts()
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream)
        grad_x, _ = plan(synchronize=True)
        assert same_bits(grad_x.to_numpy(), want(gy, x))
        plan(d_gy)   # (queued, not waited for)
        del plan, grad_x
        gc.collect()
    assert idle_counts() == before
