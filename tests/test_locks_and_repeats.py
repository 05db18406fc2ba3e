"""The locks and repeats where threads, interrupts and gc callbacks meet: device-level call
repeats (kept executors compared by serial numbers), owned streams' locks (a wait against a
destroy, code run during a wait), plans (their lock, rebinding, close), and one-shot calls under
the thread stream's lock.

Interruptions and "another thread / a gc callback acts right here" are injected at chosen lines
with a trace function, so every outcome is deterministic; threads are always joined with a
timeout, and scenarios that could deadlock run in a child process.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _device, _plan, emulator, errors

from swiglu_cases import (CLAMP, JOIN_TIMEOUT, Rigged, at_line, case, line_of, model, raiser, run_child,
                          run_threads, same_bits, want)

pytestmark = pytest.mark.emulator_only

ROWS, HIDDEN = 6, 16


def _at_line(function, text, action):
    """A context manager: while active, runs action(frame) once, the first time `function`
    reaches the line containing `text` (on this thread)."""
    return at_line(function.__code__, line_of(function, text), action)


def _interrupt(frame):
    raise KeyboardInterrupt


def _grouped(seed=21, rows=ROWS, hidden=HIDDEN):
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((rows, hidden)).astype(np.float32)
    x = rng.standard_normal((rows, 2 * hidden)).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, (rows, 1)).astype(np.float32)
    y_origin = rng.standard_normal((rows, hidden)).astype(np.float32)
    return gy, x, weight, y_origin


def _closing(stack_list, obj):
    stack_list.append(obj)
    return obj


@pytest.fixture
def owned():
    """Objects made by a test, closed at its end (newest first)."""
    made = []
    try:
        yield lambda obj: _closing(made, obj)
    finally:
        try:
            acl_swiglu.synchronize_device()
        finally:
            for obj in reversed(made):
                try:
                    obj.close()
                except errors.AclSwigluError:
                    pass


# ---- plans: a rebind that an interrupt cuts short leaves the plan wholly as it was or wholly rebound ----


def _grouped_plan(owned, host):
    """A revision-1 plan over these host arrays' copies and group_index [2, 3], called once, and
    those device arrays."""
    arrays = [owned(acl_swiglu.to_device(a)) for a in host]
    plan = owned(acl_swiglu.SwigluGroupQuantGradPlan(*arrays, [2, 3], CLAMP, stream=owned(acl_swiglu.Stream())))
    plan(synchronize=True)
    return plan, arrays


# Steps of a rebind: in _rebind up to the statement it takes effect in, then the next launch's
# _prepare (closing the executor it replaced, holding and binding what the plan is bound to).
_REBIND_LINES = [(_plan.Plan._rebind, "binding = self._regroup("), (_plan.Plan._rebind, "retired = self._retired"),
                 (_plan.Plan._rebind, "self._arrays, self._arguments"), (_plan.Plan._prepare, "self._close_retired()"),
                 (_plan.Plan._prepare, "self._use.hold_only(")]


@pytest.mark.parametrize("line", _REBIND_LINES, ids=lambda line: line[1])
@pytest.mark.parametrize("abi", [1], indirect=True)
def test_a_group_index_rebind_interrupted_at_any_step_is_all_or_nothing(abi, owned, line):
    gy, x, w, yo = _grouped()
    plan, _ = _grouped_plan(owned, (gy, x, w, yo))
    old = model(gy, x, w, yo, np.array([2, 3], np.int64), CLAMP)
    new = model(gy, x, w, yo, np.array([1, 2], np.int64), CLAMP)
    with _at_line(*line, _interrupt) as fired:
        with pytest.raises(KeyboardInterrupt):
            plan(group_index=[1, 2], synchronize=True)
    assert fired
    gx, gw = plan(synchronize=True)   # the plan as the interrupted rebind left it: old or new, never a mix
    got = (gx.to_numpy(), gw.to_numpy())
    assert any(same_bits(got[0], want_x) and same_bits(got[1], want_w) for want_x, want_w in (old, new))
    for _ in range(2):   # the same call made again gives its own values
        gx, gw = plan(group_index=[1, 2], synchronize=True)
        assert same_bits(gx.to_numpy(), new[0]) and same_bits(gw.to_numpy(), new[1])
    gx, gw = plan(group_index=[2, 3], synchronize=True)
    assert same_bits(gx.to_numpy(), old[0]) and same_bits(gw.to_numpy(), old[1])


@pytest.mark.parametrize("line", _REBIND_LINES, ids=lambda line: line[1])
@pytest.mark.parametrize("abi", [1], indirect=True)
def test_a_rebind_of_arrays_and_group_index_interrupted_then_repeated_computes_the_new_ones(abi, owned, line):
    first, second = _grouped(31), _grouped(32)
    plan, d1 = _grouped_plan(owned, first)
    d2 = [owned(acl_swiglu.to_device(a)) for a in second]
    old = model(*first, np.array([2, 3], np.int64), CLAMP)
    new = model(*second, np.array([1, 2], np.int64), CLAMP)
    with _at_line(*line, _interrupt) as fired:
        with pytest.raises(KeyboardInterrupt):
            plan(*d2, group_index=[1, 2], synchronize=True)
    assert fired
    gx, gw = plan(synchronize=True)
    got = (gx.to_numpy(), gw.to_numpy())
    assert any(same_bits(got[0], want_x) and same_bits(got[1], want_w) for want_x, want_w in (old, new))
    gx, gw = plan(*d2, group_index=[1, 2], synchronize=True)
    assert same_bits(gx.to_numpy(), new[0]) and same_bits(gw.to_numpy(), new[1])
    gx, gw = plan(*d1, group_index=[2, 3], synchronize=True)
    assert same_bits(gx.to_numpy(), old[0]) and same_bits(gw.to_numpy(), old[1])


def _live_handles():
    acl_swiglu.release_cached()
    gc.collect()
    acl_swiglu.release_cached()
    return emulator.live_counts()


# Before the one statement a rebind takes effect in, and after it.
_COMMIT_SIDES = [(_plan.Plan._rebind, "retired = self._retired"), (_plan.Plan._prepare, "self._close_retired()")]


@pytest.mark.parametrize("line", _COMMIT_SIDES, ids=lambda line: line[1])
@pytest.mark.parametrize("abi", [1], indirect=True)
def test_group_index_rebinds_interrupted_again_and_again_hold_no_extra_executor(abi, owned, line):
    gy, x, w, yo = _grouped()
    plan, _ = _grouped_plan(owned, (gy, x, w, yo))
    before = _live_handles()
    for turn in range(5):
        with _at_line(*line, _interrupt) as fired:
            with pytest.raises(KeyboardInterrupt):
                plan(group_index=[1 + turn % 2, 2], synchronize=True)
        assert fired
    gx, gw = plan(group_index=[2, 3], synchronize=True)
    old = model(gy, x, w, yo, np.array([2, 3], np.int64), CLAMP)
    assert same_bits(gx.to_numpy(), old[0]) and same_bits(gw.to_numpy(), old[1])
    assert _live_handles() == before   # one executor and its tensors, as before the interrupts


@pytest.mark.parametrize("line", _COMMIT_SIDES, ids=lambda line: line[1])
def test_arrays_an_interrupted_rebind_left_unbound_are_freed_when_closed(owned, line):
    (gy, x), (gy2, x2) = case(ROWS, HIDDEN, seed=4), case(ROWS, HIDDEN, seed=5)
    first = [owned(acl_swiglu.to_device(a)) for a in (gy, x)]
    second = [owned(acl_swiglu.to_device(a)) for a in (gy2, x2)]
    stream = owned(acl_swiglu.Stream())
    plan = owned(acl_swiglu.SwigluGroupQuantGradPlan(*first, clamp_limit=CLAMP, stream=stream))
    plan(synchronize=True)
    with _at_line(*line, _interrupt) as fired:
        with pytest.raises(KeyboardInterrupt):
            plan(*second, synchronize=True)
    assert fired
    gx, _ = plan(synchronize=True)
    rebound = line != _COMMIT_SIDES[0]
    assert same_bits(gx.to_numpy(), want(gy2, x2) if rebound else want(gy, x))
    unbound = first if rebound else second
    before = _live_handles()["allocation"]
    for array in unbound:
        array.close()
    assert _live_handles()["allocation"] == before - 2


@pytest.mark.parametrize("abi", [1], indirect=True)
def test_an_executor_a_rebind_replaced_is_freed_while_the_interrupts_traceback_is_kept(abi, owned):
    gy, x, w, yo = _grouped()
    plan, _ = _grouped_plan(owned, (gy, x, w, yo))
    before = _live_handles()
    kept = []
    with _at_line(_plan.Plan._prepare, "self._close_retired()", _interrupt) as fired:
        try:
            plan(group_index=[1, 2], synchronize=True)
        except KeyboardInterrupt:
            kept.append(sys.exc_info())   # (as sys.last_traceback keeps it in an interactive session)
    assert fired
    gx, gw = plan(synchronize=True)
    new = model(gy, x, w, yo, np.array([1, 2], np.int64), CLAMP)
    assert same_bits(gx.to_numpy(), new[0]) and same_bits(gw.to_numpy(), new[1])
    assert _live_handles() == before   # the replaced executor is freed; the new one took its place
    kept.clear()


# ---- streams: what a destroyed stream leaves behind ----


def test_arrays_read_on_many_short_lived_streams_keep_none_of_them(owned):
    gy, x = case(ROWS, HIDDEN, seed=1)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    gc.collect()
    streams_before = emulator.live_counts()["stream"]
    watched = []
    for _ in range(200):
        with acl_swiglu.Stream() as stream:
            watched.append(weakref.ref(stream._life))
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
    _live_handles()
    assert same_bits(out.to_numpy(), want(gy, x))
    assert emulator.live_counts()["stream"] == streams_before
    kept = sum(reference() is not None for reference in watched)
    # (a bounded few: the one each kept executor of the layout last launched on, eight at most,
    # and the last one, which read the arrays)
    assert kept <= 9, f"{kept} of 200 destroyed streams are still referenced"


def test_a_stream_borrowed_again_for_each_call_is_one_reader(owned):
    gy, x = case(ROWS, HIDDEN, seed=2)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    native = owned(acl_swiglu.Stream())
    watched = []
    for _ in range(50):
        borrowed = acl_swiglu.Stream.from_handle(native.handle)
        watched.append(weakref.ref(borrowed._life))
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=borrowed)
        del borrowed
    _live_handles()
    kept = sum(reference() is not None for reference in watched)
    assert kept <= 9, f"{kept} of 50 wrappers of one stream are still referenced"   # (as above)
    d_gy.copy_from(np.zeros_like(gy))   # (waits for the queued readers first)
    assert same_bits(out.to_numpy(), want(gy, x))


# ---- plans: close() while another thread closes the plan's stream ----


def test_a_plan_closes_cleanly_when_another_thread_closes_its_stream_meanwhile(owned):
    gy, x = case(ROWS, HIDDEN, seed=1)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    stream = acl_swiglu.Stream()

    def other_thread_closes_the_stream(frame):
        thread = threading.Thread(target=stream.close, daemon=True)
        thread.start()
        thread.join(JOIN_TIMEOUT)
        assert not thread.is_alive()

    # Reference behaviour: the stream closed before the plan's close -> close() succeeds.
    with acl_swiglu.Stream() as early:
        plan0 = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=early)
        plan0()
        early.close()
        plan0.close()
    plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream)
    plan()
    try:
        with _at_line(_plan.Plan.close, "self._stream.synchronize()", other_thread_closes_the_stream) as fired:
            plan.close()   # must not raise: the plan is closed and everything released either way
        assert fired
    finally:
        plan.close()
        stream.close()
    assert plan.closed


# ---- owned streams: two threads, each closing the other's stream from code run during its own wait ----
# (What a gc callback may do.) Run in a child process: a deadlock there is killed at the time limit.


_ABBA = r"""
import inspect, json, os, sys, threading
import acl_swiglu
from acl_swiglu import _device
code = _device.StreamLife.wait.__code__
lines, first = inspect.getsourcelines(_device.StreamLife.wait)
line = first + [i for i, l in enumerate(lines) if "status = 0 if self.destroyed" in l][0]
s1, s2 = acl_swiglu.Stream(), acl_swiglu.Stream()
barrier = threading.Barrier(2, timeout=20)
result = {}

def make(mine, other, name):
    fired = []
    def local(frame, event, arg):
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(1)
            barrier.wait()     # both threads are inside their wait, each holding its stream's lock
            other.close()      # what a gc callback running during the wait may do
        return local
    def run():
        sys.settrace(lambda f, e, a: local if f.f_code is code else None)
        try:
            mine.synchronize()
            result[name] = "ok"
        except Exception as exc:
            result[name] = type(exc).__name__
        finally:
            sys.settrace(None)
    return run

threads = [threading.Thread(target=make(s1, s2, "a"), daemon=True),
           threading.Thread(target=make(s2, s1, "b"), daemon=True)]
for t in threads: t.start()
import time
deadline = time.monotonic() + 15   # (a deadlock is for ever; a working close takes milliseconds)
for t in threads: t.join(max(0.0, deadline - time.monotonic()))
print(json.dumps({"hung": any(t.is_alive() for t in threads), "result": result}), flush=True)
os._exit(0)
"""


def test_two_threads_closing_each_others_stream_during_their_waits_both_finish(tmp_path):
    report = run_child(_ABBA, tmp_path, timeout=90)
    assert not report["hung"], f"the two waits deadlocked on each other's stream lock: {report}"
    assert sorted(report["result"].values()) and all(v in ("ok", "HandleClosedError")
                                                     for v in report["result"].values()), report


# ---- device-level calls: only a device array repeats a device array ----


class _NotAnArray:
    """Answers every attribute as the array it wraps does (as a transparent proxy would)."""

    def __init__(self, array=None):
        self._array = array

    def __getattr__(self, name):
        return getattr(self._array, name)


def test_an_object_that_is_no_device_array_never_passes_for_a_repeat(owned):
    gy, x = case(ROWS, HIDDEN, seed=1)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    stream = owned(acl_swiglu.Stream())
    for _ in range(2):
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
    with pytest.raises(TypeError, match="x must be a DeviceArray"):   # (a fresh call's answer)
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, _NotAnArray(), clamp_limit=CLAMP, grad_x=out,
                                                  stream=stream)
    for _ in range(2):
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
    with pytest.raises(TypeError, match="x must be a DeviceArray"):
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, _NotAnArray(d_x), clamp_limit=CLAMP, grad_x=out,
                                                  stream=stream)


# ---- owned streams: closes, releases and nested waits run during a wait on the same thread ----


@pytest.mark.parametrize("during", ["close", "close+release_cached", "nested wait", "close+nested wait"])
def test_code_run_during_a_wait_on_the_same_thread(owned, during):
    """What a gc callback might do while to_numpy() waits for the writer (the stream's lock held
    by this thread): the free of the stream is put off until the wait ends, the data read is the
    computed one, and the stream is freed right after."""
    gy, x = case(32, 64, seed=2)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    stream = acl_swiglu.Stream()
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
    streams_before = emulator.live_counts()["stream"]
    seen = {}

    def action(frame):
        life = frame.f_locals["self"]
        seen["owned"] = life.lock._is_owned()
        if "close" in during:
            stream.close()
            seen["alive after close"] = emulator.live_counts()["stream"] == streams_before
        if "release_cached" in during:
            acl_swiglu.release_cached()
        if "nested" in during:
            seen["nested"] = same_bits(out.to_numpy(), want(gy, x))

    with _at_line(_device.StreamLife.wait, "status = 0 if self.destroyed", action) as fired:
        got = out.to_numpy()
    assert fired and seen["owned"]
    assert same_bits(got, want(gy, x))
    if "close" in during:
        assert seen["alive after close"], "the stream was destroyed under its own wait"
        assert emulator.live_counts()["stream"] == streams_before - 1, "the put-off free never happened"
        with pytest.raises(errors.HandleClosedError):
            stream.synchronize()
    else:
        stream.close()
    if "nested" in during:
        assert seen["nested"]


def test_threads_closing_a_stream_while_others_synchronize_it():
    """Many rounds: one stream, work queued, three threads synchronizing it in a loop while a
    fourth closes it. Every synchronize returns or raises HandleClosedError; nothing hangs, the
    results are right and every handle goes."""
    gy, x = case(16, 64, seed=3)
    expected = want(gy, x)
    before = emulator.live_counts()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        for round_ in range(12):
            stream = acl_swiglu.Stream()
            out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
            for _ in range(3):
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
            outcomes = []
            start = threading.Barrier(4, timeout=JOIN_TIMEOUT)

            def sync():
                start.wait()
                for _ in range(20):
                    try:
                        stream.synchronize()
                        outcomes.append("ok")
                    except errors.HandleClosedError:
                        outcomes.append("closed")

            def close():
                start.wait()
                stream.close()

            failures = run_threads([sync, sync, sync, close])
            assert not failures, failures
            assert set(outcomes) <= {"ok", "closed"} and len(outcomes) == 60, (round_, outcomes)
            assert same_bits(out.to_numpy(), expected), round_
            out.close()
    gc.collect()
    acl_swiglu.release_cached()
    assert emulator.live_counts() == before


# ---- plans: failed rebinds, shared plans, use after close ----


def test_a_rebind_failing_halfway_leaves_the_plan_as_it_was(owned):
    """grad_y rebound to a good array, x to one whose address read fails (code run inside the
    call raises): the call fails, and the plan still computes from its old arrays (bit for bit),
    also after an unchecked epoch."""
    (gy, x), (gy2, x2) = case(ROWS, HIDDEN, seed=4), case(ROWS, HIDDEN, seed=5)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    d_gy2, d_x2 = owned(acl_swiglu.to_device(gy2)), owned(acl_swiglu.to_device(x2))
    bad = Rigged.over(d_x2)
    stream = owned(acl_swiglu.Stream())
    plan = owned(acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream))
    plan(synchronize=True)
    for _ in range(3):
        bad.arm(raiser(RuntimeError("address exploded")))
        with pytest.raises(RuntimeError, match="address exploded"):
            plan(d_gy2, bad, synchronize=True)
        gx, _ = plan(synchronize=True)
        assert same_bits(gx.to_numpy(), want(gy, x)), "the failed rebind changed the plan"
    gx, _ = plan(d_gy2, d_x2, synchronize=True)
    assert same_bits(gx.to_numpy(), want(gy2, x2))


def test_a_rebind_whose_array_closes_itself_while_bound_fails_and_the_plan_recovers(owned):
    """x's address getter closes that very array (code run inside the plan's call): the call
    fails with HandleClosedError, nothing is launched on freed memory, and rebinding a good x
    makes the plan work again."""
    (gy, x), (_, x2) = case(ROWS, HIDDEN, seed=6), case(ROWS, HIDDEN, seed=7)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    victim = acl_swiglu.to_device(x2)
    rigged = Rigged.over(victim)
    rigged.arm(victim.close)
    stream = owned(acl_swiglu.Stream())
    plan = owned(acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream))
    plan(synchronize=True)
    with pytest.raises(errors.HandleClosedError):
        plan(x=rigged, synchronize=True)
    stream.synchronize()
    gx, _ = plan(x=d_x, synchronize=True)
    assert same_bits(gx.to_numpy(), want(gy, x))


@pytest.mark.parametrize("abi", [1], indirect=True)
def test_threads_sharing_one_plan_each_with_its_own_host_group_index(abi, owned):
    """Revision 1: every call of a shared plan regroups (host counts read at phase 1: a new
    executor each time) to its own arrays and counts; each thread's output is its own result."""
    gy, x, w, yo = _grouped(41)
    d = [owned(acl_swiglu.to_device(a)) for a in (gy, x, w, yo)]
    stream = owned(acl_swiglu.Stream())
    plan = owned(acl_swiglu.SwigluGroupQuantGradPlan(*d, [2, 3], CLAMP, stream=stream))
    counts = [[1, 1], [2, 3], [0, 6], [3, 0], [1, 2], [6, 0]]
    outs = [(owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32)),
             owned(acl_swiglu.DeviceArray.empty(w.shape, np.float32))) for _ in counts]
    wrong = []

    def worker(index):
        def run():
            groups = counts[index]
            want_x, want_w = model(gy, x, w, yo, np.array(groups, np.int64), CLAMP)
            for _ in range(8):
                gx, gw = plan(group_index=groups, grad_x=outs[index][0], grad_weight=outs[index][1], synchronize=True)
                if not (same_bits(outs[index][0].to_numpy(), want_x) and same_bits(outs[index][1].to_numpy(), want_w)):
                    wrong.append(groups)
        return run

    failures = run_threads([worker(i) for i in range(len(counts))])
    assert not failures, failures
    assert not wrong, wrong


def test_a_plan_closed_by_another_thread_from_inside_a_call_argument_hook(owned):
    """x's address getter (run inside the plan's call, the plan's lock held) starts another
    thread that closes the plan and waits a bounded time for it: the close waits for the call
    (no deadlock thanks to the bounded wait), the call completes, and once it ends the close
    finishes and later calls are refused."""
    (gy, x), (_, x2) = case(ROWS, HIDDEN, seed=8), case(ROWS, HIDDEN, seed=9)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    d_x2 = owned(acl_swiglu.to_device(x2))
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    rigged = Rigged.over(d_x2)
    stream = owned(acl_swiglu.Stream())
    plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
    closer = threading.Thread(target=plan.close, daemon=True)
    seen = {}

    def hook():
        closer.start()
        closer.join(0.2)   # (bounded: the close must wait for this call to end)
        seen["closed during call"] = plan.closed

    rigged.arm(hook)
    gx, _ = plan(x=rigged, synchronize=True)
    closer.join(JOIN_TIMEOUT)
    assert not closer.is_alive()
    assert seen["closed during call"] is False
    assert gx is out and same_bits(out.to_numpy(), want(gy, x2))
    assert plan.closed
    with pytest.raises(errors.HandleClosedError):
        plan()


# ---- device-level repeats ----


def test_views_of_one_buffer_and_recreated_arrays_alternating_repeats(owned):
    """Argument sets alternate between an array and a second DeviceArray over the same buffer
    (same layout: another serial), arrays closed and re-made (often at the same address), and
    the memory rewritten between repeats: each call computes from the data it sees."""
    gy, x = case(ROWS, HIDDEN, seed=10)
    stream = owned(acl_swiglu.Stream())
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    d_gy = owned(acl_swiglu.to_device(gy))
    rng = np.random.default_rng(11)
    for round_ in range(6):
        d_x = acl_swiglu.to_device(x)
        view = acl_swiglu.DeviceArray(d_x.buffer, d_x.shape, d_x.dtype, d_x.strides, d_x.offset)
        for array in (d_x, view, d_x, view):
            for _ in range(2):
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, array, clamp_limit=CLAMP, grad_x=out, stream=stream)
                assert same_bits(out.to_numpy(), want(gy, x)), round_
            x = rng.standard_normal(x.shape).astype(np.float32)
            view.copy_from(x)
        view.close()
        with pytest.raises(errors.HandleClosedError):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
        d_x.close()


def test_an_output_aliasing_an_input_is_refused_between_good_repeats(owned):
    """A repeat, then a call whose grad_x is a view of x's memory (refused: the operator does not
    work in place), then the repeat again: right bits, and x never written."""
    gy, x = case(ROWS, HIDDEN, seed=12)
    d_gy, d_x = owned(acl_swiglu.to_device(gy)), owned(acl_swiglu.to_device(x))
    out = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    alias = acl_swiglu.DeviceArray(d_x.buffer, d_x.shape, d_x.dtype, d_x.strides, d_x.offset)
    stream = owned(acl_swiglu.Stream())
    for _ in range(3):
        for _ in range(2):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
            assert same_bits(out.to_numpy(), want(gy, x))
        with pytest.raises(errors.AclSwigluError):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=alias, stream=stream)
            stream.synchronize()
        assert same_bits(d_x.to_numpy(), x), "x was written"


def test_an_array_closed_by_a_gc_callback_between_a_repeats_take_and_its_launch(owned):
    """Code run right after a repeat took its kept executor out of the pool (as a gc callback
    may) closes one of its arrays: that call fails naming it, nothing runs on the freed memory,
    and the other argument set keeps repeating with right bits."""
    (gy, x), (gy2, x2) = case(ROWS, HIDDEN, seed=13), case(ROWS, HIDDEN, seed=14)
    d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
    d_gy2, d_x2 = owned(acl_swiglu.to_device(gy2)), owned(acl_swiglu.to_device(x2))
    out, out2 = owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32)), \
        owned(acl_swiglu.DeviceArray.empty(x.shape, np.float32))
    stream = owned(acl_swiglu.Stream())
    from acl_swiglu import _aclnn
    for _ in range(2):
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
        acl_swiglu.swiglu_group_quant_grad_device(d_gy2, d_x2, clamp_limit=CLAMP, grad_x=out2, stream=stream)

    def close_x(frame):
        if frame.f_locals.get("kept") is not None:
            d_x.close()

    with _at_line(_aclnn.device_call, "if kept is not None:", close_x):
        with pytest.raises(errors.HandleClosedError, match="x"):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)
    stream.synchronize()
    d_gy.close()
    for _ in range(2):
        acl_swiglu.swiglu_group_quant_grad_device(d_gy2, d_x2, clamp_limit=CLAMP, grad_x=out2, stream=stream)
        assert same_bits(out2.to_numpy(), want(gy2, x2))


# ---- one-shot calls ----


class _HostSub(np.ndarray):
    pass


def _host_forms(array, form):
    if "swapped" in form:
        array = array.astype(array.dtype.newbyteorder("S"))
    if "strided" in form:
        big = np.zeros((array.shape[0], array.shape[1] * 2), array.dtype)
        big[:, ::2] = array
        array = big[:, ::2]
    if "sub" in form:
        array = array.view(_HostSub)
    if "readonly" in form:
        array = array.copy() if "strided" not in form else array
        array.flags.writeable = False
    return array


FORMS = ["plain", "swapped", "strided", "sub", "swapped+strided", "swapped+sub", "strided+sub+readonly",
         "swapped+strided+sub+readonly"]


@pytest.mark.parametrize("form", FORMS)
def test_one_shot_host_forms_repeated_and_interleaved(form):
    """Each host form (byte-swapped, strided, ndarray subclass, read-only, combined) of the same
    values, called twice and interleaved with the plain form (layouts kept per key): bit for bit
    the plain result, inputs untouched."""
    gy, x, w, yo = _grouped(51)
    groups = np.array([2, 3], np.int64)
    want_x, want_w = model(gy, x, w.reshape(-1), yo, groups, CLAMP)
    for _ in range(2):
        for which in (form, "plain"):
            args = [_host_forms(a, which) for a in (gy, x, yo)]
            g = groups.astype(groups.dtype.newbyteorder("S")) if "swapped" in which else groups
            copies = [np.array(a, copy=True) for a in args]
            gx, gw = acl_swiglu.swiglu_group_quant_grad(args[0], args[1], w.reshape(-1), args[2], g, CLAMP)
            assert same_bits(gx, want_x) and same_bits(gw, want_w), which
            assert all(np.array_equal(a, c) for a, c in zip(args, copies)), "an input was modified"


def test_one_shot_calls_from_a_gc_callback_during_a_one_shot_on_the_same_thread():
    """A gc callback that makes a one-shot call (and a release_cached()) while this thread's
    one-shot is anywhere in its course: every call gives its own bits, nothing stays held."""
    (gy, x), (gy2, x2) = case(ROWS, HIDDEN, seed=15), case(ROWS, HIDDEN, seed=16)
    expected, expected2 = want(gy, x), want(gy2, x2)
    inner = []
    busy = [False]

    def callback(phase, info):
        if phase != "start" or busy[0] or threading.current_thread() is not threading.main_thread():
            return
        busy[0] = True
        try:
            gx, _ = acl_swiglu.swiglu_group_quant_grad(gy2, x2, clamp_limit=CLAMP)
            inner.append(same_bits(gx, expected2))
            if len(inner) % 3 == 0:
                acl_swiglu.release_cached()
        finally:
            busy[0] = False

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        for _ in range(15):
            gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)
            assert same_bits(gx, expected)
    finally:
        gc.callbacks.remove(callback)
        gc.set_threshold(*threshold)
    assert inner and all(inner), inner


def test_release_cached_from_another_thread_at_the_moment_of_a_one_shot_helper_call():
    """release_cached() on another thread (one bound to a device: it frees at once), started
    right before the one-shot's helper call (this thread holds its stream's lock, the stream
    checked open): it waits for the call, the call gives its bits, and the stream is destroyed
    after it (a new one is made by the next call)."""
    from acl_swiglu import _aclnn
    gy, x = case(ROWS, HIDDEN, seed=17)
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)   # (this thread's stream exists)
    state = {}

    def release_elsewhere(frame):
        def release():
            acl_swiglu.synchronize_device()   # (bound: its frees are made now, not left due)
            acl_swiglu.release_cached()
        thread = threading.Thread(target=release, daemon=True)
        thread.start()
        thread.join(0.3)   # (bounded: it must wait for the helper call)
        state["waited"] = thread.is_alive()
        state["thread"] = thread

    with _at_line(_aclnn.one_shot, "status = api.hot.acl_swiglu_one_shot(", release_elsewhere):
        gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)
    state["thread"].join(JOIN_TIMEOUT)
    assert not state["thread"].is_alive()
    assert state["waited"], "release_cached() destroyed the stream under a one-shot call"
    assert same_bits(gx, want(gy, x))
    gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)
    assert same_bits(gx, want(gy, x))


# ---- fork while another thread is inside a stream wait; set_device with threads ----

_FORK_DURING_WAIT = r"""
import inspect, json, os, sys, threading, time
import numpy as np
import acl_swiglu
from acl_swiglu import _device, emulator
from swiglu_cases import case, want, same_bits

gy, x = case(16, 64, seed=18)
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
stream = acl_swiglu.Stream()
plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
plan()
code = _device.StreamLife.wait.__code__
lines, first = inspect.getsourcelines(_device.StreamLife.wait)
line = first + [i for i, l in enumerate(lines) if "status = 0 if self.destroyed" in l][0]
inside, leave = threading.Event(), threading.Event()
fired = []

def local(frame, event, arg):
    if event == "line" and frame.f_lineno == line and not fired:
        fired.append(1)
        inside.set()
        leave.wait(30)       # holds the stream's lock while the main thread forks
    return local

def waiter():
    sys.settrace(lambda f, e, a: local if f.f_code is code else None)
    try:
        stream.synchronize()
    finally:
        sys.settrace(None)

thread = threading.Thread(target=waiter, daemon=True)
thread.start()
assert inside.wait(30)
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    report = {}
    def attempt(name, action):
        try:
            action()
            report[name] = "ok"
        except acl_swiglu.AclError as exc:
            report[name] = exc.code
        except Exception as exc:
            report[name] = type(exc).__name__
    attempt("synchronize", stream.synchronize)
    attempt("to_numpy", out.to_numpy)
    attempt("one_shot", lambda: acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5))
    attempt("device_call", lambda: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5,
                                                                             grad_x=out, stream=stream))
    attempt("plan", plan)
    attempt("plan.close", plan.close)
    attempt("stream.close", stream.close)
    attempt("array.close", out.close)
    attempt("release_cached", acl_swiglu.release_cached)
    os.write(write, json.dumps(report).encode())
    os.close(write)
    sys.exit(0)
os.close(write)
deadline = time.monotonic() + 60
status = None
while time.monotonic() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.05)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    status = "hung"
child = os.read(read, 65536).decode()
leave.set()
thread.join(30)
ok = same_bits(out.to_numpy(), want(gy, x))
plan.close(); stream.close(); out.close(); d_gy.close(); d_x.close()
acl_swiglu.release_cached()
print(json.dumps({"status": status, "child": json.loads(child or "{}"), "parent_ok": ok,
                  "thread_done": not thread.is_alive(), "live": emulator.live_counts()}))
"""


def test_fork_while_another_thread_holds_a_stream_lock_in_its_wait(tmp_path):
    """A parent thread is inside stream.synchronize() (holding the stream's lock) when the main
    thread forks: in the child every ACL use is refused with AclError 100001 and every close /
    release_cached() only drops objects (none waits for the lock the child inherited held); the
    child exits 0; the parent finishes its wait and its results are right."""
    report = run_child(_FORK_DURING_WAIT, tmp_path, timeout=120)
    assert report["status"] == 0, report
    child = report["child"]
    for name in ("synchronize", "to_numpy", "one_shot", "device_call", "plan"):
        assert child[name] == 100001, (name, report)
    for name in ("plan.close", "stream.close", "array.close", "release_cached"):
        assert child[name] == "ok", (name, report)
    assert report["parent_ok"] and report["thread_done"], report
    assert not any(report["live"].values()), report


_SET_DEVICE_THREADS = r"""
import json, threading
import numpy as np
import acl_swiglu
from acl_swiglu import emulator
from swiglu_cases import case, want, same_bits

gy, x = case(6, 16, seed=19)
expected = want(gy, x, 1.5)
bad = []
errors = []

def one_shots():
    for i in range(40):
        try:
            gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
            if not same_bits(gx, expected):
                bad.append(i)
        except Exception as exc:
            errors.append(repr(exc))

def switcher():
    for i in range(40):
        acl_swiglu.set_device(i % 2)
        acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
        if i % 5 == 0:
            acl_swiglu.release_cached()

threads = [threading.Thread(target=one_shots) for _ in range(3)] + [threading.Thread(target=switcher)]
for t in threads: t.start()
for t in threads: t.join(60)
hung = any(t.is_alive() for t in threads)
acl_swiglu.set_device(0)
acl_swiglu.release_cached()
import gc; gc.collect(); acl_swiglu.release_cached()
for device in (1, 0):
    acl_swiglu.set_device(device); acl_swiglu.release_cached()
print(json.dumps({"hung": hung, "bad": bad, "errors": errors[:5], "live": emulator.live_counts()}))
"""


def test_one_shots_on_threads_while_another_switches_devices_and_releases(tmp_path):
    """Two emulated devices: three threads make one-shot calls while a fourth switches the
    process's device back and forth (moving every thread without a device of its own) and
    calls release_cached(): every call gives its bits on whichever device, no hang, no leak."""
    report = run_child(_SET_DEVICE_THREADS, tmp_path, timeout=120, ACL_EMU_DEVICES="2")
    assert not report["hung"] and not report["bad"] and not report["errors"], report
    assert not any(report["live"].values()), report
