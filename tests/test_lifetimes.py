"""Object lifetimes under threads, forks and garbage collection, each class tested as a loop
that would catch the race:

1. close() from another thread while calls use the object: once close() has returned, no call
   that uses it succeeds, and its memory is never written after someone else got it;
2. every launch path x every read path: a read waits for the work queued to write what it reads;
3. closing a borrowed stream wrapper (Stream.from_handle, default_stream()) with work queued:
   reads still wait, and nothing queued work uses is freed;
4. a plan (or a device array) garbage-collected with a launch queued: its resources live until
   the stream has passed the work;
5. fork: while a parent thread is inside a plan, after only an import, after ACL was initialised
   (each in a subprocess with a time limit);
6. a gc callback calling the same plan during one of its calls: a clear error, never a deadlock;
7. 1000 short-lived threads making one-shot calls: their cached streams and workspaces go;
8. owners: subclasses with value equality, hundreds of plans dropped at once, one executor
   launched from two threads, an executor launched from a thread that never used the package.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import ExitStack, contextmanager

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import emulator, errors  # noqa: E402

pytestmark = pytest.mark.emulator_only

F32 = np.dtype(np.float32)
T, H = 8, 32
JOIN_TIMEOUT = 60.0
SENTINEL = np.float32(12345.0)


def case(seed: int):
    rng = np.random.default_rng(seed)
    gy = rng.uniform(-2, 2, (T, H)).astype(np.float32)
    x = rng.uniform(-3, 3, (T, 2 * H)).astype(np.float32)
    return gy, x


def want_of(gy, x):
    return device_model.swiglu_group_quant_grad_model(gy, x)[0]


def bits_equal(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def run_thread(target, *args):
    failures = []

    def body():
        try:
            target(*args)
        except BaseException as exc:   # reported by the test
            failures.append(exc)

    thread = threading.Thread(target=body)
    thread.start()
    return thread, failures


def join(thread):
    thread.join(JOIN_TIMEOUT)
    assert not thread.is_alive(), "a thread did not finish (hung)"


# ----------------------------------------------------------------------------- 1. close during use


def _plan_user(stack, stream, target):
    gy, x = (stack.enter_context(acl_swiglu.to_device(a)) for a in case(1))
    plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(gy, x, grad_x=target, stream=stream))
    return lambda: plan()


def _device_call_user(stack, stream, target):
    gy, x = (stack.enter_context(acl_swiglu.to_device(a)) for a in case(1))
    return lambda: acl_swiglu.swiglu_group_quant_grad_device(gy, x, grad_x=target, stream=stream)


def _executor_user(stack, stream, target):
    gy, x = (stack.enter_context(acl_swiglu.to_device(a)) for a in case(1))
    executor = stack.enter_context(acl_swiglu.get_workspace_size(gy, x, grad_x=target))
    executor.make_repeatable()
    return lambda: executor.launch(stream)


def _input_plan_user(stack, stream, target):
    """The closed array is an input (x) of the plan; the plan writes its own grad_x."""
    gy = stack.enter_context(acl_swiglu.to_device(case(1)[0]))
    plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(gy, target, stream=stream))
    return lambda: plan()


USERS = {"plan-output": _plan_user, "device-call-output": _device_call_user, "executor-output": _executor_user,
         "plan-input": _input_plan_user}
ROUNDS = 25


def close_during_calls(call, close, round_: int, after_close=lambda: None) -> dict:
    """A worker keeps calling call() while this thread runs close() after a few calls (a
    different number each round), then after_close(); the worker stops at its first call that
    started after close() returned. Returns what those calls did ("after": failed/succeeded)."""
    closed = threading.Event()
    outcome = {"before": 0}

    def worker():
        while True:
            started_after = closed.is_set()
            try:
                call()
            except acl_swiglu.HandleClosedError:
                if started_after:
                    outcome["after"] = "failed"
                    return
                continue
            if started_after:
                outcome["after"] = "succeeded"
                return
            outcome["before"] += 1

    thread, failures = run_thread(worker)
    while outcome["before"] < round_ % 5 + 1 and thread.is_alive():
        time.sleep(0)
    close()
    closed.set()
    after_close()
    join(thread)
    assert not failures, failures
    return outcome


@pytest.mark.parametrize("user", list(USERS))
def test_array_closed_by_another_thread_fails_every_later_call(user):
    """The main thread closes the array a worker's calls use, then allocates arrays of the same
    size filled with a sentinel (the freed memory is the likeliest place for them). Every call
    that started after close() returned must fail, and the sentinels must stay."""
    for round_ in range(ROUNDS):
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            target = acl_swiglu.to_device(case(2)[1])   # the shape of grad_x and of x
            call = USERS[user](stack, stream, target)
            victims = []
            outcome = close_during_calls(call, target.close, round_, lambda: victims.extend(
                stack.enter_context(acl_swiglu.to_device(np.full((T, 2 * H), SENTINEL, np.float32)))
                for _ in range(3)))
            stream.synchronize()
            assert outcome.get("after") == "failed", (round_, outcome)
            for victim in victims:
                assert np.all(victim.to_numpy() == SENTINEL), f"round {round_}: a closed array's memory was written"


@pytest.mark.parametrize("kind", ["plan", "stream", "executor"])
def test_plan_stream_or_executor_closed_by_another_thread_fails_every_later_call(kind):
    for round_ in range(ROUNDS):
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            gy, x = (stack.enter_context(acl_swiglu.to_device(a)) for a in case(3))
            if kind == "executor":
                grad_x = stack.enter_context(acl_swiglu.DeviceArray.empty(x.shape, F32))
                victim = stack.enter_context(acl_swiglu.get_workspace_size(gy, x, grad_x=grad_x))
                victim.make_repeatable()
                call = lambda: victim.launch(stream)   # noqa: E731
            else:
                plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(gy, x, stream=stream))
                victim = plan if kind == "plan" else stream
                call = plan
            outcome = close_during_calls(call, victim.close, round_)
            assert outcome.get("after") == "failed", (round_, outcome)


# ----------------------------------------------------------------------------- 2. launch x read


def _launch_device_call(arrays, stream, out):
    acl_swiglu.swiglu_group_quant_grad_device(*arrays, grad_x=out, stream=stream)


def _launch_executor(arrays, stream, out):
    acl_swiglu.get_workspace_size(*arrays, grad_x=out).launch(stream)


def _launch_repeatable_executor(arrays, stream, out):
    with acl_swiglu.get_workspace_size(*arrays, grad_x=out) as executor:
        executor.make_repeatable()
        executor.launch(stream)
        executor.launch(stream)


LAUNCHES = {"device-call": _launch_device_call, "executor": _launch_executor,
            "repeatable-executor": _launch_repeatable_executor}


def _read_to_numpy(out, stream, want):
    return out.to_numpy()


def _read_through_closed_wrapper(out, stream, want):
    # (the launch went through a borrowed wrapper of the stream, closed since)
    assert stream.closed and out.pending is stream
    return out.to_numpy()


def _read_as_input_on_another_stream(out, stream, want):
    """`out` (as x of a copy-like second call) read by a device call on another stream: that call
    must wait for the first one's write. Its result is checked against the model of `want`."""
    with acl_swiglu.Stream() as other, acl_swiglu.to_device(np.zeros((T, H), np.float32) + 1) as gy:
        second, _ = acl_swiglu.swiglu_group_quant_grad_device(gy, out, stream=other)
        with second:
            return second.to_numpy(), device_model.swiglu_group_quant_grad_model(np.ones((T, H), np.float32),
                                                                                 want)[0]


READS = {"to_numpy": _read_to_numpy, "closed-wrapper": _read_through_closed_wrapper,
         "input-on-another-stream": _read_as_input_on_another_stream}


@pytest.mark.parametrize("read", list(READS))
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_every_read_waits_for_the_writer(launch, read):
    """Fresh data every round: a read that does not wait sees the previous round's (or the
    never-written) contents, which differ."""
    with acl_swiglu.Stream() as stream:
        out = acl_swiglu.DeviceArray.empty((T, 2 * H), F32)
        with out:
            for round_ in range(12):
                gy, x = case(100 + round_)
                want = want_of(gy, x)
                with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
                    through = acl_swiglu.Stream.from_handle(stream.handle) if read == "closed-wrapper" else stream
                    LAUNCHES[launch]((d_gy, d_x), through, out)
                    assert out.pending is through, launch
                    if through is not stream:
                        through.close()
                    got = READS[read](out, through, want)
                    if isinstance(got, tuple):
                        got, want = got
                    assert bits_equal(got, want), (launch, read, round_)
                    stream.synchronize()


@pytest.mark.parametrize("launch", ["plan", "plan-rebind"])
def test_plan_reads_wait_for_the_writer(launch):
    """The plan paths: the call, then a read before anything else waits."""
    with acl_swiglu.Stream() as stream, acl_swiglu.DeviceArray.empty((T, 2 * H), F32) as out:
        for round_ in range(12):
            gy, x = case(200 + round_)
            want = want_of(gy, x)
            with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
                with ExitStack() as stack:
                    other = stack.enter_context(acl_swiglu.DeviceArray.empty(out.shape, F32))
                    first = other if launch == "plan-rebind" else out
                    plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=first,
                                                                                   stream=stream))
                    if launch == "plan-rebind":
                        plan(d_gy, d_x, grad_x=out)
                    else:
                        plan()
                    assert out.pending is stream
                    assert bits_equal(out.to_numpy(), want), (launch, round_)


# ----------------------------------------------------------------------------- 3. borrowed stream closed


@pytest.mark.parametrize("wrapper", ["from_handle", "default_stream"])
def test_closing_a_borrowed_wrapper_with_work_queued_frees_nothing_in_use(wrapper):
    with acl_swiglu.Stream() as owner:
        for round_ in range(20):
            gy, x = case(300 + round_)
            want = want_of(gy, x)
            with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
                borrowed = acl_swiglu.Stream.from_handle(owner.handle) if wrapper == "from_handle" \
                    else acl_swiglu.default_stream()
                with borrowed as s:
                    grad_x, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, stream=s)
                assert s.closed
                with grad_x:
                    assert bits_equal(grad_x.to_numpy(), want), round_   # waited, and the kernel had its workspace
                owner.synchronize()   # the owner's stream is healthy (no fault from freed workspace)
                acl_swiglu.synchronize_device()


# ----------------------------------------------------------------------------- 4. gc with work queued


def test_plan_collected_with_a_launch_queued_keeps_its_resources_until_the_work_is_done():
    with acl_swiglu.Stream() as stream:
        for round_ in range(20):
            gy, x = case(400 + round_)
            want = want_of(gy, x)
            with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
                    acl_swiglu.DeviceArray.empty(x.shape, F32) as grad_x:
                plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=grad_x, stream=stream)
                plan()
                del plan
                gc.collect()   # the plan, its executor, tensors and workspace are garbage now
                stream.synchronize()   # would fail if the executor or workspace were freed under the work
                assert bits_equal(grad_x.to_numpy(), want), round_


def test_inputs_collected_with_a_launch_queued_live_until_the_work_is_done():
    with acl_swiglu.Stream() as stream:
        for round_ in range(20):
            gy, x = case(500 + round_)
            want = want_of(gy, x)
            grad_x, _ = acl_swiglu.swiglu_group_quant_grad_device(acl_swiglu.to_device(gy), acl_swiglu.to_device(x),
                                                                  stream=stream)
            gc.collect()   # the inputs have no reference left
            for _ in range(3):   # new memory, likely where the inputs were, with other contents
                acl_swiglu.to_device(np.full((T, 2 * H), SENTINEL, np.float32)).close()
            with grad_x:
                assert bits_equal(grad_x.to_numpy(), want), round_


# ----------------------------------------------------------------------------- 5. fork

FORK_TIME_LIMIT = 60

FORK_PRELUDE = textwrap.dedent(r"""
    import os, sys, threading, multiprocessing, faulthandler
    faulthandler.dump_traceback_later(40, exit=True)
    import numpy as np
    import acl_swiglu
    from acl_swiglu import errors
    gy = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    x = np.linspace(-3, 3, 128, dtype=np.float32).reshape(4, 32)
""")

FORK_INSIDE_PLAN = FORK_PRELUDE + textwrap.dedent(r"""
    d = [acl_swiglu.to_device(a) for a in (gy, x)]
    plan = acl_swiglu.SwigluGroupQuantGradPlan(*d)
    want = plan()[0].to_numpy()
    inside, leave = threading.Event(), threading.Event()

    def in_plan_call():
        with plan._lock:   # what a thread in the middle of plan() holds
            inside.set()
            leave.wait(30)

    holder = threading.Thread(target=in_plan_call)
    holder.start()
    inside.wait(10)
    for attempt in range(5):
        pid = os.fork()
        if pid == 0:
            try:
                plan()
                print("child call worked", flush=True)
            except errors.AclError as exc:
                print("child call refused", exc.code, "fork" in str(exc), flush=True)
            plan.close()
            print("child closed", flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child status", os.waitstatus_to_exitcode(status), flush=True)
    leave.set()
    holder.join()
    print("parent ok", bool(np.array_equal(plan()[0].to_numpy(), want)), flush=True)
    plan.close()
""")

FORK_AFTER_IMPORT = FORK_PRELUDE + textwrap.dedent(r"""
    def child(queue):
        gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x)
        with acl_swiglu.to_device(gy) as a, acl_swiglu.to_device(x) as b, \
                acl_swiglu.SwigluGroupQuantGradPlan(a, b) as plan:
            px = plan()[0].to_numpy()
        queue.put(bool(np.array_equal(gx, px)))

    ctx = multiprocessing.get_context("fork")
    for attempt in range(3):
        queue = ctx.Queue()
        process = ctx.Process(target=child, args=(queue,))
        process.start()
        print("child result", queue.get(timeout=40), flush=True)
        process.join(40)
        print("child exit", process.exitcode, flush=True)
    gx, _ = acl_swiglu.swiglu_group_quant_grad(gy, x)   # the parent may use it afterwards
    print("parent ok", gx.shape, flush=True)
""")

FORK_AFTER_INIT = FORK_PRELUDE + textwrap.dedent(r"""
    acl_swiglu.swiglu_group_quant_grad(gy, x)   # the parent initialised ACL
    for attempt in range(3):
        pid = os.fork()
        if pid == 0:
            try:
                acl_swiglu.swiglu_group_quant_grad(gy, x)
                print("child call worked", flush=True)
            except errors.AclError as exc:
                print("child call refused", exc.code, "fork" in str(exc), flush=True)
            acl_swiglu.release_cached()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child status", os.waitstatus_to_exitcode(status), flush=True)
    print("parent ok", acl_swiglu.swiglu_group_quant_grad(gy, x)[0].shape, flush=True)
""")


def _run_script(tmp_path, name, text) -> str:
    script = tmp_path / f"{name}.py"
    script.write_text(text)
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    # Its own process group: a hung script and the children it forked all go at the time limit.
    proc = subprocess.Popen([sys.executable, str(script)], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=FORK_TIME_LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{name}: did not finish within {FORK_TIME_LIMIT} s (hung): {stdout!r} {stderr[-3000:]!r}")
    assert proc.returncode == 0, (name, proc.returncode, stdout, stderr[-3000:])
    assert "Traceback" not in stderr, stderr[-3000:]
    return stdout


def test_fork_while_a_thread_is_inside_a_plan_child_close_does_not_hang(tmp_path):
    out = _run_script(tmp_path, "fork_inside_plan", FORK_INSIDE_PLAN)
    assert out.count("child call refused 100001 True") == 5, out
    assert out.count("child closed") == 5 and out.count("child status 0") == 5, out
    assert "parent ok True" in out, out


def test_fork_after_only_an_import_lets_the_child_use_the_package(tmp_path):
    out = _run_script(tmp_path, "fork_after_import", FORK_AFTER_IMPORT)
    assert out.count("child result True") == 3 and out.count("child exit 0") == 3, out
    assert "parent ok (4, 32)" in out, out


def test_fork_after_acl_was_initialised_refuses_the_child_clearly(tmp_path):
    out = _run_script(tmp_path, "fork_after_init", FORK_AFTER_INIT)
    assert out.count("child call refused 100001 True") == 3 and out.count("child status 0") == 3, out
    assert "parent ok (4, 32)" in out, out


# ----------------------------------------------------------------------------- 6. gc callback re-entry


@contextmanager
def collections_calling(callback):
    """A garbage collection at (nearly) every allocation, each calling callback(phase, info)."""
    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)


def test_gc_callback_calling_the_same_plan_gets_a_clear_error_not_a_deadlock():
    gy, x = case(600)
    want = want_of(gy, x)
    seen = {"inside": 0, "refused": 0, "other": []}
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(x) as d_x2, acl_swiglu.DeviceArray.empty(x.shape, F32) as out:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=out, stream=stream)

        def callback(phase, info):
            if phase != "start" or not plan._lock._is_owned():   # (inside a call of the plan, on this thread)
                return
            seen["inside"] += 1
            try:
                plan(d_gy, d_x)
            except RuntimeError as exc:
                if "inside one of its own calls" in str(exc):
                    seen["refused"] += 1
                else:
                    seen["other"].append(exc)

        def calls():
            with collections_calling(callback):   # (also inside the plan)
                for i in range(300):
                    plan(d_gy, d_x2 if i % 2 else d_x, grad_x=out)   # a rebinding call

        thread, failures = run_thread(calls)
        join(thread)
        with plan:
            assert not failures, failures
            assert not seen["other"], seen["other"]
            assert seen["inside"] > 0 and seen["refused"] == seen["inside"], seen
            assert bits_equal(out.to_numpy(), want)


def test_gc_callback_launching_the_same_executor_gets_a_clear_error_not_a_deadlock():
    """A collection runs at nearly every allocation, its callback launching the executor again:
    inside a launch of it on this thread that is refused, outside it runs; never a hang."""
    gy, x = case(610)
    want = want_of(gy, x)
    seen = {"ran": 0, "refused": 0, "other": []}
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, F32) as out:
        executor = acl_swiglu.get_workspace_size(d_gy, d_x, grad_x=out)
        executor.make_repeatable()
        launching = threading.Event()

        def callback(phase, info):
            if phase != "start" or not launching.is_set():
                return
            try:
                executor.launch(stream)
                seen["ran"] += 1
            except RuntimeError as exc:
                if "inside one of its own launches" in str(exc):
                    seen["refused"] += 1
                else:
                    seen["other"].append(exc)
            except BaseException as exc:   # (reported below)
                seen["other"].append(exc)

        def launches():
            try:
                with collections_calling(callback):   # (also inside the launch)
                    for _ in range(300):
                        launching.set()
                        executor.launch(stream)
                        launching.clear()
            finally:
                launching.clear()

        thread, failures = run_thread(launches)
        join(thread)
        with executor:
            stream.synchronize()
            assert not failures, failures
            assert not seen["other"], seen["other"]
            assert seen["refused"] > 0, seen
            assert bits_equal(out.to_numpy(), want)


# ----------------------------------------------------------------------------- 7. thread caches


def test_cached_streams_of_1000_short_lived_threads_go_with_them():
    gy, x = case(700)
    want = want_of(gy, x)
    acl_swiglu.swiglu_group_quant_grad(gy, x)   # this thread's own cached stream is the baseline
    gc.collect()
    baseline = emulator.live_counts()
    wrong = []

    def one_call():
        if not bits_equal(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], want):
            wrong.append(threading.get_ident())

    for _ in range(50):
        threads = [threading.Thread(target=one_call) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            join(thread)
        assert emulator.live_counts()["stream"] <= baseline["stream"] + 40   # bounded while they come and go
    gc.collect()
    acl_swiglu.swiglu_group_quant_grad(gy, x)   # frees what the last threads left on their way out
    assert not wrong
    assert emulator.live_counts() == baseline


def test_a_plan_waits_for_its_inputs_written_on_another_stream():
    """The plan is built once; each round another stream rewrites its input x (queued, not
    waited for) with new data, then the plan runs: it must read the new data."""
    ones = np.ones((T, H), np.float32)
    with acl_swiglu.Stream() as writer, acl_swiglu.Stream() as reader, \
            acl_swiglu.to_device(ones) as d_ones, acl_swiglu.DeviceArray.empty((T, 2 * H), F32) as shared:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(d_ones, shared, stream=reader)
        with plan:
            for round_ in range(12):
                gy, x = case(800 + round_)
                with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
                    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=shared, stream=writer)
                    assert shared.pending is writer
                    got = plan(synchronize=True)[0].to_numpy()
                    want = device_model.swiglu_group_quant_grad_model(ones, want_of(gy, x))[0]
                    assert bits_equal(got, want), round_


# ----------------------------------------------------------------------------- 8. owners


class SizedBuffer(acl_swiglu.DeviceBuffer):
    """A user's subclass whose instances compare (and hash) by size."""

    def __eq__(self, other):
        return isinstance(other, SizedBuffer) and other.nbytes == self.nbytes

    def __hash__(self):
        return hash(self.nbytes)


class NamedStream(acl_swiglu.Stream):
    """A user's subclass with __eq__ and so no hash."""

    def __eq__(self, other):
        return self is other

    __hash__ = None   # type: ignore[assignment]


def test_owners_that_compare_equal_each_keep_and_free_their_own_handle():
    gc.collect()
    acl_swiglu.release_cached()
    baseline = emulator.live_counts()
    data = np.arange(64, dtype=np.float32)
    for _ in range(20):
        kept, dropped = SizedBuffer(256), SizedBuffer(256)
        kept.copy_from_host(data)
        del dropped
        gc.collect()
        acl_swiglu.DeviceBuffer(8).close()   # (frees what the collection left due)
        assert not kept.closed
        out = np.empty(64, np.float32)
        kept.copy_to_host(out)
        assert np.array_equal(out, data)
        del kept
        with NamedStream() as stream:
            stream.synchronize()
    gc.collect()
    acl_swiglu.release_cached()
    assert emulator.live_counts() == baseline


def test_hundreds_of_plans_dropped_at_once_are_all_freed_and_the_next_call_works():
    gy, x = case(900)
    want = want_of(gy, x)
    acl_swiglu.swiglu_group_quant_grad(gy, x)
    gc.collect()
    baseline = emulator.live_counts()
    for count in (150, 400):
        with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
            plans = [acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x) for _ in range(count)]
            for plan in plans:
                plan()
            assert emulator.live_counts()["executor"] >= baseline["executor"] + count
            del plans, plan
            gc.collect()
            assert bits_equal(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], want)
        acl_swiglu.release_cached()
        gc.collect()
        acl_swiglu.swiglu_group_quant_grad(gy, x)
        assert emulator.live_counts() == baseline, count


def test_a_single_use_executor_launched_from_two_threads_runs_once():
    gy, x = case(910)
    want = want_of(gy, x)
    outcomes = {"launched": 0, "refused": 0, "other": []}
    with acl_swiglu.Stream() as first, acl_swiglu.Stream() as second, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.to_device(x) as d_x, acl_swiglu.DeviceArray.empty((T, 2 * H), F32) as out:
        for _ in range(150):
            executor = acl_swiglu.get_workspace_size(d_gy, d_x, grad_x=out)
            barrier = threading.Barrier(2)

            def launch(stream):
                barrier.wait()
                try:
                    executor.launch(stream)
                    outcomes["launched"] += 1
                except errors.HandleClosedError as exc:
                    assert "consumed by its launch" in str(exc)
                    outcomes["refused"] += 1
                except BaseException as exc:   # (reported below)
                    outcomes["other"].append(repr(exc))

            threads = [run_thread(launch, stream) for stream in (first, second)]
            for thread, failures in threads:
                join(thread)
                assert not failures, failures
            first.synchronize()
            second.synchronize()
        assert not outcomes["other"], outcomes["other"][:3]
        assert outcomes["launched"] == 150 and outcomes["refused"] == 150, outcomes
        assert bits_equal(out.to_numpy(), want)


def test_an_executor_launched_from_a_thread_new_to_the_package_runs():
    gy, x = case(920)
    want = want_of(gy, x)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty((T, 2 * H), F32) as out:
        executor = acl_swiglu.get_workspace_size(d_gy, d_x, grad_x=out)
        with acl_swiglu.DeviceBuffer(max(executor.workspace_size, 1)) as workspace:
            failures = []

            def launch():
                try:
                    executor.launch(stream, workspace=workspace)
                except BaseException as exc:   # (reported below)
                    failures.append(repr(exc))

            thread, errors_ = run_thread(launch)
            join(thread)
            assert not errors_, errors_
            stream.synchronize()
            assert not failures, failures
            assert executor.closed
            assert bits_equal(out.to_numpy(), want)
