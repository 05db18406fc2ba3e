"""The few checks that must look inside the package: what the public API cannot show (that a
plan's repeated call checks nothing while the epoch stands, that the kept executors are bounded),
and interleavings no public hook can force, made here by wrapping one internal step (a plan's
launch, the step of close() between marking an object dead and closing its handle). Everything
else is tested through the public API in the other modules."""

from __future__ import annotations

import os
import subprocess
import sys
import weakref

import numpy as np
import pytest

import acl_swiglu
import acl_swiglu.op
from acl_swiglu import _aclnn, emulator, errors, runtime

from swiglu_cases import CLAMP, case, idle_counts, same_bits, want

OPERATOR = acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD


@pytest.fixture
def plan_setup():
    gy, x = case(6, 24, seed=91)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(x) as d_x2, acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream) as plan:
        yield plan, d_gy, d_x, d_x2, out, want(gy, x)


def test_a_repeated_plan_call_checks_nothing_while_the_epoch_stands(plan_setup, monkeypatch):
    plan, d_gy, d_x, d_x2, out, expected = plan_setup
    checks = []
    real = plan._prepare
    monkeypatch.setattr(plan, "_prepare", lambda: (checks.append(runtime.state.epoch), real())[1])
    for _ in range(5):
        plan(synchronize=True)
    assert len(checks) == 1   # the first call only
    for _ in range(3):
        plan()
        assert same_bits(out.to_numpy(), expected)   # (a read records nothing)
    assert len(checks) == 1
    with acl_swiglu.DeviceArray.empty((2,), np.float32):
        pass   # a close anywhere moves the epoch
    plan()
    plan()
    assert len(checks) == 2
    plan(x=d_x2)   # a rebinding: checked
    plan(x=d_x2)   # the same array again: nothing to rebind, nothing to check
    assert len(checks) == 3
    assert same_bits(plan(synchronize=True)[0].to_numpy(), expected)


def test_the_kept_executors_are_bounded():
    before = idle_counts()
    with acl_swiglu.Stream() as stream:
        for rows in range(1, 21):
            gy, x = case(rows, 4, seed=rows)
            with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
                grad_x, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, stream=stream)
                with grad_x:
                    assert same_bits(grad_x.to_numpy(), want(gy, x, None))
            assert len(OPERATOR.kept) <= _aclnn._KEPT_EXECUTORS
            assert emulator.live_counts()["executor"] <= _aclnn._KEPT_EXECUTORS
    assert len(OPERATOR.kept) == _aclnn._KEPT_EXECUTORS
    assert idle_counts() == before and not OPERATOR.kept


def _launch_then(plan, action):
    """The plan's next launches run action() right after the launch, as another thread closing
    something during it would."""
    real = plan._launch_call

    def launch(argument, synchronize):
        result = real(argument, synchronize)
        action()
        return result

    plan._launch_call = launch
    return lambda: setattr(plan, "_launch_call", real)


def test_a_close_during_a_plan_launch_fails_the_call_only_if_the_plan_uses_it(plan_setup):
    plan, d_gy, d_x, d_x2, out, expected = plan_setup
    plan(synchronize=True)
    plan(synchronize=True)   # (the next launches at once)
    unrelated = acl_swiglu.DeviceArray.empty((4,), np.float32)
    restore = _launch_then(plan, unrelated.close)
    try:
        grad_x, _ = plan(synchronize=True)
    finally:
        restore()
    assert grad_x is out and same_bits(out.to_numpy(), expected)
    with acl_swiglu.to_device(d_x.to_numpy()) as x3:
        plan(x=x3, synchronize=True)
        plan(synchronize=True)
        restore = _launch_then(plan, x3.close)
        try:
            with pytest.raises(errors.HandleClosedError, match="x"):
                plan()
        finally:
            restore()
        plan.stream.synchronize()   # the launch read x3's memory, held by the plan until now
        with pytest.raises(errors.HandleClosedError):
            plan(synchronize=True)
    grad_x, _ = plan(x=d_x, synchronize=True)
    assert same_bits(grad_x.to_numpy(), expected)


def test_release_cached_during_a_device_level_launch():
    """release_cached() from another thread while a device-level call launches through its kept
    executor: the call completes with the right bits, and the executor is freed after it."""
    gy, x = case(5, 28, seed=92)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out:
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
        (binding,) = [k.binding for k in OPERATOR.kept if k.binding._addresses.get("grad_x") == out.ptr]
        real = binding._launch_call

        def launch(argument, synchronize):
            result = real(argument, synchronize)
            acl_swiglu.release_cached()
            return result

        binding._launch_call = launch
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
        assert binding.closed and not OPERATOR.kept
        assert same_bits(out.to_numpy(), want(gy, x, None))
    assert idle_counts()["executor"] == 0


def test_a_one_shot_stream_closed_as_soon_as_it_is_made_does_not_fail_the_call(monkeypatch):
    """release_cached() on another thread can close a thread's new one-shot stream the moment
    it is registered: the call still gives the model's bits, and nothing is left behind."""
    gy, x = case(5, 32, seed=93)
    expected = want(gy, x)
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)
    before = idle_counts()   # (this thread has no one-shot stream now)
    closed = []

    class ClosedOnSight(weakref.WeakSet):
        def add(self, stream):
            super().add(stream)
            if not closed:
                stream.close()
                closed.append(stream)

    monkeypatch.setattr(_aclnn, "_thread_streams", ClosedOnSight())
    assert same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)[0], expected) and closed
    assert same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)[0], expected)
    assert idle_counts() == before


def _inside_close(monkeypatch, owner, action):
    """Runs action() inside owner.close(), after the object is marked dead and before its handle
    is closed (where another thread's step can land)."""
    real = runtime._runtime.disown
    ran = []

    def disown(reference):
        if reference() is owner and not ran:
            ran.append(1)
            action()
        real(reference)

    monkeypatch.setattr(runtime._runtime, "disown", disown)
    return ran




def test_a_copy_that_lands_inside_close_works_or_is_refused(monkeypatch):
    gy, _ = case(4, 8, seed=94)
    array = acl_swiglu.to_device(gy)
    host = np.zeros_like(gy)
    outcome = []

    def copy():
        try:
            array.buffer.copy_to_host(host)
            outcome.append("copied" if same_bits(host, gy) else "wrong bytes")
        except errors.HandleClosedError:
            outcome.append("refused")
        except Exception as exc:   # judged below
            outcome.append(repr(exc))

    ran = _inside_close(monkeypatch, array.buffer, copy)
    array.close()
    assert ran and outcome[0] in ("copied", "refused"), outcome


def test_a_workspace_taken_while_another_thread_empties_the_pool(monkeypatch):
    """take_workspace() replaces a pooled buffer too small for the request; the pool is emptied
    (release_workspace() on another thread) while the old buffer is being closed: the caller,
    which holds the new buffer, still gets its address."""
    stream = acl_swiglu.Stream()
    use = runtime.Use((), stream._life)
    try:
        stream.take_workspace(64, use)
        (small,) = stream._pools.values()
        ran = _inside_close(monkeypatch, small, stream.release_workspace)
        address = stream.take_workspace(128, use)
        assert ran and isinstance(address, int) and address
    finally:
        use.let_go()
        stream.close()


def test_a_workspace_taken_as_the_stream_closes_is_freed_with_its_use():
    """take_workspace() from a call that overlaps the stream's close(): the call gets memory it
    holds, and the closed stream keeps none of it in its pool (freed once the call lets go)."""
    before = emulator.live_counts()
    stream = acl_swiglu.Stream()
    use = runtime.Use((), stream._life)
    try:
        stream.close()
        address = stream.take_workspace(256, use)
        assert isinstance(address, int) and address
        assert emulator.live_counts()["allocation"] == before["allocation"] + 1   # (held by the use)
    finally:
        use.let_go()
    acl_swiglu.release_cached()
    assert emulator.live_counts() == before


EXIT_ORDER = r"""
import atexit, ctypes, os, sys
order = []


def report():   # (registered first: runs after the package's own exit, which frees what is left)
    violations = sum(1 for executor, tensors in pairs
                     if any(order.index(t) < order.index(executor) for t in tensors if t in order))
    print("destroyed", len(order), "violations", violations, "pairs", len(pairs), flush=True)


atexit.register(report)
import numpy as np
import acl_swiglu
from acl_swiglu import _ffi
api = _ffi.api()
prototype = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)
for name in ("aclDestroyAclOpExecutor", "aclDestroyTensor"):
    original = getattr(api.raw, name)

    def spy(address, original=original):
        order.append(address)
        return original(ctypes.cast(address, original.argtypes[0]))

    setattr(api.raw, name, prototype(spy))
gy = np.linspace(-1, 1, 4 * 16, dtype=np.float32).reshape(4, 16)
x = np.linspace(-3, 3, 4 * 32, dtype=np.float32).reshape(4, 32)
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
plans = [acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x) for _ in range(40)]
pairs = [(p._binding._launch_args.executor, [ctypes.cast(t._life.handle, ctypes.c_void_p).value
                                             for t in p._binding._tensors.values()]) for p in plans]
for plan in plans:
    plan()
for plan in plans[:20]:
    plan.close()   # (the others are freed at exit)
"""


def test_an_executor_is_destroyed_before_its_tensors_at_close_and_at_exit(tmp_path):
    """Its tensors must outlive the executor made over them: closed together, or freed together at
    exit, the executor goes first."""
    script = tmp_path / "exit_order.py"
    script.write_text(EXIT_ORDER)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ACL_SWIGLU_BACKEND": "emulator"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    words = proc.stdout.split()
    assert words[0] == "destroyed" and int(words[1]) >= 40 * 3, proc.stdout
    assert words[2:4] == ["violations", "0"] and words[4:] == ["pairs", "40"], proc.stdout
