"""Threads and processes on the emulator backend.

* the one-shot API from 8 threads at once (each its own inputs, many iterations) gives the same
  bits as single-threaded runs (which give device_model's bits);
* 8 plans on 8 threads, each on its own Stream: the same;
* ONE plan shared by 8 threads, every call rebinding the thread's own inputs and outputs, then
  reading them: the plan serialises calls with a lock and a launch captures the addresses bound
  at its call, so every thread must get its own right bits (revision 1 also regroups per call);
* the device-level API with a stream per thread;
* threads that made one-shot calls and ended leave nothing live after gc + release_cached;
* fork after use: a child that exits normally, a child that tries to use the package (a clear
  error, never a hang), also while another parent thread is busy in the package; a 'spawn'
  child uses the package normally.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import ExitStack

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import emulator, errors, reference, runtime  # noqa: E402

pytestmark = pytest.mark.emulator_only

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = (F32, F16, BF16)
THREADS = 8
JOIN_TIMEOUT = 60.0
CLAMP = 3.0


# ----------------------------------------------------------------------------- helpers


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_same_bits(got, want, what=""):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    differ = np.flatnonzero(bits(got).ravel() != bits(want).ravel())
    assert differ.size == 0, f"{what}: {differ.size} elements differ (first flat index {differ[0]})"


def make_case(seed: int, dtype, lead=(3, 4), h=32, groups=(5, 4)):
    """grad_y, x, weight, y_origin, group_index (trunc 9 of 12 by default)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-5, 5, lead + (2 * h,)).astype(np.float32).astype(dtype)
    gy = rng.uniform(-2, 2, lead + (h,)).astype(np.float32).astype(dtype)
    w = rng.uniform(0.2, 1.5, lead + (1,)).astype(np.float32)
    yo = reference.swiglu(x, CLAMP).astype(np.float32).astype(dtype)
    return gy, x, w, yo, np.array(groups, np.int64)


def model(case):
    gy, x, w, yo, g = case
    return device_model.swiglu_group_quant_grad_model(gy, x, w, yo, g, CLAMP)


def run_threads(target, count=THREADS):
    """Starts `count` threads on target(k, barrier); returns the exceptions they raised."""
    failures = []
    barrier = threading.Barrier(count)

    def wrapped(k):
        try:
            target(k, barrier)
        except BaseException as exc:   # reported by the test thread
            failures.append((k, exc))
            barrier.abort()

    threads = [threading.Thread(target=wrapped, args=(k,), name=f"worker-{k}") for k in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_TIMEOUT
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = [t.name for t in threads if t.is_alive()]
    assert not hung, f"threads still running after {JOIN_TIMEOUT} s: {hung}"
    return failures


def assert_nothing_live():
    gc.collect()
    acl_swiglu.release_cached()
    counts = emulator.live_counts()
    assert not any(counts.values()), counts


ABIS = [pytest.param(1, id="abi1"), pytest.param(2, id="abi2")]


# ----------------------------------------------------------------------------- one-shot


def test_one_shot_from_8_threads_same_bits_as_single_threaded():
    sets_per_thread, iterations = 3, 30
    cases = {(k, j): make_case(100 * k + j, DTYPES[(k + j) % 3], groups=(k + j, 3))
             for k in range(THREADS) for j in range(sets_per_thread)}
    # Single-threaded first: these are the reference bits (and they are the model's).
    single = {}
    for key, case in cases.items():
        got = acl_swiglu.swiglu_group_quant_grad(*case, CLAMP)
        want = model(case)
        assert_same_bits(got[0], want[0], f"single-threaded {key} grad_x")
        assert_same_bits(got[1], want[1], f"single-threaded {key} grad_weight")
        single[key] = got
    calls = [0] * THREADS

    def worker(k, barrier):
        barrier.wait()
        for i in range(iterations):
            key = (k, i % sets_per_thread)
            gx, gw = acl_swiglu.swiglu_group_quant_grad(*cases[key], CLAMP)
            assert_same_bits(gx, single[key][0], f"thread {k} call {i} grad_x")
            assert_same_bits(gw, single[key][1], f"thread {k} call {i} grad_weight")
            calls[k] += 1

    failures = run_threads(worker)
    assert not failures, failures
    assert calls == [iterations] * THREADS
    # each thread's cached stream went with the thread (freed by the next call; the main
    # thread's own stays)
    gc.collect()
    acl_swiglu.swiglu_group_quant_grad(*cases[(0, 0)], CLAMP)
    assert emulator.live_counts()["stream"] == 1


# ----------------------------------------------------------------------------- plans


@pytest.mark.parametrize("abi", ABIS, indirect=True)
def test_eight_plans_on_eight_threads_each_on_its_own_stream(abi):
    iterations = 25
    cases = {(k, j): make_case(1000 + 10 * k + j, DTYPES[k % 3], groups=(2 + k, 1 + j)) for k in range(THREADS)
             for j in range(2)}
    wants = {key: model(case) for key, case in cases.items()}

    def single_threaded_plan(k):
        """The same plan calls on one thread: the reference for thread k."""
        out = {}
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            devs = []
            for j in range(2):
                gy, x, w, yo, g = cases[(k, j)]
                d = [stack.enter_context(acl_swiglu.to_device(a)) for a in (gy, x, w, yo)]
                dg = stack.enter_context(acl_swiglu.to_device(g)) if abi == 2 else g.tolist()
                devs.append((d, dg))
            plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*devs[0][0], devs[0][1], CLAMP,
                                                                           stream=stream))
            for j in (1, 0):
                gx, gw = plan(*devs[j][0], group_index=devs[j][1])
                out[j] = (gx.to_numpy(), gw.to_numpy())
        return out

    single = {k: single_threaded_plan(k) for k in range(THREADS)}
    for k in range(THREADS):
        for j in range(2):
            assert_same_bits(single[k][j][0], wants[(k, j)][0], f"single-threaded plan {k}/{j}")
            assert_same_bits(single[k][j][1], wants[(k, j)][1], f"single-threaded plan {k}/{j}")

    def worker(k, barrier):
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            devs = []
            for j in range(2):
                gy, x, w, yo, g = cases[(k, j)]
                d = [stack.enter_context(acl_swiglu.to_device(a)) for a in (gy, x, w, yo)]
                dg = stack.enter_context(acl_swiglu.to_device(g)) if abi == 2 else g.tolist()
                devs.append((d, dg))
            plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*devs[0][0], devs[0][1], CLAMP,
                                                                           stream=stream))
            assert plan.stream is stream
            barrier.wait()
            for i in range(iterations):
                j = (i + 1) % 2
                gx, gw = plan(*devs[j][0], group_index=devs[j][1])
                assert_same_bits(gx.to_numpy(), single[k][j][0], f"thread {k} call {i} grad_x")
                assert_same_bits(gw.to_numpy(), single[k][j][1], f"thread {k} call {i} grad_weight")

    failures = run_threads(worker)
    assert not failures, failures


@pytest.mark.parametrize("abi", ABIS, indirect=True)
def test_one_plan_shared_by_8_threads(abi):
    """The package's answer for a shared plan: calls are serialised by the plan's lock and each
    launch captures the addresses (and, in revision 1, the group counts) of its own call, so a
    thread that rebinds its own inputs AND outputs, then reads them, gets its own right bits.
    (Safe, not refused: the assertions below require the right bits for every thread.)"""
    iterations = 20
    lead, h = (2, 5), 24
    base = make_case(7, BF16, lead, h, groups=(6, 1))
    cases = [make_case(2000 + k, BF16, lead, h, groups=(k + 1, 1)) for k in range(THREADS)]
    wants = [model(c) for c in cases]
    # distinct data and counts per thread give distinct results
    assert len({bits(w[0]).tobytes() for w in wants}) == THREADS
    per_thread_calls = [0] * THREADS
    with ExitStack() as stack:
        stream = stack.enter_context(acl_swiglu.Stream())
        d0 = [stack.enter_context(acl_swiglu.to_device(a)) for a in base[:4]]
        g0 = stack.enter_context(acl_swiglu.to_device(base[4])) if abi == 2 else base[4].tolist()
        gx0 = stack.enter_context(acl_swiglu.DeviceArray.empty(base[1].shape, BF16))
        gw0 = stack.enter_context(acl_swiglu.DeviceArray.empty(base[2].shape, np.float32))
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*d0, g0, CLAMP, grad_x=gx0, grad_weight=gw0,
                                                                       stream=stream))

        def worker(k, barrier):
            with ExitStack() as mine:
                d = [mine.enter_context(acl_swiglu.to_device(a)) for a in cases[k][:4]]
                g = mine.enter_context(acl_swiglu.to_device(cases[k][4])) if abi == 2 else cases[k][4].tolist()
                gx = mine.enter_context(acl_swiglu.DeviceArray.empty(base[1].shape, BF16))
                gw = mine.enter_context(acl_swiglu.DeviceArray.empty(base[2].shape, np.float32))
                barrier.wait()
                for i in range(iterations):
                    got_x, got_w = plan(*d, group_index=g, grad_x=gx, grad_weight=gw)
                    assert got_x is gx and got_w is gw
                    plan.stream.synchronize()
                    assert_same_bits(gx.to_numpy(), wants[k][0], f"thread {k} call {i} grad_x")
                    assert_same_bits(gw.to_numpy(), wants[k][1], f"thread {k} call {i} grad_weight")
                    per_thread_calls[k] += 1
                # before this thread's arrays are freed, its queued work must be done
                plan.stream.synchronize()

        failures = run_threads(worker)
        assert not failures, failures
        assert per_thread_calls == [iterations] * THREADS
        # the plan still works for its first binding afterwards (the threads' outputs are gone)
        plan(*d0, group_index=g0, grad_x=gx0, grad_weight=gw0)
        want0 = model(base)
        assert_same_bits(gx0.to_numpy(), want0[0], "after the threads")
        assert_same_bits(gw0.to_numpy(), want0[1], "after the threads")


# ----------------------------------------------------------------------------- device-level


@pytest.mark.parametrize("abi", ABIS, indirect=True)
def test_device_level_api_with_a_stream_per_thread(abi):
    iterations = 15
    cases = [make_case(3000 + k, DTYPES[k % 3], groups=(k + 2, 2)) for k in range(THREADS)]
    wants = [model(c) for c in cases]

    def worker(k, barrier):
        gy, x, w, yo, g = cases[k]
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in (gy, x, w, yo)]
            dg = stack.enter_context(acl_swiglu.to_device(g)) if abi == 2 else g.tolist()
            barrier.wait()
            for i in range(iterations):
                gx, gw = acl_swiglu.swiglu_group_quant_grad_device(*d, dg, CLAMP, stream=stream)
                with gx, gw:
                    assert gx.pending is stream and gw.pending is stream
                    assert_same_bits(gx.to_numpy(), wants[k][0], f"thread {k} call {i} grad_x")
                    assert_same_bits(gw.to_numpy(), wants[k][1], f"thread {k} call {i} grad_weight")

    failures = run_threads(worker)
    assert not failures, failures


# ----------------------------------------------------------------------------- thread exit


def test_threads_that_ended_leave_nothing_live_after_release_cached():
    assert_nothing_live()
    case = make_case(11, F16)
    want = model(case)

    def worker(k, barrier):
        barrier.wait()
        for _ in range(3):
            gx, gw = acl_swiglu.swiglu_group_quant_grad(*case, CLAMP)
            assert_same_bits(gx, want[0], f"thread {k}")
            assert_same_bits(gw, want[1], f"thread {k}")

    for round_ in range(2):   # a second generation of threads after the first ended
        failures = run_threads(worker)
        assert not failures, failures
        gc.collect()
        acl_swiglu.swiglu_group_quant_grad(*case, CLAMP)   # frees what the ended threads left
        cached = emulator.live_counts()
        # A thread's cached stream goes when the thread ends: only the main thread's stays (a
        # one-shot call's workspace is in its own arena, freed before it returns).
        assert cached["tensor"] == cached["int_array"] == cached["executor"] == 0, cached
        assert cached["stream"] == 1 and cached["allocation"] == 0, cached
        assert_nothing_live()


# ----------------------------------------------------------------------------- fork / spawn


CHILD_WATCHDOG = 10.0   # a hung forked child dumps its stack to a file and exits after this


def _use_package_in_child(conn, attempts, watchdog_path):
    """Runs in a forked child: each way of using the package must fail clearly (or work)."""
    import faulthandler
    watchdog = open(watchdog_path, "w")
    faulthandler.dump_traceback_later(CHILD_WATCHDOG, exit=True, file=watchdog)
    report = {}
    case = make_case(21, F32)
    actions = {
        "one_shot": lambda: acl_swiglu.swiglu_group_quant_grad(*case, CLAMP),
        "to_device": lambda: acl_swiglu.to_device(case[0]),
        "stream": lambda: acl_swiglu.Stream(),
        "inherited_plan": lambda: _INHERITED["plan"](),
        "inherited_executor": lambda: _INHERITED["executor"].launch(_INHERITED["stream"],
                                                                    workspace=_INHERITED["workspace"]),
        "release_cached": acl_swiglu.release_cached,
    }
    try:
        for name in attempts:
            try:
                result = actions[name]()
                if name == "one_shot":
                    want = model(case)
                    report[name] = ("worked", bool(np.array_equal(bits(result[0]), bits(want[0]))))
                else:
                    report[name] = ("worked", True)
            except errors.AclSwigluError as exc:
                report[name] = ("error", type(exc).__name__, getattr(exc, "code", None), str(exc))
    except BaseException as exc:
        report["unexpected"] = repr(exc)
    faulthandler.cancel_dump_traceback_later()
    conn.send(report)
    conn.close()


_INHERITED = {}


def _join_or_fail(process, what, watchdog_path=None):
    process.join(JOIN_TIMEOUT)
    if process.is_alive():
        process.kill()
        process.join(5)
        pytest.fail(f"{what}: the child did not finish within {JOIN_TIMEOUT} s (hung)")
    if watchdog_path is not None and process.exitcode != 0:
        with open(watchdog_path) as f:
            stack = f.read()
        if "Timeout" in stack:
            pytest.fail(f"{what}: the child hung for {CHILD_WATCHDOG} s (its watchdog killed it); child stack:\n{stack}")


def _check_child_report(report, attempts):
    assert "unexpected" not in report, report
    assert set(report) == set(attempts), report
    for name, outcome in report.items():
        if outcome[0] == "worked":
            assert outcome[1] is True, (name, outcome)   # working is allowed, with the right bits
        else:
            _, cls, code, text = outcome
            assert "fork" in text, (name, outcome)        # a clear error that says why
    if "one_shot" in report:
        # The package's documented answer: ACL use in a forked child is refused.
        assert report["one_shot"][0] == "error" and report["one_shot"][2] == 100001, report["one_shot"]


def _fork_child(attempts, tmp_path, what):
    ctx = multiprocessing.get_context("fork")
    parent_end, child_end = ctx.Pipe(duplex=False)
    watchdog_path = str(tmp_path / f"child-stack-{time.monotonic_ns()}.txt")
    child = ctx.Process(target=_use_package_in_child, args=(child_end, attempts, watchdog_path))
    child.start()
    child_end.close()
    _join_or_fail(child, what, watchdog_path)
    assert child.exitcode == 0, child.exitcode
    assert parent_end.poll(5)
    report = parent_end.recv()
    _check_child_report(report, attempts)
    return report


ALL_ATTEMPTS = ("one_shot", "to_device", "stream", "inherited_plan", "inherited_executor", "release_cached")


def test_fork_child_that_uses_the_package_gets_a_clear_error(tmp_path):
    case = make_case(20, BF16)
    acl_swiglu.swiglu_group_quant_grad(*case, CLAMP)   # the parent used it
    with ExitStack() as stack:
        d = [stack.enter_context(acl_swiglu.to_device(a)) for a in case[:2]]
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*d))
        plan()
        _INHERITED["plan"] = plan
        grad_x = stack.enter_context(acl_swiglu.DeviceArray.empty(d[1].shape, d[1].dtype))
        _INHERITED["executor"] = stack.enter_context(acl_swiglu.get_workspace_size(*d, grad_x=grad_x))
        _INHERITED["stream"] = stack.enter_context(acl_swiglu.Stream())
        _INHERITED["workspace"] = stack.enter_context(acl_swiglu.DeviceBuffer(1 << 16))
        try:
            report = _fork_child(ALL_ATTEMPTS, tmp_path, "forked child using the package")
        finally:
            _INHERITED.clear()
        # everything that needs ACL is refused; release_cached may also just drop the objects
        for name in ("one_shot", "to_device", "stream", "inherited_plan", "inherited_executor"):
            assert report[name][0] == "error" and report[name][2] == 100001, (name, report[name])
        # the parent is unaffected
        want = device_model.swiglu_group_quant_grad_model(*case[:2])
        assert_same_bits(plan()[0].to_numpy(), want[0], "parent after the fork")


def _busy_loop(stop, plan, case, failures):
    try:
        while not stop.is_set():
            acl_swiglu.swiglu_group_quant_grad(*case, CLAMP)
            plan()
            plan.stream.synchronize()
    except BaseException as exc:
        failures.append(exc)


FORKS_WHILE_BUSY = 12


def test_fork_while_another_thread_is_busy_in_the_package_does_not_hang(tmp_path):
    """Fork (repeatedly) while a second parent thread is in the middle of one-shot calls and of
    calls of a plan, so at random moments it holds package and emulator locks. The child makes
    new work (one-shot call, device array, stream): a clear error every time, never a hang.
    (Touching objects that the busy thread may be holding locks of is the deterministic test
    below: a random version of it would only fail sometimes.)"""
    attempts = ("one_shot", "to_device", "stream")
    case = make_case(22, F32)
    stop = threading.Event()
    failures = []
    with ExitStack() as stack:
        d = [stack.enter_context(acl_swiglu.to_device(a)) for a in case[:2]]
        stream = stack.enter_context(acl_swiglu.Stream())
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*d, stream=stream))
        _INHERITED["plan"] = plan
        busy = threading.Thread(target=_busy_loop, args=(stop, plan, case, failures))
        busy.start()
        try:
            for attempt in range(FORKS_WHILE_BUSY):
                time.sleep(0.005)
                _fork_child(attempts, tmp_path, f"fork {attempt} while another thread was busy, child tried {attempts}")
        finally:
            stop.set()
            busy.join(JOIN_TIMEOUT)
            _INHERITED.clear()
        assert not busy.is_alive()
        assert not failures, failures
        stream.synchronize()


@pytest.mark.parametrize("attempts", [
    pytest.param(("release_cached",), id="release-cached"),
    pytest.param(("inherited_plan",), id="inherited-plan"),
    pytest.param(("one_shot", "to_device", "stream"), id="new-work"),
])
def test_fork_while_other_threads_are_inside_the_package_does_not_hang(attempts, tmp_path):
    """The deterministic form of the test above. At the fork, one thread holds the package's
    state lock (as every call does for a moment) and another is in the middle of a call of a
    plan (simulated by holding that plan's lock: a busy thread holds it most of the time, see the
    test above). The child then tries the package: release_cached() (which frees the default
    stream's workspace), the inherited plan, or new work. A clear error or a working call, never
    a hang."""
    case = make_case(23, F32)
    with ExitStack() as stack:
        d = [stack.enter_context(acl_swiglu.to_device(a)) for a in case[:2]]
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*d))
        plan()
        plan.stream.synchronize()
        # the default stream gets a pooled workspace, as device-level calls on it do
        gx, _ = acl_swiglu.swiglu_group_quant_grad_device(*d)
        stack.enter_context(gx)
        gx.to_numpy()
        _INHERITED["plan"] = plan
        inside, leave = threading.Event(), threading.Event()

        def hold():
            with runtime.state.lock:
                inside.set()
                leave.wait(JOIN_TIMEOUT)

        def in_plan_call():
            with plan._lock:   # what a thread in the middle of plan() holds
                inside_plan.set()
                leave.wait(JOIN_TIMEOUT)

        inside_plan = threading.Event()
        holder = threading.Thread(target=hold)
        caller = threading.Thread(target=in_plan_call)
        holder.start()
        caller.start()
        try:
            assert inside.wait(10) and inside_plan.wait(10)
            _fork_child(attempts, tmp_path, f"fork while other threads were inside the package, child tried {attempts}")
        finally:
            leave.set()
            holder.join(JOIN_TIMEOUT)
            caller.join(JOIN_TIMEOUT)
            _INHERITED.clear()
        assert not holder.is_alive() and not caller.is_alive()
        plan()
        want = device_model.swiglu_group_quant_grad_model(*case[:2])
        assert_same_bits(plan.grad_x.to_numpy(), want[0], "parent after the fork")


FORK_EXIT_SCRIPT = textwrap.dedent(r"""
    import os, sys, time
    import numpy as np
    import acl_swiglu
    from acl_swiglu import emulator

    gy = np.linspace(-1, 1, 64, dtype=np.float32).reshape(4, 16)
    x = np.linspace(-3, 3, 128, dtype=np.float32).reshape(4, 32)
    want = acl_swiglu.swiglu_group_quant_grad(gy, x)[0]
    d = [acl_swiglu.to_device(a) for a in (gy, x)]
    stream = acl_swiglu.Stream()
    plan = acl_swiglu.SwigluGroupQuantGradPlan(*d, stream=stream)   # left alive across the fork
    plan()
    pid = os.fork()
    if pid == 0:
        # the child: nothing but a normal interpreter exit (atexit handlers, finalizers, GC)
        os.environ["ACL_EMU_LEAK_CHECK"] = "1"   # would print if the child finalised ACL
        print("child exiting", flush=True)
        sys.exit(0)
    deadline = time.monotonic() + float(sys.argv[1])
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("CHILD HUNG", flush=True)
            sys.exit(3)
        time.sleep(0.01)
    print("child status", os.waitstatus_to_exitcode(status), flush=True)
    # the parent's device state survived the child's exit
    plan()
    ok = np.array_equal(plan.grad_x.to_numpy(), want)
    plan.close(); stream.close()
    for a in d:
        a.close()
    acl_swiglu.release_cached()
    print("parent ok", ok, emulator.live_counts(), flush=True)
""")


def test_forked_child_exits_normally(tmp_path):
    """A process that used the package forks; the child just exits through the normal
    interpreter exit path. It must not hang, not touch (finalise) the parent's ACL state, and
    the parent keeps working."""
    script = tmp_path / "fork_exit.py"
    script.write_text(FORK_EXIT_SCRIPT)
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    env.pop("ACL_EMU_LEAK_CHECK", None)
    proc = subprocess.run([sys.executable, str(script), str(JOIN_TIMEOUT)], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=JOIN_TIMEOUT + 60)
    out = proc.stdout
    assert "CHILD HUNG" not in out, (out, proc.stderr[-2000:])
    assert proc.returncode == 0, (proc.returncode, out, proc.stderr[-2000:])
    assert "child exiting" in out and "child status 0" in out, out
    assert "leak check" not in proc.stderr, proc.stderr[-2000:]   # the child did not call aclFinalize
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    parent = [ln for ln in out.splitlines() if ln.startswith("parent ok")]
    assert parent and parent[0].startswith("parent ok True"), out
    assert "'tensor': 0, 'int_array': 0, 'executor': 0, 'stream': 0, 'allocation': 0" in parent[0], parent


def _spawned_child(conn, seed):
    case = make_case(seed, BF16)
    try:
        backend = acl_swiglu.backend_info()
        gx, gw = acl_swiglu.swiglu_group_quant_grad(*case, CLAMP)
        want = model(case)
        with ExitStack() as stack:
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in case[:4]]
            dg = stack.enter_context(acl_swiglu.to_device(case[4]))
            plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*d, dg, CLAMP))
            px, pw = plan()
            plan_ok = np.array_equal(bits(px.to_numpy()), bits(want[0]))
        acl_swiglu.release_cached()
        conn.send({"emulator": backend.is_emulator if hasattr(backend, "is_emulator") else str(backend),
                   "one_shot": bool(np.array_equal(bits(gx), bits(want[0])) and np.array_equal(bits(gw), bits(want[1]))),
                   "plan": bool(plan_ok), "live": emulator.live_counts()})
    except BaseException as exc:
        conn.send({"error": repr(exc)})
    conn.close()


def test_spawned_child_uses_the_package_normally():
    acl_swiglu.swiglu_group_quant_grad(*make_case(30, F32), CLAMP)   # the parent used it first
    ctx = multiprocessing.get_context("spawn")
    parent_end, child_end = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_spawned_child, args=(child_end, 31))
    child.start()
    child_end.close()
    _join_or_fail(child, "spawned child")
    assert child.exitcode == 0
    assert parent_end.poll(5)
    report = parent_end.recv()
    assert "error" not in report, report
    assert report["one_shot"] is True and report["plan"] is True, report
    assert not any(report["live"].values()), report
