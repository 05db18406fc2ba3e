"""Hostile users and a hostile scheduler against the one-call paths: the plan owned in C, lean
repeats of device-level calls, one-shot NumPy calls read by the C helper, and the lazily
imported bfloat16. Anything that could hang or crash runs in a child interpreter whose own waits
are bounded."""

import gc
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _plan, emulator

import device_model
from test_fastpath_attack import forget_layouts  # noqa: F401 (forgets the layouts validated here too)

TESTS = os.path.dirname(os.path.abspath(__file__))
CHILD_TIMEOUT = 60   # a safety net only: each child bounds its own waits and exits by itself
WAIT = 3.0           # how long a child waits for an operation that takes microseconds

needs_helper = pytest.mark.skipif(_plan._hotpath() is None, reason="the installed package has no C helper")


@pytest.fixture(scope="module", autouse=True)
def forget_the_memo(forget_layouts):
    """With the layouts validated here, the last lean call's memo is forgotten afterwards."""
    yield
    acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD.last_call = None


def _race(workers, disturb, stop):
    """Runs `disturb` on its own thread while the workers run, then stops it (`stop` is the
    event it watches); every thread must have ended."""
    disturber = threading.Thread(target=disturb)
    disturber.start()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(30)
    stop.set()
    disturber.join(30)
    assert not any(t.is_alive() for t in workers + [disturber])


def _case(rows=6, hidden=16, seed=5):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, hidden)).astype(np.float32),
            rng.standard_normal((rows, 2 * hidden)).astype(np.float32))


def _want(gy, x):
    return device_model.swiglu_group_quant_grad_model(np.ascontiguousarray(gy), np.ascontiguousarray(x),
                                                      clamp_limit=1.5)[0]


def _same_bits(got, want):
    got = np.ascontiguousarray(got)
    return got.shape == want.shape and got.dtype == want.dtype and np.array_equal(got.view(np.uint8),
                                                                                  want.view(np.uint8))


def _idle_counts():
    acl_swiglu.release_cached()
    return emulator.live_counts()


def _run_child(body):
    """Runs `body` after a prelude that builds a warmed plan; returns the JSON the child printed
    last (the child reports and exits by itself, also when an operation it waits for hangs)."""
    prelude = textwrap.dedent("""
        import gc, json, os, sys, threading, warnings
        warnings.simplefilter("ignore")
        sys.path.insert(0, %r)
        import numpy as np
        import acl_swiglu
        import device_model
        WAIT = %r

        def report(**values):
            print(json.dumps(values), flush=True)
            os._exit(0)   # (a thread stuck in the package must not keep the child alive)

        def bounded(function):
            # Runs function on a daemon thread: (finished, its exception's type name or None)
            outcome = []
            def run():
                try:
                    function()
                    outcome.append(None)
                except BaseException as error:
                    outcome.append(type(error).__name__)
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(WAIT)
            return (not thread.is_alive(), outcome[0] if outcome else None)

        def interrupt_after_the_next_claim():
            real = plan._claim
            def interrupted_claim(argument):
                real(argument)   # the claim is made, then the interrupt arrives (as a signal handler's would)
                plan._claim = real
                raise KeyboardInterrupt
            plan._claim = interrupted_claim

        rng = np.random.default_rng(1)
        gy = rng.standard_normal((6, 24)).astype(np.float32)
        x = rng.standard_normal((6, 48)).astype(np.float32)
        want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.5)[0]
        stream = acl_swiglu.Stream()
        d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
        out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        plan(synchronize=True)
        plan(synchronize=True)   # (the second from C)
        assert np.array_equal(out.to_numpy().view(np.uint32), want.view(np.uint32))
    """) % (TESTS, WAIT)
    completed = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], capture_output=True, cwd=TESTS,
                               text=True, timeout=CHILD_TIMEOUT)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert lines, (completed.returncode, completed.stdout, completed.stderr[-3000:])
    return json.loads(lines[-1])


# ---- plans ----

@needs_helper
def test_an_interrupt_right_after_close_claims_the_plan_leaves_it_usable():
    result = _run_child("""
        interrupt_after_the_next_claim()
        try:
            plan.close()
            first = "returned"
        except KeyboardInterrupt:
            first = "interrupted"
        finished, error = bounded(plan.close)
        report(first=first, finished=finished, error=error, closed=plan.closed, owner=plan._hot.owner != 0)
    """)
    assert result["first"] == "interrupted"
    assert result["finished"], "a close() after an interrupted close() never returned"
    assert result["error"] is None and result["closed"] and not result["owner"]


@needs_helper
def test_an_interrupt_right_after_a_call_claims_the_plan_leaves_it_usable():
    result = _run_child("""
        interrupt_after_the_next_claim()
        try:
            plan(d_gy, synchronize=True)   # (a rebinding call: made from Python, which claims)
            first = "returned"
        except KeyboardInterrupt:
            first = "interrupted"
        bits = []
        def call_again():
            grad_x, _ = plan(synchronize=True)
            bits.append(np.array_equal(grad_x.to_numpy().view(np.uint32), want.view(np.uint32)))
        finished, error = bounded(call_again)   # (another thread: its C call must find the plan free)
        report(first=first, finished=finished, error=error, bits=bits, owner=plan._hot.owner != 0)
    """)
    assert result == {"first": "interrupted", "finished": True, "error": None, "bits": [True], "owner": False}


@needs_helper
def test_a_plan_called_from_a_gc_callback_during_its_close_is_refused_not_deadlocked():
    result = _run_child("""
        seen = []
        closer = []
        def callback(phase, info):
            # The hostile user: inside the plan's close (after it marked itself closed), call it.
            if phase == "start" and not seen and closer and threading.get_ident() == closer[0] and \\
                    plan._closed and plan._lock.locked():
                seen.append("called")
                try:
                    plan()
                    seen.append("returned")
                except Exception as error:
                    seen.append(type(error).__name__)
        def close():
            closer.append(threading.get_ident())
            gc.set_threshold(1)   # a collection at nearly every allocation inside close()
            try:
                plan.close()
            finally:
                gc.set_threshold(700)
        gc.callbacks.append(callback)
        finished, error = bounded(close)
        report(finished=finished, error=error, seen=seen, closed=plan.closed)
    """)
    assert result["finished"], f"close() deadlocked in a nested call: {result}"
    assert result["error"] is None and result["closed"]
    assert result["seen"] in (["called", "RuntimeError"], ["called", "HandleClosedError"])


@needs_helper
def test_a_plan_called_from_a_gc_callback_during_its_call_is_refused():
    result = _run_child("""
        seen = []
        def callback(phase, info):
            if phase == "start" and not seen and plan._owner == threading.get_ident():
                seen.append("called")
                try:
                    plan()
                    seen.append("returned")
                except Exception as error:
                    seen.append(type(error).__name__)
        gc.callbacks.append(callback)
        bits = []
        def call():
            gc.set_threshold(1)
            try:
                for _ in range(3):
                    grad_x, _ = plan(d_gy, synchronize=True)   # (from Python: the plan's lock is held)
            finally:
                gc.set_threshold(700)
            bits.append(np.array_equal(grad_x.to_numpy().view(np.uint32), want.view(np.uint32)))
        finished, error = bounded(call)
        report(finished=finished, error=error, seen=seen, bits=bits)
    """)
    assert result == {"finished": True, "error": None, "seen": ["called", "RuntimeError"], "bits": [True]}


@needs_helper
@pytest.mark.parametrize("value", [2, np.True_, None], ids=["two", "numpy-true", "none"])
def test_synchronize_values_behave_alike_on_both_call_paths(value):
    gy, x = _case()
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream) as plan:
        plan(synchronize=True)
        outcomes = []
        for arguments in ((), (d_gy,)):
            try:
                plan(*arguments, synchronize=value)
                stream.synchronize()
                outcomes.append("ok" if _same_bits(out.to_numpy(), _want(gy, x)) else "wrong bits")
            except Exception as error:   # a refusal must name the argument
                outcomes.append("names synchronize" if "synchronize" in str(error) else repr(error))
        assert outcomes[0] == outcomes[1] and outcomes[0] in ("ok", "names synchronize"), outcomes


def _thread_result(target):
    """Runs target on a new thread: (the thread's identity, what target returned or raised)."""
    box = {}

    def run():
        box["ident"] = threading.get_ident()
        try:
            box["value"] = target()
        except Exception as error:
            box["value"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    return box["ident"], box["value"]


@needs_helper
def test_a_new_thread_that_reuses_an_ended_callers_identity_gets_a_device_before_its_launch():
    gy, x = _case(rows=4, hidden=16, seed=37)
    want = _want(gy, x)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream) as plan:
        def two_calls():
            plan(synchronize=True)   # (checked from Python: this thread may now call from C)
            return plan(synchronize=True)[0]

        def first_call():
            try:
                return plan(synchronize=True)[0]
            except Exception as error:
                return error

        # The C helper tells threads apart by a number it never gives twice, where identities
        # are reused: each of these threads ends before the next starts.
        numbers = []
        for _ in range(20):
            ended, value = _thread_result(two_calls)
            assert value is out
            _, number = _thread_result(plan._this_thread)
            numbers.append(number)
            reused, value = _thread_result(first_call)
            assert value is out, f"the first call of a thread (identity reused: {reused == ended}) failed: {value!r}"
        assert len(set(numbers)) == len(numbers) and 0 not in numbers, numbers
        assert _same_bits(out.to_numpy(), want)


@needs_helper
def test_threads_calling_and_rebinding_one_plan_while_another_closes_an_unrelated_array():
    """Calls from C, calls that rebind grad_x between two outputs, with and without synchronize,
    and a stream of closes of unrelated arrays (each moves the close epoch: calls in C overlap
    them): every call returns an output that holds its bits, nothing fails, nothing leaks."""
    gy, x = _case(rows=5, hidden=24, seed=9)
    want = _want(gy, x)
    before = _idle_counts()
    errors, wrong = [], []
    stop = threading.Event()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out_a, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out_b, acl_swiglu.Stream() as stream, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out_a, stream=stream) as plan:
        # (all alive from the first call to the last: no identity of an ended caller is reused,
        # which the test above shows is a bug of its own)
        started, finished = threading.Barrier(3), threading.Barrier(3)

        def caller(index):
            try:
                started.wait(30)
                for turn in range(60):
                    if index == 0 and turn % 3 == 0:
                        grad_x, _ = plan(grad_x=out_b if turn % 2 else out_a, synchronize=turn % 2 == 0)
                    else:
                        grad_x, _ = plan(synchronize=turn % 2 == 0)
                    if grad_x is not out_a and grad_x is not out_b:
                        wrong.append(("not a bound output", grad_x))
                stream.synchronize()
            except BaseException as error:
                errors.append(error)
            finally:
                finished.wait(30)

        def closer():
            while not stop.is_set():
                acl_swiglu.DeviceArray.empty((4,), np.float32).close()

        _race([threading.Thread(target=caller, args=(i,)) for i in range(3)], closer, stop)
        assert not errors and not wrong, (errors, wrong)
        stream.synchronize()
        for output in (out_a, out_b):
            assert _same_bits(output.to_numpy(), want)
    assert _idle_counts() == before


@needs_helper
def test_a_plan_rebound_to_an_overlapping_output_fails_each_call_then_recovers():
    """grad_x rebound onto x: every launch (from Python, then from C) is refused with the
    emulator's code; rebinding the real output back gives its bits again, from C too."""
    gy, x = _case(rows=4, hidden=24, seed=41)
    want = _want(gy, x)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream) as plan:
        plan(synchronize=True)
        for arguments in ({"grad_x": d_x}, {}, {}):
            with pytest.raises(acl_swiglu.AclError, match="overlaps x") as caught:
                plan(**arguments, synchronize=True)
            assert caught.value.code == 161002
        assert _same_bits(d_x.to_numpy(), x)   # nothing was written into x
        grad_x, _ = plan(grad_x=out, synchronize=True)
        assert grad_x is out
        out.to_numpy()
        for _ in range(2):
            grad_x, _ = plan()
            assert grad_x is out and _same_bits(grad_x.to_numpy(), want)


def test_a_plan_dropped_without_close_frees_everything_it_owned():
    gy, x = _case(rows=4, hidden=16, seed=43)
    before = _idle_counts()
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, stream=stream)
        grad_x, _ = plan(synchronize=True)
        assert _same_bits(grad_x.to_numpy(), _want(gy, x))
        plan(d_gy)   # (queued, not waited for)
        del plan, grad_x
        gc.collect()
    assert _idle_counts() == before


# ---- lean repeats of device-level calls ----

def test_a_lean_repeat_with_an_equal_scalar_of_another_object_is_a_new_call():
    """The memo compares scalars as the same objects: an equal float made anew (or the int 1
    for 1.0) is a new lean call, with its own memo; every call computes its own bits."""
    gy, x = _case(rows=4, hidden=20, seed=13)
    before = _idle_counts()
    operator = acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out:
        clamp = float("1.5")
        for _ in range(3):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=clamp, grad_x=out, stream=stream)
        last = operator.last_call
        assert last is not None and last.native and last.native[0] is not None   # the repeat was made in C
        other = float("1.") + 0.5
        assert other == clamp and other is not clamp
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=other, grad_x=out, stream=stream)
        assert operator.last_call is not last
        assert _same_bits(out.to_numpy(), _want(gy, x))
        want_one = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.0)[0]
        memos = []
        for clamp_one in (1.0, 1.0, 1.0, 1, 1, 1, 1.0):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=clamp_one, grad_x=out, stream=stream)
            memos.append(operator.last_call)
            assert _same_bits(out.to_numpy(), want_one), clamp_one
        # (a layout's first call validates it; then a lean call makes a memo that repeats keep;
        # the int, then the float again, are not repeats of the other's)
        assert memos[1] is memos[2] and memos[4] is memos[5] and memos[4] is not memos[2]
        assert memos[6] is not memos[5] and memos[6] is not memos[2]
    assert _idle_counts() == before


def test_lean_repeats_racing_release_cached_and_closes_of_unrelated_arrays():
    """Repeats on the default stream from two threads while a third calls release_cached() (the
    pooled workspace goes between and during repeats) and closes unrelated arrays."""
    gy, x = _case(rows=8, hidden=32, seed=17)
    want = _want(gy, x)
    before = _idle_counts()
    errors = []
    stop = threading.Event()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        outputs = [acl_swiglu.DeviceArray.empty(x.shape, np.float32) for _ in range(2)]

        def repeat(out):
            try:
                stream = acl_swiglu.Stream()
                with stream:
                    for _ in range(80):
                        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out,
                                                                  stream=stream)
                    stream.synchronize()
            except BaseException as error:
                errors.append(error)

        def disturb():
            while not stop.is_set():
                acl_swiglu.release_cached()
                acl_swiglu.DeviceArray.empty((8,), np.float32).close()

        _race([threading.Thread(target=repeat, args=(out,)) for out in outputs], disturb, stop)
        assert not errors, errors
        for out in outputs:
            assert _same_bits(out.to_numpy(), want)
            out.close()
    assert _idle_counts() == before


def _interrupt_once(monkeypatch, name, call):
    """Makes call(), during which acl_swiglu._aclnn.<name> behaves as before and then raises
    KeyboardInterrupt: what a signal handler does when the signal lands while that call runs
    (Python raises right after it returns)."""
    from acl_swiglu import _aclnn
    real = getattr(_aclnn, name)
    calls = []

    def interrupted(*args):
        real(*args)
        calls.append(args)
        raise KeyboardInterrupt

    monkeypatch.setattr(_aclnn, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        call()
    monkeypatch.undo()
    assert len(calls) == 1


def _free_stuck(group):
    """Takes a group that no call will leave out of the calls inside, and frees what its closes
    deferred (so that a failure here leaves nothing behind for the next test)."""
    from acl_swiglu import runtime
    for key, stay in list(runtime._inside.items()):
        if stay[0] is group:
            del runtime._inside[key]
    runtime._settle(group)
    acl_swiglu.release_cached()


def test_an_interrupt_right_after_a_lean_repeat_enters_its_group_leaks_nothing(monkeypatch):
    gy, x = _case(rows=4, hidden=20, seed=47)
    before = _idle_counts()
    with acl_swiglu.Stream() as stream:
        d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
        out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
        for _ in range(3):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        group = acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD.last_call.group
        _interrupt_once(monkeypatch, "enter", lambda: acl_swiglu.swiglu_group_quant_grad_device(
            d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream))
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        assert _same_bits(out.to_numpy(), _want(gy, x))
        for array in (d_gy, d_x, out):
            array.close()
    try:
        assert _idle_counts() == before
    finally:
        _free_stuck(group)


def test_an_interrupt_right_after_a_one_shot_holds_its_stream_leaks_nothing(monkeypatch):
    from acl_swiglu import _aclnn
    gy, x = _case(rows=4, hidden=20, seed=53)
    before = _idle_counts()
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)   # (the thread's stream exists)
    _interrupt_once(monkeypatch, "_held_thread_stream", lambda: acl_swiglu.swiglu_group_quant_grad(gy, x,
                                                                                                  clamp_limit=1.5))
    group = _aclnn._thread_state.group
    try:
        assert _same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0], _want(gy, x))
        assert _idle_counts() == before
    finally:
        _free_stuck(group)


# ---- one-shot NumPy calls ----

class _Tagged(np.ndarray):
    def __array_finalize__(self, obj):
        self.tag = getattr(obj, "tag", "tagged")


class _Slotted(np.ndarray):
    __slots__ = ("first", "second")


def test_one_shot_numpy_subclasses_give_the_bits_of_their_values(tmp_path):
    """The C helper reads each host array's data pointer from the array object: subclasses
    (with a __dict__, with __slots__, np.matrix, np.memmap read-write and read-only) keep it
    where an ndarray does."""
    gy, x = _case(rows=6, hidden=16, seed=23)
    want = _want(gy, x)
    before = _idle_counts()
    memmaps = []
    for name, array in (("g", gy), ("x", x)):
        mapped = np.memmap(tmp_path / name, dtype=np.float32, mode="w+", shape=array.shape)
        mapped[:] = array
        mapped.flush()
        memmaps.append(mapped)
    readonly = [np.memmap(tmp_path / name, dtype=np.float32, mode="r", shape=a.shape) for name, a in (("g", gy), ("x", x))]
    cases = {"tagged": (gy.view(_Tagged), x.view(_Tagged)), "slotted": (gy.view(_Slotted), x.view(_Slotted)),
             "matrix": (np.matrix(gy), np.matrix(x)), "memmap": tuple(memmaps), "memmap-readonly": tuple(readonly),
             "tagged-strided": (np.repeat(gy, 2, axis=0)[::2].view(_Tagged), x.view(_Tagged))}
    for name, (v_gy, v_x) in cases.items():
        grad_x, grad_w = acl_swiglu.swiglu_group_quant_grad(v_gy, v_x, clamp_limit=1.5)
        assert type(grad_x) is np.ndarray and grad_w is None, name
        assert _same_bits(grad_x, want), name
    del memmaps, readonly, cases
    gc.collect()
    assert _idle_counts() == before


@pytest.mark.parametrize("bad", ["object", "float64", "structured", "foreign-bfloat16-name"])
def test_one_shot_wrong_dtypes_are_refused_before_anything_is_allocated(bad):
    gy, x = _case(rows=3, hidden=8, seed=29)

    class bfloat16(np.void):   # a dtype whose name is "bfloat16" and is not ml_dtypes' one
        pass

    arrays = {"object": gy.astype(object), "float64": gy.astype(np.float64),
              "structured": np.zeros(gy.shape, [("bfloat16", "<u2")]),
              "foreign-bfloat16-name": np.zeros(gy.shape, np.dtype(bfloat16))}
    assert np.dtype(bfloat16).name == "bfloat16"
    before = _idle_counts()
    with pytest.raises(acl_swiglu.ArgumentError, match="grad_y has dtype"):
        acl_swiglu.swiglu_group_quant_grad(arrays[bad], x, clamp_limit=1.5)
    assert emulator.live_counts() == before   # (no thread stream made either)


def test_one_shot_zero_rows_and_a_resize_attempt_during_calls():
    """Zero rows give an empty result; a thread that tries to resize an input while calls read it
    is refused by NumPy (the caller and the call hold references), and every call keeps the bits."""
    empty_gy, empty_x = np.zeros((0, 16), np.float32), np.zeros((0, 32), np.float32)
    grad_x, grad_w = acl_swiglu.swiglu_group_quant_grad(empty_gy, empty_x, clamp_limit=1.5)
    assert grad_x.shape == (0, 32) and grad_x.dtype == np.float32 and grad_w is None
    gy, x = _case(rows=64, hidden=64, seed=31)
    want = _want(gy, x)
    shared = [x]
    refused, errors = [], []
    stop = threading.Event()

    def resizer():
        while not stop.is_set():
            try:
                shared[0].resize((1,))
            except ValueError:
                refused.append(1)

    thread = threading.Thread(target=resizer)
    thread.start()
    try:
        for _ in range(20):
            got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0]
            if not _same_bits(got, want):
                errors.append("bits")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive() and refused and not errors and x.shape == (64, 128)


# ---- the lazy bfloat16 ----

def test_bfloat16_first_used_from_several_threads_at_once():
    code = textwrap.dedent("""
        import json, sys, threading, warnings
        warnings.simplefilter("ignore")
        import numpy as np
        import acl_swiglu
        assert "ml_dtypes" not in sys.modules
        barrier = threading.Barrier(6)
        seen, errors = [], []
        def use(index):
            try:
                barrier.wait(10)
                if index % 3 == 0:
                    seen.append(acl_swiglu.bfloat16)
                elif index % 3 == 1:
                    seen.append(acl_swiglu.DeviceArray.empty((2, 4), "bfloat16").dtype)
                else:
                    seen.append(acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), "float32"),
                                                                   np.ones((2, 8), "float32"))[0].dtype)
            except BaseException as error:
                errors.append(repr(error))
        threads = [threading.Thread(target=use, args=(i,)) for i in range(6)]
        for thread in threads: thread.start()
        for thread in threads: thread.join(20)
        import ml_dtypes
        bf = np.dtype(ml_dtypes.bfloat16)
        print(json.dumps({"alive": any(t.is_alive() for t in threads), "errors": errors,
                          "bf": sum(1 for d in seen if d == bf), "f32": sum(1 for d in seen if d == np.float32),
                          "module_attr": acl_swiglu.bfloat16 == bf}))
    """)
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT, cwd=TESTS)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    assert lines, completed.stderr[-3000:]
    assert json.loads(lines[-1]) == {"alive": False, "errors": [], "bf": 4, "f32": 2, "module_attr": True}
