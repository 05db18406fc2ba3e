"""The two fast paths attacked as a careless user and a hostile scheduler would: the lean
device-level call (``_aclnn.device_call``'s common case) and the one-shot NumPy call through the
C helper's arena (``_aclnn._one_shot_native``).

Races are looped so that a lost interleaving shows as a wrong outcome, never decided by sleeps;
interleavings that a loop would only rarely hit are forced with hooks that pause one thread at
the exact step in question (each wait bounded by a timeout, so a changed order cannot hang the
test). Anything that could hang or leaves a handle live by design runs in a child process with a
timeout. Every success is compared bit for bit with tests/device_model.py.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import pytest

import acl_swiglu
import acl_swiglu.op
from acl_swiglu import _aclnn, _device, _ffi, _scratch, emulator, errors, runtime

import device_model

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
PHASE2 = "aclnnSwigluGroupQuantGrad"
WAIT = 10.0   # seconds: bounds every hand-over between threads (never decides an outcome)


@pytest.fixture(scope="module", autouse=True)
def forget_layouts():
    """The layouts validated here are forgotten afterwards: other modules count first calls."""
    yield
    operator = acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD
    operator.device_recipes.clear()
    operator.one_shot_layouts.clear()


def _case(rows: int = 7, hidden: int = 20, seed: int = 11, dtype=np.float32) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((rows, hidden)).astype(np.float32).astype(dtype)
    x = rng.standard_normal((rows, 2 * hidden)).astype(np.float32).astype(dtype)
    return gy, x


def _want(gy: np.ndarray, x: np.ndarray, clamp: Optional[float] = 1.5, **kw: Any) -> np.ndarray:
    return device_model.swiglu_group_quant_grad_model(np.ascontiguousarray(gy), np.ascontiguousarray(x),
                                                      clamp_limit=clamp, **kw)[0]


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and got.dtype == want.dtype and np.array_equal(
        np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def _lean(d_gy, d_x, out, stream, clamp: Optional[float] = 1.5):
    return acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=clamp, grad_x=out, stream=stream)


def _warm(d_gy, d_x, out, stream, clamp: Optional[float] = 1.5) -> None:
    """Two calls: the first makes the tensors and validates the layout; the second is lean."""
    for _ in range(2):
        _lean(d_gy, d_x, out, stream, clamp)
    stream.synchronize()


# How a lean call holds what it uses: pinned one by one (a call whose arguments differ from the
# last lean call's) or as the last call's group (a repeat).
HOLDS = ("pinned", "grouped")


def _at_hold(monkeypatch, hold: str, hook: Callable[[Callable[[Any], None], Any], None]) -> None:
    """The next lean call runs hook(real, held) where it takes its hold (pin(lives) or
    enter(group)); hook calls real(held) itself. For "pinned", the last call is forgotten, so
    the next one is not a repeat."""
    name = "pin" if hold == "pinned" else "enter"
    real = getattr(_aclnn, name)
    if hold == "pinned":
        acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD.last_call = None

    def hooked(held: Any) -> None:
        monkeypatch.setattr(_aclnn, name, real)
        hook(real, held)

    monkeypatch.setattr(_aclnn, name, hooked)


class GeneralCalls:
    """Counts the calls that took the general path (the others took the lean path)."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = _aclnn._general_device_call

        def counting(*args):
            self.count += 1
            return real(*args)

        monkeypatch.setattr(_aclnn, "_general_device_call", counting)


def _run_child(code: str, tmp_path, timeout: float = 120) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_FAULT")}
    env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))   # device_model
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Handover:
    """Named one-shot events between two threads; a wait that times out is recorded, so the
    test reports an interleaving that could not be forced instead of hanging."""

    def __init__(self) -> None:
        self.events: Dict[str, threading.Event] = collections.defaultdict(threading.Event)
        self.timed_out: List[str] = []

    def signal(self, name: str) -> None:
        self.events[name].set()

    def wait(self, name: str) -> None:
        if not self.events[name].wait(WAIT):
            self.timed_out.append(name)


# ----------------------------------------------------------------------------- forced interleavings





@pytest.mark.parametrize("hold", HOLDS)
def test_close_between_pin_check_and_tensor_destroy(monkeypatch, hold):
    """Thread B closes grad_y while thread A is in a lean call: B's close_with finds the memory
    not held, then A holds it and checks the epoch (unchanged: nothing bumped it yet), then B's
    tensor close destroys the aclTensor, then A's phase 1 runs on it. The call overlapped a
    close, so it must raise HandleClosedError; it must not hand phase 1 a destroyed tensor."""
    gy, x = _case()
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        d_gy = acl_swiglu.to_device(gy)
        _warm(d_gy, d_x, out, stream)
        steps = Handover()
        api = runtime.runtime_api()
        real_phase1 = getattr(api.hot, PHASE1)

        def hold_when_b_checked(real, held):   # A, between reading the bindings and holding them
            steps.signal("a at pin")
            steps.wait("b checked the pins")
            real(held)

        def phase1_after_b_destroyed(*args):   # A, after its epoch check
            monkeypatch.setattr(api.hot, PHASE1, real_phase1)
            steps.signal("a in phase 1")
            steps.wait("b closed")
            return real_phase1(*args)

        tensor = d_gy._tensor
        real_tensor_close = tensor.close

        def tensor_close_paused():   # B, in close_with: the pin check found none
            steps.signal("b checked the pins")
            steps.wait("a in phase 1")
            real_tensor_close()

        tensor.close = tensor_close_paused
        _at_hold(monkeypatch, hold, hold_when_b_checked)
        monkeypatch.setattr(api.hot, PHASE1, phase1_after_b_destroyed)
        outcome: List[BaseException] = []

        def closer():
            steps.wait("a at pin")
            d_gy.close()
            steps.signal("b closed")

        b = threading.Thread(target=closer)
        b.start()
        try:
            _lean(d_gy, d_x, out, stream)
        except BaseException as exc:   # judged below, after B is done
            outcome.append(exc)
        finally:
            steps.signal("a in phase 1")   # (A failed before phase 1: B goes on)
        b.join(WAIT)
        stream.synchronize()
        assert not steps.timed_out, steps.timed_out
        assert outcome and isinstance(outcome[0], errors.HandleClosedError), outcome


@pytest.mark.parametrize("hold", HOLDS)
def test_stream_closed_during_a_lean_call(monkeypatch, hold):
    gy, x = _case()
    d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
    out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
    stream = acl_swiglu.Stream()
    newcomer: List[acl_swiglu.Stream] = []
    steps = Handover()
    outcome: List[Any] = []
    try:
        _warm(d_gy, d_x, out, stream)
        real_release = stream.release_workspace

        def release_paused():   # B, inside Stream.close: the stream is destroyed, its pool not yet
            steps.signal("stream destroyed")
            steps.wait("a launched")
            real_release()

        stream.release_workspace = release_paused

        def hold_then_wait(real, held):   # A, holding the pooled workspace
            real(held)
            steps.signal("a pinned")
            steps.wait("stream destroyed")
            newcomer.append(acl_swiglu.Stream())   # another thread makes a stream meanwhile

        _at_hold(monkeypatch, hold, hold_then_wait)
        b = threading.Thread(target=lambda: (steps.wait("a pinned"), stream.close()))
        b.start()
        try:
            got, _ = _lean(d_gy, d_x, out, stream)
            outcome.append("succeeded")
        except Exception as exc:   # judged below
            outcome.append(exc)
        steps.signal("a launched")
        b.join(WAIT)
        d_gy.close()
        d_x.close()   # freed once the work queued with them is done
        other_stream_error = None
        try:
            newcomer[0].synchronize()
        except errors.AclError as exc:
            other_stream_error = exc
        assert not steps.timed_out, steps.timed_out
        assert other_stream_error is None, other_stream_error   # never a kernel on freed memory
        assert isinstance(outcome[0], errors.HandleClosedError), outcome
    finally:
        for s in newcomer:
            s.close()
        stream.close()
        out.close()
        d_gy.close()
        d_x.close()


# ----------------------------------------------------------------------------- threads


@contextlib.contextmanager
def hostile_scheduler() -> Iterator[None]:
    """Thread switches every few microseconds, and a switch offered at the steps where a close
    and a call meet (before a call pins or enters what it uses, before a tensor handle is
    destroyed). The switches only widen windows; no outcome depends on their timing."""
    from acl_swiglu.tensor import AclTensor
    real_pin, real_enter, real_close = _aclnn.pin, _aclnn.enter, AclTensor.close

    def pin_after_a_switch(lives):
        time.sleep(0)
        real_pin(lives)

    def enter_after_a_switch(group):
        time.sleep(0)
        real_enter(group)

    def close_after_a_switch(self):
        time.sleep(0)
        real_close(self)

    previous = sys.getswitchinterval()
    _aclnn.pin, _aclnn.enter, AclTensor.close = pin_after_a_switch, enter_after_a_switch, close_after_a_switch
    sys.setswitchinterval(1e-5)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)
        _aclnn.pin, _aclnn.enter, AclTensor.close = real_pin, real_enter, real_close


@pytest.fixture
def busy_scheduler():
    with hostile_scheduler():
        yield


class Generation:
    """The shared inputs of the lean-call workers; the closer replaces them with a fresh copy
    (closing the old one) while workers are calling with them. A fresh copy makes one call
    before it is shared, so that its tensors exist (two threads making the first call with one
    array have their own test: test_first_use_from_two_threads_makes_one_tensor)."""

    def __init__(self, gy: np.ndarray, x: np.ndarray) -> None:
        self.host = (gy, x)
        self.lock = threading.Lock()
        self.stream = acl_swiglu.Stream()
        self.scratch = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
        self.current = self.fresh()
        self.replaced = 0

    def fresh(self):
        arrays = acl_swiglu.to_device(self.host[0]), acl_swiglu.to_device(self.host[1])
        _lean(*arrays, self.scratch, self.stream)
        return arrays

    def close(self) -> None:
        for array in self.current + (self.scratch,):
            array.close()
        self.stream.close()

    def replace(self) -> None:
        new = self.fresh()
        with self.lock:
            old, self.current = self.current, new
            self.replaced += 1
        for array in old:
            array.close()


ROUNDS = 60   # rounds of the closer every worker overlaps with


def _lean_worker(generation: Generation, stream: acl_swiglu.Stream, want: np.ndarray, calls: int,
                 outputs: List[acl_swiglu.DeviceArray], problems: List[str], counts: collections.Counter,
                 progress: List[int], index: int, cycles: List[int], rounds: int) -> None:
    """Lean calls until `calls` were made and the closer went round `rounds` times."""
    x_shape = generation.host[1].shape
    out = acl_swiglu.DeviceArray.empty(x_shape, np.float32)
    outputs.append(out)
    done = 0
    while (done < calls or cycles[0] < rounds) and not problems:   # (a wrong outcome ends the run)
        with generation.lock:
            d_gy, d_x = generation.current
        try:
            _lean(d_gy, d_x, out, stream)
        except errors.HandleClosedError as exc:
            if not (d_gy.closed or d_x.closed or out.closed or stream.closed):
                problems.append(f"HandleClosedError with nothing closed: {exc}")
            counts["closed"] += 1
            if out.closed:
                out = acl_swiglu.DeviceArray.empty(x_shape, np.float32)
                outputs.append(out)
            if stream.closed:
                break
            continue
        except errors.AclError as exc:
            problems.append(f"{type(exc).__name__}: {exc}")
        except Exception as exc:   # a wrong outcome: recorded
            problems.append(f"{type(exc).__name__}: {exc}")
        else:
            counts["ok"] += 1
            try:
                got = out.to_numpy()
                if not _same(got, want):
                    raise AssertionError("wrong bits")
            except errors.HandleClosedError:
                counts["read after close"] += 1
            except (errors.AclError, AssertionError) as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
        done += 1
    progress[index] = -1   # finished


def _closer(generation: Generation, streams: List[acl_swiglu.Stream], outputs: List[acl_swiglu.DeviceArray],
            progress: List[int], cycles: List[int], sentinels: List[Tuple[acl_swiglu.DeviceArray, np.ndarray]],
            closes: bool) -> None:
    """Until every worker is done: (with `closes`) replaces the inputs and closes a worker's
    current output, allocating sentinel arrays after each close (late work on freed memory would
    overwrite them); empties and grows the streams' workspace pools."""
    rng = np.random.default_rng(5)
    step = 0
    while max(progress) >= 0:   # a worker is still calling
        step += 1
        action = step % 4
        if action == 0:
            if closes:
                generation.replace()
        elif action == 1 and outputs and closes:
            outputs[int(rng.integers(len(outputs)))].close()
        elif action == 2:
            for stream in streams:
                stream.release_workspace()
        else:
            for stream in streams:   # a bigger pool: the old buffer is closed while calls may hold it
                buffer, _ = stream._take_workspace(16384 * (1 + step % 3))
                runtime.unpin((buffer._life,), stream._life)
            cycles[0] += 1
        if closes and action in (0, 1) and len(sentinels) < 64:
            pattern = rng.standard_normal(generation.host[1].shape).astype(np.float32)
            sentinels.append((acl_swiglu.to_device(pattern), pattern))


def lean_race(shared_stream: bool, closes: bool) -> Dict[str, Any]:
    """Workers make lean calls with shared inputs and their own outputs while a closer (with
    `closes`) replaces (closes) the inputs and closes outputs, and empties and grows the pools,
    under a hostile scheduler. Returns what the tests judge: the wrong outcomes (`problems`),
    the outcome counts, and whether the race was on."""
    workers, calls = 4, 60
    gy, x = _case(rows=8, hidden=32)
    want = _want(gy, x)
    real_general = _aclnn._general_device_call
    general = [0]

    def counting(*args):
        general[0] += 1
        return real_general(*args)

    with hostile_scheduler():
        generation = Generation(gy, x)
        streams = [acl_swiglu.Stream() for _ in range(1 if shared_stream else workers)]
        with acl_swiglu.DeviceArray.empty(x.shape, np.float32) as warm:
            for stream in streams:
                _warm(*generation.current, warm, stream)
        problems: List[str] = []
        counts: collections.Counter = collections.Counter()
        outputs: List[acl_swiglu.DeviceArray] = []
        progress = [0] * workers
        sentinels: List[Tuple[acl_swiglu.DeviceArray, np.ndarray]] = []
        cycles = [0]
        threads = [threading.Thread(target=_lean_worker, args=(generation, streams[i % len(streams)], want, calls,
                                                               outputs, problems, counts, progress, i, cycles, ROUNDS))
                   for i in range(workers)]
        def guarded_closer():   # (its failure ends the workers too, instead of leaving them waiting for it)
            try:
                _closer(generation, streams, outputs, progress, cycles, sentinels, closes)
            except BaseException as exc:
                problems.append(f"the closer failed: {exc!r}")

        closer = threading.Thread(target=guarded_closer)
        _aclnn._general_device_call = counting
        try:
            for thread in threads:
                thread.start()
            closer.start()
            for thread in threads + [closer]:
                thread.join(120)
            if any(t.is_alive() for t in threads + [closer]):
                problems.append("a thread did not finish")
            if not all(_same(array.to_numpy(), pattern) for array, pattern in sentinels):
                problems.append("a sentinel was overwritten")
        finally:
            _aclnn._general_device_call = real_general
            for array in outputs + [a for a, _ in sentinels]:
                array.close()
            generation.close()
            for stream in streams:
                stream.close()
    return {"problems": problems[:5], "counts": dict(counts), "cycles": cycles[0], "replaced": generation.replaced,
            "general": general[0], "calls": workers * calls}


def _judge_race(result: Dict[str, Any], closes: bool) -> None:
    counts = result["counts"]
    assert not result["problems"], result
    assert counts.get("ok", 0) >= result["calls"] and result["cycles"] >= ROUNDS, result
    if closes:
        assert result["replaced"] > 0 and counts.get("closed", 0) > 0, result   # the race was on
    assert result["general"] < counts["ok"], result   # most calls were lean ones


@pytest.mark.parametrize("shared_stream", [True, False], ids=["one-stream", "own-streams"])
def test_lean_calls_from_threads_racing_workspace_pools(shared_stream):
    """Each call gives the model's bits while other threads empty and grow the stream's pool
    (a pool buffer closed under a call is counted: test_workspace_released_while_a_call_holds_it)."""
    _judge_race(lean_race(shared_stream, closes=False), closes=False)


_LEAN_RACE_CHILD = r"""
import json, sys
import test_fastpath_attack
print(json.dumps(test_fastpath_attack.lean_race(sys.argv[1] == "one-stream", True)))
"""


@pytest.mark.parametrize("shared_stream", ["one-stream", "own-streams"])
def test_lean_calls_from_threads_racing_closes(shared_stream, tmp_path):
    """As above, and the inputs are replaced (closed) and outputs closed meanwhile: each call
    gives the model's bits or raises HandleClosedError naming something that was closed; never
    a kernel on freed memory (507015 at the read), never wrong bits; sentinels allocated after a
    close stay as written; nothing leaks. (A child process: the race has crashed the process.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_FAULT")}
    env["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", _LEAN_RACE_CHILD, shared_stream], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _judge_race(json.loads(proc.stdout.strip().splitlines()[-1]), closes=True)


def test_read_racing_a_close_of_its_array(monkeypatch):
    gy, x = _case()
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, acl_swiglu.Stream() as stream:
        out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
        _warm(d_gy, d_x, out, stream)
        api = runtime.runtime_api()
        real_copy = api.aclrtMemcpy

        def copy_after_close(*args):   # another thread closes the array just before the copy
            monkeypatch.setattr(api, "aclrtMemcpy", real_copy)
            out.close()
            return real_copy(*args)

        monkeypatch.setattr(api, "aclrtMemcpy", copy_after_close)
        with pytest.raises(errors.HandleClosedError):
            out.to_numpy()


def test_workspace_released_while_a_call_holds_it(monkeypatch):
    gy, x = _case()
    want = _want(gy, x)
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, acl_swiglu.Stream() as stream, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        _warm(d_gy, d_x, out, stream)
        stream.release_workspace()   # the next call takes its workspace through run_with_workspace
        real_take = _device.Stream._take_workspace

        def take_then_release(self, nbytes):
            monkeypatch.setattr(_device.Stream, "_take_workspace", real_take)
            buffer = real_take(self, nbytes)
            self.release_workspace()   # another thread empties the pool now
            return buffer

        monkeypatch.setattr(_device.Stream, "_take_workspace", take_then_release)
        _lean(d_gy, d_x, out, stream)
        assert _same(out.to_numpy(), want)


def test_first_use_from_two_threads_makes_one_tensor(monkeypatch):
    """Two threads make the first device call with a fresh grad_y at once (its tensor's making
    held open a while): the array gets one tensor, both calls and a lean call after them give
    grad_y's bits. (Two tensors would let one be destroyed while a lean call holds its binding.)"""
    from acl_swiglu import tensor as tensor_module
    gy, x = _case()
    want = _want(gy, x)
    made: List[int] = []
    start = threading.Barrier(2, timeout=WAIT)

    class SlowTensor(tensor_module.AclTensor):
        def __init__(self, array, address=None):
            if array is d_gy:
                made.append(1)
                time.sleep(0.05)   # (widens the window; the count does not depend on it)
            super().__init__(array, address)

    with acl_swiglu.to_device(x) as d_x, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.Stream() as stream, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out1, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out2, acl_swiglu.to_device(gy) as warm_gy:
        _warm(warm_gy, d_x, out, stream)   # the layout is known; d_x and the outputs' tensors exist
        _warm(warm_gy, d_x, out1, stream)
        _warm(warm_gy, d_x, out2, stream)
        monkeypatch.setattr(tensor_module, "AclTensor", SlowTensor)
        failures: List[BaseException] = []

        def first_call(output):
            try:
                start.wait()
                _lean(d_gy, d_x, output, stream)
            except BaseException as exc:   # reported below
                failures.append(exc)

        threads = [threading.Thread(target=first_call, args=(o,)) for o in (out1, out2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
        _lean(d_gy, d_x, out, stream)
        assert not failures, failures
        assert len(made) == 1, made
        for output in (out, out1, out2):
            assert _same(output.to_numpy(), want)


def test_one_shot_calls_from_threads_racing_release_cached(busy_scheduler):
    """release_cached() is documented for when no call is in flight; broken, it may make a
    call fail with a clear error (the stream it destroyed, named), never with wrong bits, a
    crash or a leak; every thread's next call works."""
    assert _scratch.helper_library() is not None
    gy, x = _case(rows=6, hidden=24)
    want = _want(gy, x)
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)   # the layout (and its workspace size)
    problems: List[str] = []
    counts: collections.Counter = collections.Counter()
    releases = [0]
    running = [4]
    lock = threading.Lock()
    quiet = threading.Event()

    def worker():
        calls = 0
        try:
            while (calls < 40 or releases[0] < 100) and not problems:
                calls += 1
                try:
                    got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0]
                except errors.AclError as exc:
                    # The thread's stream was destroyed under the call: the launch names it (its
                    # address may already be reused by another handle, which the text then says).
                    if f"{exc.api}: stream: " in exc.message and exc.api in (PHASE2, "aclrtSynchronizeStream"):
                        counts["stream destroyed under the call"] += 1
                    else:
                        problems.append(f"{type(exc).__name__}: {exc}")
                    continue
                except Exception as exc:   # judged below
                    problems.append(f"{type(exc).__name__}: {exc}")
                    continue
                if _same(got, want):
                    counts["ok"] += 1
                else:
                    problems.append("wrong bits")
        finally:
            with lock:
                running[0] -= 1
        quiet.wait(WAIT)   # release_cached() is no longer called
        try:
            got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0]
            if not _same(got, want):
                problems.append("wrong bits after the race")
        except Exception as exc:   # judged below
            problems.append(f"the call after the race: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    while running[0]:
        acl_swiglu.release_cached()
        releases[0] += 1
    quiet.set()
    for thread in threads:
        thread.join(120)
    assert not problems, (problems[:5], counts)
    assert counts["ok"] >= 4 * 40 - counts["stream destroyed under the call"] and releases[0] >= 100, counts
    got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0]
    assert _same(got, want)


# ----------------------------------------------------------------------------- layouts


def test_one_layout_key_reached_by_different_device_arrays(monkeypatch):
    """Views at an offset, wrapped foreign pointers, arrays in other buffers: the same layout
    (and so the same cached validation) with other memory; each lean call computes on its own
    arrays' data."""
    general = GeneralCalls(monkeypatch)
    rows, hidden = 6, 16
    stream = acl_swiglu.Stream()
    made: List[Any] = []

    def keep(array):
        made.append(array)
        return array

    try:
        cases = []
        for seed in range(3):
            gy, x = _case(rows, hidden, seed=seed)
            cases.append((gy, x, _want(gy, x)))
        # Offsets: every case at element offset 8 of a bigger buffer (one layout), in turn.
        offset = 8
        views = []
        for gy, x, want in cases:
            buffers = []
            for host in (gy, x):
                buffer = keep(acl_swiglu.DeviceBuffer((host.size + offset) * 4))
                buffer.copy_from_host(np.concatenate([np.full(offset, np.nan, np.float32), host.ravel()]))
                buffers.append(keep(acl_swiglu.DeviceArray(buffer, host.shape, np.float32, offset=offset)))
            views.append((buffers[0], buffers[1], want))
        # Wrapped pointers: the same layout as to_device's arrays, over memory someone else owns.
        owners = [(keep(acl_swiglu.to_device(gy)), keep(acl_swiglu.to_device(x)), want) for gy, x, want in cases]
        wrapped = [(keep(acl_swiglu.DeviceArray.wrap(g.ptr, g.shape, g.dtype)),
                    keep(acl_swiglu.DeviceArray.wrap(x.ptr, x.shape, x.dtype)), want) for g, x, want in owners]
        assert views[0][0]._layout_id == views[1][0]._layout_id
        assert owners[0][0]._layout_id == wrapped[1][0]._layout_id
        outs = [keep(acl_swiglu.DeviceArray.empty((rows, 2 * hidden), np.float32)) for _ in range(2)]
        for family in (views, owners, wrapped):
            for index, (d_gy, d_x, _) in enumerate(family):   # the first call of each array: its tensors
                _lean(d_gy, d_x, outs[index % 2], stream)
        stream.synchronize()
        general.count = 0
        for round_ in range(3):   # alternating arrays of one layout: lean calls on the right data
            for family in (views, owners, wrapped):
                for index, (d_gy, d_x, want) in enumerate(family):
                    out = outs[index % 2]
                    _lean(d_gy, d_x, out, stream)
                    assert _same(out.to_numpy(), want), (round_, index)
        assert general.count == 0
    finally:
        stream.close()
        for array in reversed(made):
            array.close()


def test_stride_zero_and_empty_device_arrays_on_the_lean_path(monkeypatch):
    general = GeneralCalls(monkeypatch)
    rows, hidden = 5, 8
    rng = np.random.default_rng(4)
    row_gy = rng.standard_normal(hidden).astype(np.float32)
    row_x = rng.standard_normal(2 * hidden).astype(np.float32)
    want = _want(np.broadcast_to(row_gy, (rows, hidden)), np.broadcast_to(row_x, (rows, 2 * hidden)))
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(row_gy) as b_gy, acl_swiglu.to_device(row_x) as b_x:
        # Every row of the view is the one row in memory (stride 0 on the leading dim).
        d_gy = acl_swiglu.DeviceArray(b_gy.buffer, (rows, hidden), np.float32, strides=(0, 1))
        d_x = acl_swiglu.DeviceArray(b_x.buffer, (rows, 2 * hidden), np.float32, strides=(0, 1))
        with acl_swiglu.DeviceArray.empty((rows, 2 * hidden), np.float32) as out:
            for call in range(3):
                _lean(d_gy, d_x, out, stream)
                assert _same(out.to_numpy(), want), call
        e_gy = acl_swiglu.to_device(np.empty((0, hidden), np.float32))
        e_x = acl_swiglu.to_device(np.empty((0, 2 * hidden), np.float32))
        e_out = acl_swiglu.DeviceArray.empty((0, 2 * hidden), np.float32)
        assert e_gy.buffer is None and e_out.buffer is None   # (their tensors are what calls pin)
        before = general.count
        for call in range(3):
            got, _ = _lean(e_gy, e_x, e_out, stream)
            assert got is e_out and got.to_numpy().shape == (0, 2 * hidden)
        assert general.count == before + 1   # then lean
        e_gy.close()
        with pytest.raises(errors.HandleClosedError, match="grad_y"):
            _lean(e_gy, e_x, e_out, stream)
        e_x.close()
        e_out.close()


def _host_variants(gy: np.ndarray, x: np.ndarray) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    swapped = (gy.astype(gy.dtype.newbyteorder(">")), x.astype(x.dtype.newbyteorder(">")))
    readonly = (gy.copy(), x.copy())
    for array in readonly:
        array.flags.writeable = False
    strided = (np.repeat(gy, 2, axis=-1)[..., ::2], np.repeat(x, 3, axis=0)[::3])
    flipped = (np.ascontiguousarray(gy[::-1])[::-1], np.ascontiguousarray(x[:, ::-1])[:, ::-1])
    fortran = (np.asfortranarray(gy), np.asfortranarray(x))
    broadcast = (np.broadcast_to(gy[:1], gy.shape), np.broadcast_to(x[:1], x.shape))
    return {"swapped": swapped, "readonly": readonly, "strided": strided, "flipped": flipped, "fortran": fortran,
            "broadcast": broadcast}


def test_one_shot_host_array_variants_alternating_with_the_plain_layout():
    """Non-native byte order, read-only, strided, negative strides, Fortran order, stride 0:
    each is its own layout (or shares one with an array of the same strides) and gives the bits
    of its values; alternating with the plain layout, every call hits a cached entry."""
    gy, x = _case(rows=6, hidden=16, seed=7)
    plain_want = _want(gy, x)
    variants = _host_variants(gy, x)
    wants = {name: _want(np.ascontiguousarray(v[0]).astype(np.float32), np.ascontiguousarray(v[1]).astype(np.float32))
             for name, v in variants.items()}
    for round_ in range(2):
        for name, (v_gy, v_x) in variants.items():
            before = (v_gy.copy(), v_x.copy())
            got = acl_swiglu.swiglu_group_quant_grad(v_gy, v_x, clamp_limit=1.5)[0]
            assert _same(got, wants[name]), (round_, name)
            assert all(np.array_equal(a, b) for a, b in zip(before, (v_gy, v_x)))   # inputs untouched
            assert _same(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0], plain_want)


def test_more_layouts_than_the_caches_hold():
    """More than 256 layouts in turn (the layout caches are cleared when full): every call, one-shot
    and lean device-level, still validates what it must and gives the model's bits."""
    assert _aclnn._LAYOUT_CACHE_SIZE == 256
    hidden, count = 4, 264
    cases = []
    for rows in range(1, count + 1):
        gy, x = _case(rows, hidden, seed=rows)
        cases.append((gy, x, _want(gy, x)))
    with acl_swiglu.Stream() as stream:
        devices = [(acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.DeviceArray.empty(x.shape, x.dtype))
                   for gy, x, _ in cases]
        try:
            for round_ in range(2):
                for (gy, x, want), (d_gy, d_x, out) in zip(cases, devices):
                    assert _same(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0], want), round_
                    _lean(d_gy, d_x, out, stream)
                for (_, _, want), (_, _, out) in zip(cases, devices):
                    assert _same(out.to_numpy(), want), round_
            # A layout evicted and then wrong: still refused (validation runs again).
            gy, x, _ = cases[0]
            with pytest.raises(errors.ArgumentError, match="x"):
                acl_swiglu.swiglu_group_quant_grad(gy, x[:, :-2], clamp_limit=1.5)
        finally:
            for arrays in devices:
                for array in arrays:
                    array.close()


@pytest.mark.parametrize("path", ["one-shot", "device"])
def test_clamp_by_type_and_value(path):
    """The cache key holds the clamp's type and value: 2, 2.0 and numpy.float32(2.0) give the
    same bits; True (a bool) is refused whether or not 1 / 1.0 were cached before."""
    gy, x = _case(rows=6, hidden=16, seed=9)
    want = _want(gy, x, clamp=2.0)
    want_one = _want(gy, x, clamp=1.0)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:

        def run(clamp):
            if path == "one-shot":
                return acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=clamp)[0]
            _lean(d_gy, d_x, out, stream, clamp)
            return out.to_numpy()

        for first in (True, False):
            with pytest.raises(TypeError, match="bool"):
                run(first)
        for clamp in (2.0, 2, np.float32(2.0), 2.0, 2, np.float64(2.0)):
            assert _same(run(clamp), want), repr(clamp)
        for clamp in (1, 1.0, 1):
            assert _same(run(clamp), want_one), repr(clamp)
        for clamp in (True, np.bool_(True), False, -0.0, 0.0, 0, float("nan")):
            with pytest.raises((TypeError, errors.ArgumentError)):
                run(clamp)
        assert _same(run(1.0), want_one)   # refusals left nothing cached in the way


def test_abi_revision_switched_between_calls(monkeypatch):
    """ACL_SWIGLU_ABI changed between calls: the layout caches are per revision, so each call is
    validated and marshalled for the revision in force (revision 1: clamp 0.0 is off and
    group_index host ints; revision 2: clamp -1.0 is off, group_index an int64 DeviceArray)."""
    gy, x = _case(rows=6, hidden=16, seed=13)
    rng = np.random.default_rng(13)
    weight = (rng.random((6, 1)) + 0.5).astype(np.float32)
    y_origin = rng.standard_normal((6, 16)).astype(np.float32)
    groups = np.array([2, 3], np.int64)
    off = _want(gy, x, clamp=None)
    grouped = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, groups, 1.5)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(weight) as d_w, acl_swiglu.to_device(y_origin) as d_y, \
            acl_swiglu.to_device(groups) as d_groups, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out, \
            acl_swiglu.DeviceArray.empty(weight.shape, np.float32) as out_w:
        for revision in (2, 1, 2, 1, 1, 2):
            monkeypatch.setenv("ACL_SWIGLU_ABI", str(revision))
            assert acl_swiglu.abi_revision() == revision
            assert _same(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], off), revision
            _lean(d_gy, d_x, out, stream, None)
            assert _same(out.to_numpy(), off), revision
            group_index = groups if revision == 1 else d_groups
            got_x, got_w = acl_swiglu.swiglu_group_quant_grad_device(
                d_gy, d_x, d_w, d_y, group_index, 1.5, grad_x=out, grad_weight=out_w, stream=stream)
            assert _same(got_x.to_numpy(), grouped[0]) and _same(got_w.to_numpy(), grouped[1]), revision
            one_x, one_w = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, groups, 1.5)
            assert _same(one_x, grouped[0]) and _same(one_w, grouped[1]), revision


# ----------------------------------------------------------------------------- faults

DECLARED = tuple(dict.fromkeys(declaration.symbol for declaration in _ffi.declarations()))
# Called once per process or at exit, or with no status to fail: not part of one call.
NOT_PER_CALL = {"aclInit", "aclFinalize", "aclrtResetDevice", "aclGetRecentErrMsg", "aclrtGetDevice"}
# A failed destroy/free leaves its handle live by design: injected in a child process below.
RELEASES = {"aclDestroyTensor", "aclDestroyIntArray", "aclDestroyAclOpExecutor", "aclrtDestroyStream", "aclrtFree"}
FAULT_CODE = 507000   # any code: each is its own class, checked by code


def _enumerate_faults(operation: Callable[[], np.ndarray], want: np.ndarray, apis,
                      prepare: Callable[[], None] = lambda: None) -> Dict[str, int]:
    """Injects a failure into the Nth call of each API in turn (N = 1, 2, ... until it no longer
    fires): the operation raises the AclError of that API and code, with exactly one injected
    fault's text; nothing it made is left; the next call gives the model's bits. `prepare` runs
    before each injected run. Returns how often each API is called."""
    fired: Dict[str, int] = {}
    for api in apis:
        n = 1
        while n <= 50:
            prepare()
            gc.collect()
            before = emulator.live_counts()
            with emulator.inject_faults(f"{api}:{n}:{FAULT_CODE}"):
                try:
                    operation()
                    raised = None
                except errors.AclError as exc:
                    raised = exc
                count = emulator.faults_injected()
            if not count:
                assert raised is None, (api, n, raised)
                break
            fired[api] = n
            assert raised is not None, f"a failure of {api} call {n} was lost"
            assert (raised.api, raised.code) == (api, FAULT_CODE), (api, n, raised)
            assert raised.message.count("injected fault") == 1, (api, n, raised.message)
            raised = None   # (its traceback holds the call's frames)
            prepare()   # (what the operation may cache, dropped again)
            gc.collect()
            assert emulator.live_counts() == before, (api, n)
            assert _same(operation(), want), (api, n)
            n += 1
        else:
            pytest.fail(f"{api} was called more than 50 times in one operation")
    return fired


def test_every_call_of_a_lean_device_call_failed_in_turn(monkeypatch):
    gy, x = _case()
    want = _want(gy, x)
    general = GeneralCalls(monkeypatch)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        _warm(d_gy, d_x, out, stream)
        general.count = 0

        def operation():
            _lean(d_gy, d_x, out, stream)
            return out.to_numpy()

        fired = _enumerate_faults(operation, want, [api for api in DECLARED if api not in NOT_PER_CALL | RELEASES])
        assert {PHASE1, PHASE2, "aclrtSynchronizeStream", "aclrtMemcpy"} <= set(fired), fired
        # The pool emptied first: the workspace comes from run_with_workspace.
        fired = _enumerate_faults(operation, want, [api for api in DECLARED if api not in NOT_PER_CALL | RELEASES],
                                  stream.release_workspace)
        assert "aclrtMalloc" in fired, fired
        assert general.count == 0   # every call was a lean one


@pytest.mark.parametrize("abi", [1, 2], indirect=True)
def test_every_call_of_a_one_shot_helper_call_failed_in_turn(abi):
    """Revision 1 also makes (and frees) an aclIntArray of the group counts around phase 1."""
    assert _scratch.arena_helper(_ffi.api(), PHASE2) is not None, "the one-shot calls must take the C helper"
    gy, x = _case(rows=5, hidden=16, seed=21)
    rng = np.random.default_rng(21)
    weight = (rng.random((5, 1)) + 0.5).astype(np.float32)
    y_origin = rng.standard_normal((5, 16)).astype(np.float32)
    groups = np.array([3, 1], np.int64)
    want = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, groups, 1.5)

    def operation():
        grad_x, grad_w = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, groups, 1.5)
        assert _same(grad_w, want[1])
        return grad_x

    operation()   # the layout and its workspace size
    fired = _enumerate_faults(operation, want[0], [api for api in DECLARED if api not in NOT_PER_CALL | RELEASES])
    assert {"aclrtMalloc", "aclrtMemcpy", "aclCreateTensor", PHASE1, PHASE2, "aclrtSynchronizeStream"} <= set(fired)
    arrays = 4 + 2 if abi == 1 else 5 + 2   # the inputs in (revision 1's group counts are host values), 2 outputs out
    assert fired["aclrtMemcpy"] == arrays and fired["aclCreateTensor"] == arrays, fired
    assert ("aclCreateIntArray" in fired) == (abi == 1), fired


_HELPER_RELEASE_FAULTS = r"""
import gc, json, sys
import numpy as np
import acl_swiglu
import acl_swiglu.op
from acl_swiglu import _ffi, _scratch, emulator, errors
import device_model

assert _scratch.arena_helper(_ffi.api(), "aclnnSwigluGroupQuantGrad") is not None
rng = np.random.default_rng(8)
gy = rng.standard_normal((4, 8)).astype(np.float32)
x = rng.standard_normal((4, 16)).astype(np.float32)
want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.5)[0]
acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
report = []
for api in ("aclDestroyTensor", "aclrtFree"):
    for n in range(1, 10):
        for also in ("", ",aclnnSwigluGroupQuantGrad:1:561103", ",aclrtMemcpy:3:507000"):
            if also and not report or also and report[-1]["plan"] != f"{api}:{n}":
                break   # (the release failed alone first)
            before = emulator.live_counts()
            with emulator.inject_faults(f"{api}:{n}:161002{also}"):
                try:
                    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)
                    first = None
                except errors.AclError as error:
                    first = [error.api, error.code, error.message.count("injected fault")]
                fired = emulator.faults_injected()
            if not fired:
                continue
            gc.collect()
            after = emulator.live_counts()
            leaked = {k: after[k] - before[k] for k in after if k != "bytes" and after[k] != before[k]}
            got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)[0]
            report.append({"plan": f"{api}:{n}{also}", "fired": fired, "first": first, "leaked": leaked,
                           "next": bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))})
print(json.dumps(report))
"""


@pytest.mark.emulator_only
def test_every_release_of_a_one_shot_helper_call_failed_in_turn(tmp_path):
    """A failed destroy or free in the helper's release (its handle stays live: a child
    process), alone and after a failed launch or copy back: the first failure is the error,
    with its text alone; only the handle whose release failed is left; the next call works."""
    report = _run_child(_HELPER_RELEASE_FAULTS, tmp_path)
    plans = {entry["plan"] for entry in report}
    assert {"aclDestroyTensor:1", "aclDestroyTensor:2", "aclrtFree:1"} <= plans, plans
    for entry in report:
        api = entry["plan"].split(":")[0]
        primary = {"aclnnSwigluGroupQuantGrad": [PHASE2, 561103], "aclrtMemcpy": ["aclrtMemcpy", 507000]}
        expected = [api, 161002]
        for name, first in primary.items():
            if "," + name in entry["plan"]:
                assert entry["fired"] == 2, entry
                expected = first
        assert entry["first"][:2] == expected and entry["first"][2] == 1, entry
        kind = "tensor" if api == "aclDestroyTensor" else "allocation"
        assert entry["leaked"] == {kind: 1}, entry   # the one handle whose release failed
        assert entry["next"], entry


# ----------------------------------------------------------------------------- KeyboardInterrupt


class Interrupt(BaseException):
    """Stands for KeyboardInterrupt / SystemExit raised by a signal handler at a bad moment."""


def _interrupt_once(monkeypatch, owner: Any, name: str) -> List[int]:
    """Makes owner.name raise Interrupt on its first call (then behave as before)."""
    real = getattr(owner, name)
    calls = [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            raise Interrupt(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupted)
    return calls


def test_interrupt_while_a_one_shot_helper_call_takes_its_first_workspace(monkeypatch):
    """The first call of a layout takes its workspace from the stream's pool between the
    helper's open and finish: interrupted there, the arena, the tensors and the executor are all
    released, and the next call works."""
    assert _scratch.arena_helper(_ffi.api(), PHASE2) is not None
    gy, x = _case(rows=3, hidden=40, seed=31)   # a layout no other test uses
    want = _want(gy, x, clamp=0.5)
    acl_swiglu.swiglu_group_quant_grad(*_case(rows=2, hidden=8))   # the thread's stream exists
    acl_swiglu.release_cached()
    acl_swiglu.swiglu_group_quant_grad(*_case(rows=2, hidden=8))
    gc.collect()
    before = emulator.live_counts()
    calls = _interrupt_once(monkeypatch, _device.Stream, "_take_workspace")
    with pytest.raises(Interrupt):
        acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)
    assert calls[0] == 1
    gc.collect()
    after = emulator.live_counts()
    assert after["executor"] == 0 and after == before, (before, after)
    assert _same(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)[0], want)
    assert _same(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)[0], want)   # from the arena


@pytest.mark.parametrize("step", ["take-workspace", "mark-written"])
def test_interrupt_inside_a_lean_device_call(monkeypatch, step):
    """Interrupted while taking a workspace (after phase 1) or while marking the outputs (after
    phase 2): no executor is left, every pin is released (closing the arrays frees them), and
    the next call gives the model's bits."""
    gy, x = _case()
    want = _want(gy, x)
    with acl_swiglu.Stream() as stream:
        d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
        out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
        _warm(d_gy, d_x, out, stream)
        if step == "take-workspace":
            stream.release_workspace()
            calls = _interrupt_once(monkeypatch, _device.Stream, "_take_workspace")
        else:
            calls = _interrupt_once(monkeypatch, _aclnn, "mark_written")
        with pytest.raises(Interrupt):
            _lean(d_gy, d_x, out, stream)
        assert calls[0] == 1
        stream.synchronize()
        assert emulator.live_counts()["executor"] == 0
        lives = [d_gy.buffer._life, d_x.buffer._life, out.buffer._life]
        assert [life.pins for life in lives] == [0, 0, 0]
        _lean(d_gy, d_x, out, stream)
        assert _same(out.to_numpy(), want)
        before = emulator.live_counts()
        for array in (d_gy, d_x, out):
            array.close()
        after = emulator.live_counts()
        assert before["allocation"] - after["allocation"] == 3 and before["tensor"] - after["tensor"] == 3


# ----------------------------------------------------------------------------- garbage collection


def test_arrays_dropped_without_close_between_lean_calls():
    """Outputs and inputs left to the garbage collector between lean calls (some in reference
    cycles): every call gives the model's bits and everything dropped is freed."""
    gy, x = _case()
    want = _want(gy, x)
    with acl_swiglu.Stream() as stream:
        keep_gy, keep_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
        try:
            out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
            _warm(keep_gy, keep_x, out, stream)
            del out
            gc.collect()
            before = emulator.live_counts()
            for round_ in range(30):
                d_gy = acl_swiglu.to_device(gy) if round_ % 3 == 0 else keep_gy
                out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
                for _ in range(2):
                    _lean(d_gy, keep_x, out, stream)
                if round_ % 2:
                    out.cycle = out   # collectable only by the cycle collector
                else:
                    assert _same(out.to_numpy(), want), round_
                del out, d_gy
                if round_ % 5 == 4:
                    gc.collect()
            gc.collect()
            stream.synchronize()
            assert emulator.live_counts() == before
        finally:
            keep_gy.close()
            keep_x.close()


def test_gc_callback_that_calls_and_closes_during_lean_calls():
    """A gc callback (run by any allocation, also inside a lean call) makes its own device call
    and closes arrays a lean call may be using: no deadlock, and every lean call gives the
    model's bits or raises HandleClosedError for an array that was closed."""
    gy, x = _case()
    want = _want(gy, x)
    stream = acl_swiglu.Stream()
    d_x = acl_swiglu.to_device(x)
    side_gy = acl_swiglu.to_device(gy)
    side_out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
    victims: List[acl_swiglu.DeviceArray] = []
    events = collections.Counter()
    inside = [False]
    allowance = [0]   # closes the callback may make in this round

    def callback(phase, info):
        if phase != "start" or inside[0]:
            return
        inside[0] = True
        try:
            events["collections"] += 1
            _lean(side_gy, d_x, side_out, stream)   # a call made from inside another one
            if victims and allowance[0]:
                allowance[0] -= 1
                victims[-1 - events["closed"] % 2].close()   # the call's output or its grad_y
                events["closed"] += 1
        finally:
            inside[0] = False

    outcomes = collections.Counter()
    thresholds = gc.get_threshold()
    try:
        _warm(side_gy, d_x, side_out, stream)
        gc.callbacks.append(callback)
        gc.set_threshold(1, 1, 1)   # a collection at nearly every allocation
        for round_ in range(40):
            d_gy = acl_swiglu.to_device(gy)
            out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
            victims.extend([d_gy, out])
            allowance[0] = round_ % 2   # odd rounds: one close, from inside whichever call collects
            for _ in range(3):
                try:
                    _lean(d_gy, d_x, out, stream)
                except errors.HandleClosedError:
                    assert d_gy.closed or out.closed
                    outcomes["closed"] += 1
                    break
                if not out.closed:
                    try:
                        got = out.to_numpy()
                    except errors.HandleClosedError:
                        outcomes["closed"] += 1
                        break
                    assert _same(got, want), round_
                    outcomes["ok"] += 1
    finally:
        gc.set_threshold(*thresholds)
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)
        stream.synchronize()
        got = side_out.to_numpy()
        for array in victims + [d_x, side_gy, side_out]:
            array.close()
        stream.close()
    assert _same(got, want)
    assert events["collections"] > 40 and events["closed"] >= 10 and outcomes["ok"] >= 20, (events, outcomes)


# ----------------------------------------------------------------------------- fork

_FORK_AFTER_CALLS = r"""
import json, os, sys, threading, time
import numpy as np
import acl_swiglu
import acl_swiglu.op
from acl_swiglu import errors
import device_model

rng = np.random.default_rng(2)
gy = rng.standard_normal((4, 8)).astype(np.float32)
x = rng.standard_normal((4, 16)).astype(np.float32)
want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=1.5)[0]
stream = acl_swiglu.Stream()
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
for _ in range(2):
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)

stop = threading.Event()
def busy():   # lean and one-shot calls on another thread while this one forks
    while not stop.is_set():
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)

def child():
    outcome = {}
    for name, call in (("lean", lambda: acl_swiglu.swiglu_group_quant_grad_device(
                            d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)),
                       ("one-shot", lambda: acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.5)),
                       ("read", lambda: out.to_numpy())):
        try:
            call()
            outcome[name] = "worked"
        except errors.AclError as exc:
            outcome[name] = [exc.code, "forked" in str(exc)]
    for name, step in (("close", lambda: (d_gy.close(), stream.close())), ("release", acl_swiglu.release_cached)):
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
parent_ok = bool(np.array_equal(got.to_numpy().view(np.uint32), want.view(np.uint32)))
print(json.dumps({"children": report, "parent": parent_ok}))
"""


@pytest.mark.emulator_only
def test_children_forked_during_lean_and_one_shot_calls(tmp_path):
    """Children forked (while another thread makes lean and one-shot calls, so the package's
    locks may be held) fail every ACL use clearly (AclError 100001 saying why), only drop their
    objects on close() and release_cached(), and never hang; the parent goes on."""
    report = _run_child(_FORK_AFTER_CALLS, tmp_path, timeout=200)
    assert report["parent"]
    assert len(report["children"]) == 5
    for child in report["children"]:
        assert "hung" not in child, child
        assert child["status"] == 0 and "crash" not in child["outcome"], child
        outcome = child["outcome"]
        for name in ("lean", "one-shot"):
            assert outcome[name] == [100001, True], child
        assert outcome["read"] in ("worked", [100001, True]), child
        assert outcome["close"] == "worked" and outcome["release"] == "worked", child


_MULTIPROCESSING_FORK = r"""
import json, multiprocessing
import numpy as np
import acl_swiglu
import acl_swiglu.op
from acl_swiglu import errors

rng = np.random.default_rng(2)
gy = rng.standard_normal((4, 8)).astype(np.float32)
x = rng.standard_normal((4, 16)).astype(np.float32)
stream = acl_swiglu.Stream()
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
for _ in range(2):
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
acl_swiglu.swiglu_group_quant_grad(gy, x)

def task(kind):
    try:
        if kind == "lean":
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, grad_x=out, stream=stream)
        else:
            acl_swiglu.swiglu_group_quant_grad(gy, x)
        return "worked"
    except errors.AclError as exc:
        return [exc.code, "forked" in str(exc)]

if __name__ == "__main__":
    with multiprocessing.get_context("fork").Pool(2) as pool:
        result = pool.map_async(task, ["lean", "one-shot", "lean", "one-shot"]).get(60)
    print(json.dumps(result))
"""


@pytest.mark.emulator_only
def test_multiprocessing_fork_pool_after_fast_calls(tmp_path):
    script = tmp_path / "fork_pool.py"
    script.write_text(_MULTIPROCESSING_FORK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_FAULT")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [[100001, True]] * 4


# ----------------------------------------------------------------------------- plans


def test_plan_input_rewritten_by_lean_calls_on_another_stream():
    """A plan reads an array that lean calls on another stream keep rewriting with other data
    (and unrelated arrays are closed meanwhile, moving close_epoch): every plan call waits for
    the last write (the one comparison sees the foreign write) and gives the bits of the data
    written last; closing the plan's input then fails its next call."""
    gy, x = _case(rows=6, hidden=16, seed=41)
    sources = [_case(rows=6, hidden=16, seed=50 + k)[1] for k in range(3)]
    middles = [_want(gy, source) for source in sources]          # what the lean calls write
    wants = [_want(gy, middle) for middle in middles]            # what the plan computes from it
    with acl_swiglu.Stream() as writer, acl_swiglu.Stream() as reader, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as middle:
        d_sources = [acl_swiglu.to_device(source) for source in sources]
        try:
            for d_source in d_sources:
                _warm(d_gy, d_source, middle, writer)
            with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, middle, clamp_limit=1.5, stream=reader) as plan:
                for round_ in range(12):
                    k = round_ % 3
                    _lean(d_gy, d_sources[k], middle, writer)   # queued on the writer: not run yet
                    assert middle.pending is writer
                    if round_ % 4 == 1:
                        acl_swiglu.to_device(gy).close()   # an unrelated close
                    grad_x, _ = plan()
                    assert _same(grad_x.to_numpy(), wants[k]), round_
                middle.close()
                with pytest.raises(errors.HandleClosedError):
                    plan()
        finally:
            for array in d_sources:
                array.close()
