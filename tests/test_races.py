"""Threads attacking each other through the public API: calls while other threads close what
they use, empty the workspace pools, call release_cached(), rebind a shared plan, or close
unrelated arrays; first uses of a fresh array from two threads at once; reads racing a close;
bfloat16 first taken from six threads in a fresh interpreter; children forked while other
threads call.

Races run a bounded number of rounds and judge invariants (every call gives the model's bits or
raises HandleClosedError naming something that was closed; nothing freed is written; nothing
leaks), never timings. Thread switches are made frequent (sys.setswitchinterval) to widen the
windows; no outcome depends on them. What has crashed the process before runs in a child.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
from typing import Any, Dict, List

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import errors

from swiglu_cases import (CLAMP, JOIN_TIMEOUT, case, idle_counts, run_child, run_threads, same_bits,
                          use_the_package_on_this_thread, want)

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"


@contextlib.contextmanager
def frequent_switches():
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


def call(d_gy, d_x, out, stream):
    return acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out, stream=stream)


# ---- device-level calls against closes, pools and release_cached ----


class Inputs:
    """Shared inputs that a closer replaces (closing the old ones) while workers call with them."""

    def __init__(self, gy: np.ndarray, x: np.ndarray) -> None:
        self.host = (gy, x)
        self.lock = threading.Lock()
        self.current = self.fresh()
        self.replaced = 0

    def fresh(self):
        return acl_swiglu.to_device(self.host[0]), acl_swiglu.to_device(self.host[1])

    def replace(self) -> None:
        new = self.fresh()
        with self.lock:
            old, self.current = self.current, new
            self.replaced += 1
        for array in old:
            array.close()

    def close(self) -> None:
        for array in self.current:
            array.close()


def device_call_race(shared_stream: bool, closes: bool, workers: int = 4, calls: int = 60,
                     rounds: int = 40) -> Dict[str, Any]:
    """Workers make device-level calls with shared inputs and their own outputs; a closer (with
    `closes`) replaces the inputs and closes outputs, allocating sentinel arrays after each close
    (late work on freed memory would overwrite them), and empties the workspace pools and calls
    release_cached(). Each worker makes at least `calls` calls and overlaps `rounds` rounds of the
    closer. Returns the wrong outcomes and the outcome counts."""
    gy, x = case(8, 32, seed=3)
    expected = want(gy, x)
    problems: List[str] = []
    counts: collections.Counter = collections.Counter()
    outputs: List[acl_swiglu.DeviceArray] = []
    sentinels = []
    finished = [0]
    cycles = [0]
    inputs = Inputs(gy, x)
    streams = [acl_swiglu.Stream() for _ in range(1 if shared_stream else workers)]

    def worker(index):
        use_the_package_on_this_thread()
        stream = streams[index % len(streams)]
        out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
        outputs.append(out)
        done = 0
        try:
            while (done < calls or cycles[0] < rounds) and not problems and done < 50 * calls:
                done += 1
                with inputs.lock:
                    d_gy, d_x = inputs.current
                try:
                    call(d_gy, d_x, out, stream)
                except errors.HandleClosedError as exc:
                    if not (d_gy.closed or d_x.closed or out.closed):
                        problems.append(f"HandleClosedError with nothing closed: {exc}")
                    counts["closed"] += 1
                    if out.closed:
                        out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
                        outputs.append(out)
                    continue
                except Exception as exc:   # a wrong outcome
                    problems.append(f"{type(exc).__name__}: {exc}")
                    continue
                counts["ok"] += 1
                try:
                    if not same_bits(out.to_numpy(), expected):
                        problems.append("wrong bits")
                except errors.HandleClosedError:
                    counts["read after close"] += 1
        finally:
            with inputs.lock:
                finished[0] += 1

    def closer():
        rng = np.random.default_rng(5)
        step = 0
        while finished[0] < workers and step < 100000:
            step += 1
            action = step % 4
            if action == 0 and closes:
                inputs.replace()
            elif action == 1 and closes and outputs:
                outputs[int(rng.integers(len(outputs)))].close()
            elif action == 2:
                for stream in streams:
                    stream.release_workspace()
            elif action == 3:
                acl_swiglu.release_cached()
                cycles[0] += 1
            if closes and action in (0, 1) and len(sentinels) < 64:
                pattern = rng.standard_normal(x.shape).astype(np.float32)
                sentinels.append((acl_swiglu.to_device(pattern), pattern))

    try:
        with frequent_switches():
            failures = run_threads([lambda i=i: worker(i) for i in range(workers)] + [closer], timeout=120)
        problems.extend(f"a thread raised {exc!r}" for exc in failures)
        for stream in streams:
            stream.synchronize()
        if not all(same_bits(array.to_numpy(), pattern) for array, pattern in sentinels):
            problems.append("a sentinel was overwritten")
    finally:
        for array in outputs + [a for a, _ in sentinels]:
            array.close()
        inputs.close()
        for stream in streams:
            stream.close()
    return {"problems": problems[:5], "counts": dict(counts), "cycles": cycles[0], "replaced": inputs.replaced,
            "calls": workers * calls}


def judge(result: Dict[str, Any], closes: bool) -> None:
    counts = result["counts"]
    assert not result["problems"], result
    assert counts.get("ok", 0) >= (1 if closes else result["calls"]) and result["cycles"] >= 1, result
    if closes:
        assert result["replaced"] > 0 and counts.get("closed", 0) > 0, result   # the race was on


@pytest.mark.parametrize("shared_stream", [True, False], ids=["one-stream", "own-streams"])
def test_device_calls_from_threads_racing_workspace_pools_and_release_cached(shared_stream):
    before = idle_counts()
    judge(device_call_race(shared_stream, closes=False), closes=False)
    assert idle_counts() == before


_CLOSES_CHILD = r"""
import json
import test_races
print(json.dumps({mode: test_races.device_call_race(mode == "one-stream", True)
                  for mode in ("one-stream", "own-streams")}))
"""


def test_device_calls_from_threads_racing_closes(tmp_path):
    """As above, and the inputs are replaced (closed) and outputs closed meanwhile: each call
    gives the model's bits or raises HandleClosedError naming something that was closed; never
    a kernel on freed memory, never wrong bits; sentinels allocated after a close stay as
    written. (A child process: this race has crashed the process before.)"""
    for mode, result in run_child(_CLOSES_CHILD, tmp_path, timeout=300).items():
        judge(result, closes=True)


def test_device_calls_racing_release_cached_and_unrelated_closes():
    """Calls on own streams from two threads while a third calls release_cached() and closes
    unrelated arrays: no call fails, every result has the model's bits, nothing leaks."""
    gy, x = case(8, 32, seed=17)
    expected = want(gy, x)
    before = idle_counts()
    stop = threading.Event()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        outputs = [acl_swiglu.DeviceArray.empty(x.shape, np.float32) for _ in range(2)]


        def repeat(out):
            with acl_swiglu.Stream() as stream:
                for _ in range(80):
                    call(d_gy, d_x, out, stream)
                stream.synchronize()

        def disturb():
            while not stop.is_set():
                acl_swiglu.release_cached()
                acl_swiglu.DeviceArray.empty((8,), np.float32).close()

        disturber = threading.Thread(target=disturb, daemon=True)
        disturber.start()
        try:
            with frequent_switches():
                failures = run_threads([lambda out=out: repeat(out) for out in outputs])
        finally:
            stop.set()
            disturber.join(JOIN_TIMEOUT)
        assert not disturber.is_alive() and not failures, failures
        for out in outputs:
            assert same_bits(out.to_numpy(), expected)
            out.close()
    assert idle_counts() == before


def test_one_shot_calls_from_threads_racing_release_cached():
    """release_cached() from another thread, over and over, while four threads make one-shot
    calls: a call in flight keeps its thread's stream until it ends, so no call fails and every
    result has the model's bits; every thread's next call works."""
    gy, x = case(6, 24, seed=19)
    expected = want(gy, x)
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)
    problems: List[str] = []
    counts: collections.Counter = collections.Counter()
    releases = [0]
    running = [4]
    lock = threading.Lock()
    quiet = threading.Event()

    def worker():
        calls = 0
        try:
            while (calls < 40 or releases[0] < 100) and not problems and calls < 4000:
                calls += 1
                try:
                    got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)[0]
                except Exception as exc:   # judged below
                    problems.append(f"{type(exc).__name__}: {exc}")
                    continue
                if same_bits(got, expected):
                    counts["ok"] += 1
                else:
                    problems.append("wrong bits")
        finally:
            with lock:
                running[0] -= 1
        quiet.wait(JOIN_TIMEOUT)   # release_cached() is no longer called
        if not same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)[0], expected):
            problems.append("wrong bits after the race")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(4)]
    with frequent_switches():
        for thread in threads:
            thread.start()
        while running[0] and releases[0] < 100000:
            acl_swiglu.release_cached()
            releases[0] += 1
        quiet.set()
        for thread in threads:
            thread.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not problems, (problems[:5], counts)
    assert counts["ok"] >= 4 * 40 and releases[0] >= 100, counts


def test_a_shared_plan_called_and_rebound_while_unrelated_arrays_are_closed():
    """Calls that rebind grad_x between two outputs, plain calls, with and without synchronize,
    and a stream of closes of unrelated arrays: every call returns an output that is one of the
    plan's, nothing fails, the outputs hold the bits, nothing leaks."""
    gy, x = case(5, 24, seed=9)
    expected = want(gy, x)
    before = idle_counts()
    wrong = []
    stop = threading.Event()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out_a, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out_b, acl_swiglu.Stream() as stream, \
            acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, grad_x=out_a, stream=stream) as plan:
        started = threading.Barrier(3)

        def caller(index):
            use_the_package_on_this_thread()
            started.wait(JOIN_TIMEOUT)
            for turn in range(60):
                if index == 0 and turn % 3 == 0:
                    grad_x, _ = plan(grad_x=out_b if turn % 2 else out_a, synchronize=turn % 2 == 0)
                else:
                    grad_x, _ = plan(synchronize=turn % 2 == 0)
                if grad_x is not out_a and grad_x is not out_b:
                    wrong.append(grad_x)
            stream.synchronize()

        def closer():
            while not stop.is_set():
                acl_swiglu.DeviceArray.empty((4,), np.float32).close()

        disturber = threading.Thread(target=closer, daemon=True)
        disturber.start()
        try:
            with frequent_switches():
                failures = run_threads([lambda i=i: caller(i) for i in range(3)])
        finally:
            stop.set()
            disturber.join(JOIN_TIMEOUT)
        assert not failures and not wrong, (failures, wrong)
        stream.synchronize()
        for output in (out_a, out_b):
            assert same_bits(output.to_numpy(), expected)
    assert idle_counts() == before


# ---- first uses and reads ----


def test_two_threads_making_the_first_call_with_a_fresh_array():
    """Two threads at once make the first call with a new grad_y (of a layout seen before):
    both calls, and the calls after them, compute on its data."""
    gy, x = case(7, 20, seed=23)
    expected = want(gy, x)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(x) as d_x, acl_swiglu.to_device(gy) as warm:
        outs = [acl_swiglu.DeviceArray.empty(x.shape, x.dtype) for _ in range(2)]
        try:
            for out in outs:
                call(warm, d_x, out, stream)
            for round_ in range(10):
                with acl_swiglu.to_device(gy) as d_gy:
                    start = threading.Barrier(2)

                    def first_call(out):
                        start.wait(JOIN_TIMEOUT)
                        call(d_gy, d_x, out, stream)

                    with frequent_switches():
                        failures = run_threads([lambda out=out: first_call(out) for out in outs])
                    assert not failures, failures
                    for out in outs:
                        assert same_bits(out.to_numpy(), expected), round_
                        call(d_gy, d_x, out, stream)
                        assert same_bits(out.to_numpy(), expected), round_
        finally:
            for out in outs:
                out.close()


def test_reads_racing_a_close_of_their_array():
    """A thread reads an array over and over while this one closes it: every read gives the
    array's values or raises HandleClosedError, never the contents of memory freed meanwhile."""
    gy, x = case(8, 32, seed=29)
    expected = want(gy, x)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
        for round_ in range(20):
            out, _ = call(d_gy, d_x, None, stream)
            outcomes: collections.Counter = collections.Counter()
            started = threading.Event()

            def reader():
                use_the_package_on_this_thread()
                while True:
                    started.set()
                    try:
                        got = out.to_numpy()
                    except errors.HandleClosedError:
                        outcomes["closed"] += 1
                        return
                    outcomes["ok" if same_bits(got, expected) else "wrong"] += 1

            thread = threading.Thread(target=reader, daemon=True)
            with frequent_switches():
                thread.start()
                assert started.wait(JOIN_TIMEOUT)
                for _ in range(round_ % 4):
                    threading.Event().wait(0)   # (a switch or few: a different moment each round)
                out.close()
                for _ in range(3):   # new memory, likely where the array was, with other contents
                    acl_swiglu.to_device(np.full(x.shape, 12345.0, np.float32)).close()
                thread.join(JOIN_TIMEOUT)
            assert not thread.is_alive() and outcomes["closed"] == 1 and not outcomes["wrong"], (round_, outcomes)


# ---- fresh interpreters ----


_BFLOAT16 = r"""
import json, sys, threading
import numpy as np
import acl_swiglu
assert "ml_dtypes" not in sys.modules
barrier = threading.Barrier(6)
seen, errors = [], []

def use(index):
    try:
        barrier.wait(10)
        if index % 3 == 0:
            seen.append(np.dtype(acl_swiglu.bfloat16))
        elif index % 3 == 1:
            seen.append(acl_swiglu.DeviceArray.empty((2, 4), "bfloat16").dtype)
        else:
            seen.append(acl_swiglu.swiglu_group_quant_grad(np.ones((2, 4), "float32"), np.ones((2, 8), "float32"))[0].dtype)
    except BaseException as error:
        errors.append(repr(error))

threads = [threading.Thread(target=use, args=(i,)) for i in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(20)
import ml_dtypes
bf = np.dtype(ml_dtypes.bfloat16)
print(json.dumps({"alive": any(t.is_alive() for t in threads), "errors": errors,
                  "bf": sum(1 for d in seen if d == bf), "f32": sum(1 for d in seen if d == np.float32),
                  "module_attr": acl_swiglu.bfloat16 == bf}))
"""


def test_bfloat16_first_taken_from_six_threads_at_once(tmp_path):
    assert run_child(_BFLOAT16, tmp_path) == {"alive": False, "errors": [], "bf": 4, "f32": 2, "module_attr": True}


_FORK_WHILE_CALLING = r"""
import json, os, threading, time
import numpy as np
import acl_swiglu
from acl_swiglu import errors
from swiglu_cases import case, same_bits, want

gy, x = case(4, 8, seed=2)
expected = want(gy, x)
stream = acl_swiglu.Stream()
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
plan = acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=1.5)
for _ in range(2):
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
stop = threading.Event()

def busy():   # device-level, one-shot and plan calls on another thread while this one forks
    while not stop.is_set():
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
        plan()

def child():
    outcome = {}
    for name, attempt in (("device-call", lambda: acl_swiglu.swiglu_group_quant_grad_device(
                              d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)),
                          ("one-shot", lambda: acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)),
                          ("plan", plan), ("read", lambda: out.to_numpy())):
        try:
            attempt()
            outcome[name] = "worked"
        except errors.AclError as exc:
            outcome[name] = [exc.code, "fork" in str(exc)]
    for name, step in (("close", lambda: (d_gy.close(), stream.close(), plan.close())),
                       ("release", acl_swiglu.release_cached)):
        try:
            step()
            outcome[name] = "worked"
        except Exception as exc:
            outcome[name] = f"{type(exc).__name__}: {exc}"
    return outcome

worker = threading.Thread(target=busy)
worker.start()
report = []
for attempt in range(5):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            text = json.dumps(child())
        except BaseException as exc:
            text = json.dumps({"crash": repr(exc)})
        os.write(write, text.encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.01)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        report.append({"hung": attempt})
        continue
    data = b""
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        data += chunk
    os.close(read)
    report.append({"status": status, "outcome": json.loads(data or b"{}")})
stop.set()
worker.join()
got = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)[0]
print(json.dumps({"children": report, "parent": same_bits(got.to_numpy(), expected),
                  "plan": same_bits(plan(synchronize=True)[0].to_numpy(), expected)}))
"""


@pytest.mark.emulator_only
def test_children_forked_while_other_threads_call(tmp_path):
    """Children forked while another thread makes device-level, one-shot and plan calls (so the
    package's locks may be held at the fork) refuse every ACL use clearly (AclError 100001 saying
    why), only drop their objects on close() and release_cached(), and never hang; the parent
    goes on."""
    report = run_child(_FORK_WHILE_CALLING, tmp_path, timeout=200)
    assert report["parent"] and report["plan"], report
    assert len(report["children"]) == 5
    for child in report["children"]:
        assert "hung" not in child, child
        assert child["status"] == 0 and "crash" not in child["outcome"], child
        outcome = child["outcome"]
        for name in ("device-call", "one-shot", "plan"):
            assert outcome[name] == [100001, True], child
        assert outcome["read"] in ("worked", [100001, True]), child
        assert outcome["close"] == "worked" and outcome["release"] == "worked", child


_FORK_POOL = r"""
import json, multiprocessing
import numpy as np
import acl_swiglu
from acl_swiglu import errors

gy, x = np.ones((4, 8), np.float32), np.ones((4, 16), np.float32)
stream = acl_swiglu.Stream()
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
for _ in range(2):
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
acl_swiglu.swiglu_group_quant_grad(gy, x)

def task(kind):
    try:
        if kind == "device-call":
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
        else:
            acl_swiglu.swiglu_group_quant_grad(gy, x)
        return "worked"
    except errors.AclError as exc:
        return [exc.code, "fork" in str(exc)]

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        result = pool.map_async(task, ["device-call", "one-shot", "device-call", "one-shot"]).get(60)
    print(json.dumps(result))
"""


@pytest.mark.emulator_only
def test_a_multiprocessing_fork_pool_after_calls(tmp_path):
    script = tmp_path / "fork_pool.py"
    script.write_text(_FORK_POOL)
    assert run_child(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", tmp_path) == \
        [[100001, True]] * 4
