"""A plan call with nothing to rebind is one call into the C helper, which owns the plan while
it checks and launches; whatever it refuses is made from Python under the plan's lock. These
tests drive each of its refusals directly, and the interleavings that make them happen."""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _plan, emulator, errors

import device_model

JOIN_TIMEOUT = 60

pytestmark = pytest.mark.skipif(_plan._hotpath() is None, reason="the installed package has no C helper")


def _inputs(rows=6, hidden=24, seed=21):
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((rows, hidden)).astype(np.float32)
    x = rng.standard_normal((rows, 2 * hidden)).astype(np.float32)
    return gy, x


def _want(gy, x):
    return device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.5)[0]


def _same_bits(got, want):
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


def _kind(result):
    return result >> 32


class _Counted:
    """Counts the calls a plan makes from Python (everything the C helper refused)."""

    def __init__(self, plan):
        self.count = 0
        self._real = plan._call

    def __call__(self, *args):
        self.count += 1
        return self._real(*args)


@pytest.fixture
def plan_setup():
    gy, x = _inputs()
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream) as plan:
        yield plan, d_gy, d_x, out, _want(gy, x)


def test_a_repeated_call_is_made_in_c_after_one_from_python(plan_setup):
    plan, d_gy, d_x, out, want = plan_setup
    counted = plan._call = _Counted(plan)
    for _ in range(5):
        grad_x, grad_w = plan(synchronize=True)
        assert grad_x is out and grad_w is None
        assert _same_bits(out.to_numpy(sync=False), want)
    assert counted.count == 1   # the first call: its thread had not been checked yet
    for _ in range(3):
        grad_x, _ = plan()
        assert grad_x.pending is plan.stream   # queued from C, and marked so
        assert _same_bits(grad_x.to_numpy(), want)
    assert counted.count == 1
    with acl_swiglu.DeviceArray.empty((2,), np.float32):
        pass   # closing anything moves the close epoch
    plan(synchronize=True)
    plan(synchronize=True)
    assert counted.count == 2   # checked once from Python, then in C again
    plan(d_gy)                  # an argument: always from Python
    assert counted.count == 3


def test_another_thread_is_checked_from_python_first(plan_setup):
    plan, _, _, out, want = plan_setup
    plan(synchronize=True)
    counted = plan._call = _Counted(plan)
    results = []

    def other():
        for _ in range(3):
            results.append(plan(synchronize=True)[0])

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive()
    assert results == [out] * 3 and counted.count == 1
    assert _same_bits(out.to_numpy(), want)
    plan(synchronize=True)
    assert counted.count == 2   # back on the first thread: checked again


def test_a_caller_that_saw_older_outputs_is_refused(plan_setup):
    """The outputs a call returns are the ones it launched with: a rebinding between reading
    them and the launch makes the C call refuse, and Python make the call."""
    plan, d_gy, d_x, out, want = plan_setup
    plan(synchronize=True)
    stale = plan._bound_outputs[0]
    assert _kind(plan._calls[True](plan._call_arguments, stale)) == 0
    with acl_swiglu.DeviceArray.empty(out.shape, np.float32) as other:
        plan(grad_x=other, synchronize=True)   # rebinds the output: a new generation
        fresh = plan._bound_outputs[0]
        assert fresh != stale
        assert _kind(plan._calls[True](plan._call_arguments, stale)) == _plan._CHECK
        assert _kind(plan._calls[True](plan._call_arguments, fresh)) == 0
        assert _same_bits(other.to_numpy(), want)
        plan(grad_x=out, synchronize=True)


def test_an_owned_plan_is_refused_in_c_and_the_call_waits_for_its_owner(plan_setup):
    plan, _, _, out, want = plan_setup
    plan(synchronize=True)
    owned, leave = threading.Event(), threading.Event()

    def owner():
        plan._claim(plan._call_arguments)
        owned.set()
        leave.wait(JOIN_TIMEOUT)
        plan._release(plan._call_arguments)

    holder = threading.Thread(target=owner)
    holder.start()
    results = []
    caller = threading.Thread(target=lambda: results.append(plan(synchronize=True)))
    try:
        assert owned.wait(JOIN_TIMEOUT)
        generation = plan._bound_outputs[0]
        assert _kind(plan._calls[True](plan._call_arguments, generation)) == _plan._BUSY
        plan._release(plan._call_arguments)   # not this thread's to release: does nothing
        assert _kind(plan._calls[True](plan._call_arguments, generation)) == _plan._BUSY
        caller.start()
        caller.join(0.2)
        assert caller.is_alive() and not results   # waiting for the owner
    finally:
        leave.set()
        holder.join(JOIN_TIMEOUT)
        if caller.ident is not None:
            caller.join(JOIN_TIMEOUT)
    assert not holder.is_alive() and not caller.is_alive()
    assert results == [(out, None)]
    assert _same_bits(out.to_numpy(), want)


def test_a_claim_left_by_an_interrupted_call_does_not_hang_the_next(plan_setup):
    """An exception between owning the plan in C and letting it go (an interrupt in that
    window) leaves this thread's claim behind: the next call from this thread takes it as its
    own instead of waiting for itself, and lets it go."""
    plan, _, _, out, want = plan_setup
    plan(synchronize=True)
    results = []

    def stale_then_call():
        plan._claim(plan._call_arguments)   # as if this thread's last call never let go
        results.append(plan(synchronize=True))

    caller = threading.Thread(target=stale_then_call, daemon=True)   # (daemon: a hang fails, not blocks, the run)
    caller.start()
    caller.join(JOIN_TIMEOUT)
    assert not caller.is_alive(), "the call waited for its own thread's claim"
    assert results == [(out, None)] and _same_bits(out.to_numpy(), want)
    generation = plan._bound_outputs[0]
    assert _kind(plan._calls[True](plan._call_arguments, generation)) != _plan._BUSY   # let go


_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p)


def _launch_then(plan, action):
    """A phase 2 for the helper that launches, then runs `action` (from C, as another thread
    closing something during the launch would)."""
    real = plan._launch

    def launch(workspace, size, executor, stream):
        status = real(ctypes.c_void_p(workspace), ctypes.c_uint64(size), ctypes.c_void_p(executor),
                      ctypes.c_void_p(stream))
        action()
        return status

    return _LAUNCH(launch)


def test_a_close_during_the_c_launch_fails_the_call_only_if_the_plan_used_it(plan_setup):
    plan, d_gy, d_x, out, want = plan_setup
    plan(synchronize=True)
    real = plan._hot.launch
    unrelated = acl_swiglu.DeviceArray.empty((4,), np.float32)
    hook = _launch_then(plan, unrelated.close)
    plan._hot.launch = ctypes.cast(hook, ctypes.c_void_p).value
    try:
        grad_x, _ = plan(synchronize=True)   # launched in C; something else was closed meanwhile
    finally:
        plan._hot.launch = real
    assert grad_x is out and _same_bits(out.to_numpy(), want)
    plan(synchronize=True)
    with acl_swiglu.to_device(np.asarray(d_x.to_numpy())) as x2:
        plan(d_gy, x2, synchronize=True)
        plan(synchronize=True)   # (checked, so the next one is from C)
        hook = _launch_then(plan, x2.close)
        plan._hot.launch = ctypes.cast(hook, ctypes.c_void_p).value
        try:
            with pytest.raises(errors.HandleClosedError, match="x"):
                plan(synchronize=True)
        finally:
            plan._hot.launch = real
        # The plan pins what it is bound to: x2's memory stayed while the launch read it.
        with pytest.raises(errors.HandleClosedError):
            plan(synchronize=True)
        plan(x=d_x, synchronize=True)   # rebound to an open array: calls work again
        assert _same_bits(out.to_numpy(), want)


def test_a_closed_plan_refuses_calls_in_c(plan_setup):
    plan, _, _, _, _ = plan_setup
    plan(synchronize=True)
    generation = plan._bound_outputs[0]
    plan.close()
    assert _kind(plan._calls[True](plan._call_arguments, generation)) == _plan._CHECK
    with pytest.raises(errors.HandleClosedError, match="was closed"):
        plan(synchronize=True)


@pytest.mark.emulator_only
def test_a_failed_launch_from_c_names_the_call(plan_setup):
    plan, _, _, out, want = plan_setup
    plan(synchronize=True)
    for fault, api in (("aclnnSwigluGroupQuantGrad:1:507015", "aclnnSwigluGroupQuantGrad"),
                       ("aclrtSynchronizeStream:1:507035", "aclrtSynchronizeStream")):
        with emulator.inject_faults(fault):
            with pytest.raises(errors.AclError) as info:
                plan(synchronize=True)
        assert info.value.api == api and "injected fault" in info.value.message
    plan(synchronize=True)
    assert _same_bits(out.to_numpy(), want)


def test_calls_from_c_and_from_python_on_many_threads_keep_outputs_consistent():
    """Threads share one plan: some call it with nothing to rebind (from C), others rebind its
    output (from Python). Every call returns the output it wrote, which holds the right bits."""
    gy, x = _inputs(4, 16, seed=5)
    want = _want(gy, x)
    threads, iterations = 4, 60
    failures = []
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        outs = [acl_swiglu.DeviceArray.empty(x.shape, np.float32) for _ in range(threads)]
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5, grad_x=outs[0], stream=stream)
        barrier = threading.Barrier(threads)

        def worker(k):
            try:
                barrier.wait(JOIN_TIMEOUT)
                for i in range(iterations):
                    if k % 2 and i % 3 == 0:
                        got, _ = plan(grad_x=outs[k], synchronize=True)
                        if got is not outs[k]:
                            failures.append((k, i, "rebinding call returned another output"))
                    else:
                        got, _ = plan(synchronize=True)
                    if got not in outs:
                        failures.append((k, i, "unknown output"))
                    elif not _same_bits(got.to_numpy(sync=False), want):
                        failures.append((k, i, "wrong bits"))
            except BaseException as exc:   # reported below
                failures.append((k, "raised", repr(exc)))

        workers = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(JOIN_TIMEOUT)
        assert not any(w.is_alive() for w in workers)
        plan.close()
        for out in outs:
            out.close()
    assert not failures, failures[:5]


FORK_WHILE_OWNED = textwrap.dedent(r"""
    import os, threading, faulthandler
    faulthandler.dump_traceback_later(40, exit=True)
    import numpy as np
    import acl_swiglu
    from acl_swiglu import errors
    gy = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    x = np.linspace(-3, 3, 128, dtype=np.float32).reshape(4, 32)
    d = [acl_swiglu.to_device(a) for a in (gy, x)]
    plan = acl_swiglu.SwigluGroupQuantGradPlan(*d)
    want = plan(synchronize=True)[0].to_numpy()
    plan(synchronize=True)
    owned, leave = threading.Event(), threading.Event()

    def owner():
        plan._claim(plan._call_arguments)   # as a thread inside a plan call
        owned.set()
        leave.wait(30)
        plan._release(plan._call_arguments)

    holder = threading.Thread(target=owner)
    holder.start()
    owned.wait(10)
    pid = os.fork()
    if pid == 0:
        try:
            plan(synchronize=True)
            print("child call worked", flush=True)
        except errors.AclError as exc:
            print("child call refused", exc.code, flush=True)
        plan.close()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child status", status, flush=True)
    leave.set()
    holder.join(30)
    got = plan(synchronize=True)[0].to_numpy()
    print("parent ok", bool(np.array_equal(got.view(np.uint32), want.view(np.uint32))), flush=True)
""")


def test_fork_while_another_thread_owns_the_plan_refuses_the_child_without_hanging(tmp_path):
    script = tmp_path / "fork_owned.py"
    script.write_text(FORK_WHILE_OWNED)
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"hung: {stdout!r} {stderr[-3000:]!r}")
    assert proc.returncode == 0, (stdout, stderr[-3000:])
    assert "child call refused 100001" in stdout and "child status 0" in stdout, (stdout, stderr[-3000:])
    assert "parent ok True" in stdout, stdout
