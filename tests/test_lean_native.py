"""A device-level call repeated with the same arguments makes both phases in one call into the C
helper (binding/lean.c, through the operator's phase-1 thunk). These tests check that repeats
take it, that each way it can fail is reported as the same call from Python would be, and that
whatever it cannot do falls back to the calls from Python with the same bits."""

import threading

import numpy as np
import pytest

import acl_swiglu
import acl_swiglu.op
from acl_swiglu import _aclnn, _ffi, _lean, emulator, errors, runtime

import device_model

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
PHASE2 = "aclnnSwigluGroupQuantGrad"
OPERATOR = acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD
JOIN_TIMEOUT = 60

pytestmark = pytest.mark.skipif(acl_swiglu._scratch.helper_library() is None,
                                reason="the installed package has no C helper")


def _case(rows=5, hidden=12, seed=31):
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((rows, hidden)).astype(np.float32)
    x = rng.standard_normal((rows, 2 * hidden)).astype(np.float32)
    weight = (rng.random(rows) + 0.5).astype(np.float32)
    y_origin = rng.standard_normal((rows, hidden)).astype(np.float32)
    return gy, x, weight, y_origin


def _same_bits(got, want):
    return np.array_equal(got.view(np.uint32), want.view(np.uint32))


class _Python:
    """Counts the lean calls that made their phases from Python."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = _aclnn._both_phases

        def counted(*args):
            self.count += 1
            return real(*args)

        monkeypatch.setattr(_aclnn, "_both_phases", counted)


@pytest.fixture
def setup():
    gy, x, weight, y_origin = _case()
    want_x, want_w = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, clamp_limit=1.25)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(weight) as d_w, acl_swiglu.to_device(y_origin) as d_yo, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as gx, \
            acl_swiglu.DeviceArray.empty(weight.shape, np.float32) as gw:
        def call():
            out = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, clamp_limit=1.25, grad_x=gx,
                                                            grad_weight=gw, stream=stream)
            assert out == (gx, gw)
            return out

        def check():
            stream.synchronize()
            assert _same_bits(gx.to_numpy(), want_x) and _same_bits(gw.to_numpy(), want_w)

        yield call, check, stream, (d_gy, d_x, d_w, gx, gw)


def test_repeats_make_both_phases_in_c(setup, monkeypatch):
    call, check, _, _ = setup
    python = _Python(monkeypatch)
    call()   # validates the layout (the general path)
    call()   # the first lean call: pins, from Python
    assert python.count == 1
    for _ in range(4):
        call()
        check()
    assert python.count == 1
    assert isinstance(OPERATOR.last_call.native[0], _lean.LeanCall)


def test_a_wrapper_put_in_place_of_phase_1_sees_every_repeat(setup, monkeypatch):
    call, check, _, _ = setup
    for _ in range(3):
        call()
    api = runtime.runtime_api()
    seen = []
    real = getattr(api.hot, PHASE1)

    def wrapper(*args):
        seen.append(len(args))
        return real(*args)

    monkeypatch.setattr(api.hot, PHASE1, wrapper)
    call()
    call()
    assert seen == [10, 10]
    check()


@pytest.mark.emulator_only
@pytest.mark.parametrize("fault,api_name,code", [
    (f"{PHASE1}:1:161002", PHASE1, 161002),
    (f"{PHASE2}:1:507015", PHASE2, 507015),
])
def test_a_failed_phase_in_c_is_reported_as_from_python(setup, fault, api_name, code):
    call, check, _, _ = setup
    for _ in range(3):
        call()
    before = emulator.live_counts()
    with emulator.inject_faults(fault):
        with pytest.raises(errors.AclError) as info:
            call()
    assert info.value.api == api_name and info.value.code == code
    assert "injected fault" in info.value.message
    assert emulator.live_counts()["executor"] == before["executor"]   # none left behind
    call()   # and the next repeat works
    check()


@pytest.mark.emulator_only
def test_more_workspace_than_the_record_holds_falls_back_to_python(setup, monkeypatch):
    call, check, _, _ = setup
    for _ in range(3):
        call()
    lean = OPERATOR.last_call.native[0]
    assert isinstance(lean, _lean.LeanCall)
    monkeypatch.setattr(lean.record, "workspace_capacity", 0)   # as if phase 1 now asked for more
    python = _Python(monkeypatch)
    before = emulator.live_counts()
    call()
    assert python.count == 1
    check()
    assert emulator.live_counts() == before


_DESTROY_FAILS = r"""
import json, sys
import numpy as np
import acl_swiglu, acl_swiglu.op
from acl_swiglu import emulator, errors

rng = np.random.default_rng(3)
gy = rng.standard_normal((4, 8)).astype(np.float32)
x = rng.standard_normal((4, 16)).astype(np.float32)
stream = acl_swiglu.Stream()
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
gx = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
for _ in range(3):
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=gx, stream=stream)
want = gx.to_numpy()
acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD.last_call.native[0].record.workspace_capacity = 0
before = emulator.live_counts()["executor"]
with emulator.inject_faults("aclDestroyAclOpExecutor:1:161001"):
    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=gx, stream=stream)
report = {"same": bool(np.array_equal(gx.to_numpy().view(np.uint32), want.view(np.uint32))),
          "left": emulator.live_counts()["executor"] - before}
with emulator.inject_faults("aclrtMemcpy:1:507000"):
    try:
        acl_swiglu.to_device(np.zeros(3, np.float32))
    except errors.AclError as error:
        report["later"] = error.message
json.dump(report, sys.stdout)
"""


@pytest.mark.emulator_only
def test_a_failed_destroy_of_the_unused_executor_leaves_no_text(tmp_path):
    """(In a child: the fault leaves that executor live.) The call still succeeds from Python,
    and the destroy's message does not show up in the thread's next error."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_FAULT")}
    proc = subprocess.run([sys.executable, "-c", _DESTROY_FAILS], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["same"] and report["left"] == 1, report
    assert report["later"].count("injected fault") == 1 and "aclDestroyAclOpExecutor" not in report["later"], report


def test_repeats_from_several_threads_share_one_record(setup):
    call, check, stream, arrays = setup
    for _ in range(3):
        call()
    failures = []
    barrier = threading.Barrier(4)

    def worker():
        try:
            barrier.wait(JOIN_TIMEOUT)
            for _ in range(50):
                call()
        except BaseException as exc:   # reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads) and not failures, failures
    check()


def test_a_close_between_repeats_is_refused_then_rebuilt(setup):
    call, check, stream, (d_gy, d_x, d_w, gx, gw) = setup
    for _ in range(3):
        call()
    first = OPERATOR.last_call
    with acl_swiglu.DeviceArray.empty((3,), np.float32):
        pass   # an unrelated close: the next call is checked again, and remembered anew
    call()
    call()
    assert OPERATOR.last_call is not first and isinstance(OPERATOR.last_call.native[0], _lean.LeanCall)
    check()
    d_x.close()
    with pytest.raises(errors.HandleClosedError):
        call()


def test_scalars_reach_phase_1_as_their_c_bytes():
    """The record carries clampLimit's bytes; the thunk reads them back as the double."""
    gy, x, _, _ = _case(seed=32)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as gx:
        for clamp in (0.3, 1.0 + 2 ** -52, 7.5):
            want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=clamp)[0]
            for _ in range(3):
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=clamp, grad_x=gx, stream=stream)
            record = OPERATOR.last_call.native[0].record
            assert record.scalars[0] == np.float64(clamp).view(np.uint64)
            assert _same_bits(gx.to_numpy(), want), clamp
    _ffi.api()   # (the module stays bound)


# ----------------------------------------------------------------------------- one-shot calls


@pytest.mark.emulator_only
@pytest.mark.parametrize("nth", [1, 2])   # the layout's first call (arena without workspace) and a later one
def test_a_one_shot_phase_1_failure_in_c_names_phase_1(nth):
    gy, x, weight, y_origin = _case(seed=33)
    acl_swiglu.release_cached()
    acl_swiglu.swiglu_group_quant_grad(gy[:1], x[:1])   # (another layout: the thread's stream exists)
    for _ in range(nth - 1):
        acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, clamp_limit=0.5)
    before = emulator.live_counts()
    with emulator.inject_faults(f"{PHASE1}:1:161002"):
        with pytest.raises(errors.AclError) as info:
            acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, clamp_limit=0.5)
    assert info.value.api == PHASE1 and info.value.code == 161002 and "injected fault" in info.value.message
    assert emulator.live_counts() == before   # the arena, its tensors: all released
    want = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, clamp_limit=0.5)
    got = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, clamp_limit=0.5)
    assert _same_bits(got[0], want[0]) and _same_bits(got[1], want[1])


def test_a_wrapper_put_in_place_of_phase_1_sees_every_one_shot_call(monkeypatch):
    gy, x, _, _ = _case(seed=34)
    want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=0.5)[0]
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)   # the layout's record exists
    api = runtime.runtime_api()
    real = getattr(api.hot, PHASE1)
    seen = []

    def wrapper(*args):
        seen.append(len(args))
        return real(*args)

    monkeypatch.setattr(api.hot, PHASE1, wrapper)
    for _ in range(2):
        assert _same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)[0], want)
    assert seen == [10, 10]


def test_the_helper_reads_host_addresses_where_numpy_keeps_them():
    """On CPython the helper takes each host array's address from the array object (one id()
    per array): the offset it uses is checked here on arrays of every kind a call gets."""
    import ctypes
    import platform

    import ml_dtypes
    from acl_swiglu import _scratch
    if platform.python_implementation() != "CPython":
        assert _scratch.HOST_DATA_OFFSET == -1
        return
    offset = _scratch.HOST_DATA_OFFSET
    assert offset == object.__basicsize__
    base = np.arange(96, dtype=np.float32).reshape(8, 12)
    readonly = base.copy()
    readonly.flags.writeable = False
    arrays = [base, base[3:, 2:], base[::2], base[::-1], readonly, np.empty((0, 4), np.float32),
              base.astype(ml_dtypes.bfloat16), np.zeros(3, np.int64), base.T, np.ones(())]
    for array in arrays:
        assert ctypes.c_void_p.from_address(id(array) + offset).value == array.ctypes.data, array


@pytest.mark.parametrize("kind", ["plain", "sliced", "readonly", "reversed", "bf16", "empty"])
def test_one_shot_bits_with_and_without_addresses_read_in_c(monkeypatch, kind):
    import ml_dtypes
    gy, x, weight, y_origin = _case(rows=6, hidden=8, seed=35)
    if kind == "sliced":
        gy, x = np.repeat(gy, 2, axis=0)[::2], np.repeat(x, 2, axis=0)[::2]
    elif kind == "readonly":
        for array in (gy, x, weight, y_origin):
            array.flags.writeable = False
    elif kind == "reversed":
        gy, x = gy[::-1], x[::-1]
    elif kind == "bf16":
        gy, x, y_origin = (a.astype(ml_dtypes.bfloat16) for a in (gy, x, y_origin))
    elif kind == "empty":
        gy, x, weight, y_origin = gy[:0], x[:0], weight[:0], y_origin[:0]
    want = device_model.swiglu_group_quant_grad_model(gy, x, weight, y_origin, clamp_limit=0.5)
    for offset in (acl_swiglu._scratch.HOST_DATA_OFFSET, -1):
        monkeypatch.setattr(_aclnn, "HOST_DATA_OFFSET", offset)
        for _ in range(2):
            got = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, clamp_limit=0.5)
            assert got[0].shape == want[0].shape and got[1].shape == want[1].shape
            assert np.array_equal(got[0].view(np.uint8), want[0].view(np.uint8)), (kind, offset)
            assert np.array_equal(got[1].view(np.uint8), want[1].view(np.uint8)), (kind, offset)


def test_call_groups_free_each_handle_once_and_never_while_a_call_uses_it():
    """enter()/leave() take no lock. Per round: threads enter and leave one group in a loop (at
    a hostile switch interval) while its handles are closed, each while one more call that saw
    it open (its epoch unchanged after entering) is inside. Every handle is freed exactly once,
    and never while that call is inside."""
    import collections
    import ctypes
    import sys

    counts_lock = threading.Lock()
    in_use = collections.Counter()
    released, violations = [], []

    class Handle(runtime.Owned):
        _kind = "test handle"

        def __init__(self, key):
            super().__init__()

            def release(key=key):
                with counts_lock:
                    if in_use[key]:
                        violations.append(key)
                    released.append(key)
                return 0

            self._own(ctypes.c_void_p(key + 1), release)

    runtime.runtime_api()
    rounds, per_round = 30, 6
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for round_ in range(rounds):
            handles = [Handle(round_ * 100 + k) for k in range(per_round)]
            group = runtime.CallGroup(h._life for h in handles)
            stop = threading.Event()

            def churn():
                while not stop.is_set():
                    visit = runtime.visit(group)
                    runtime.enter(visit)
                    runtime.leave(visit)

            def holder(key, inside, closed):
                epoch = runtime.close_epoch[0]
                visit = runtime.visit(group)
                runtime.enter(visit)
                try:
                    if runtime.close_epoch[0] == epoch:   # what the real calls check
                        with counts_lock:
                            in_use[key] += 1
                        inside.set()
                        closed.wait(JOIN_TIMEOUT)
                        with counts_lock:
                            in_use[key] -= 1
                    else:
                        inside.set()
                finally:
                    runtime.leave(visit)

            churners = [threading.Thread(target=churn) for _ in range(2)]
            for c in churners:
                c.start()
            for k, handle in enumerate(handles):
                inside, closed = threading.Event(), threading.Event()
                held = threading.Thread(target=holder, args=(round_ * 100 + k, inside, closed))
                held.start()
                assert inside.wait(JOIN_TIMEOUT)
                handle.close()
                closed.set()
                held.join(JOIN_TIMEOUT)
                assert not held.is_alive()
            stop.set()
            for c in churners:
                c.join(JOIN_TIMEOUT)
            assert not any(c.is_alive() for c in churners)
    finally:
        sys.setswitchinterval(previous)
    assert not violations, violations[:10]
    assert sorted(released) == sorted(r * 100 + k for r in range(rounds) for k in range(per_round))
    assert not runtime._inside and runtime._closing == [0]


def test_a_visit_left_without_being_entered_leaves_the_others():
    """leave() of a visit that was never entered (an exception came first) does nothing; in
    particular it does not end another call's visit of the same group."""
    import ctypes

    released = []

    class Handle(runtime.Owned):
        _kind = "test handle"

        def __init__(self):
            super().__init__()
            self._own(ctypes.c_void_p(1), lambda: released.append(1) or 0)

    runtime.runtime_api()
    handle = Handle()
    group = runtime.CallGroup([handle._life])
    inside, never = runtime.visit(group), runtime.visit(group)
    runtime.enter(inside)
    runtime.leave(never)
    handle.close()
    assert released == []   # still held by the visit inside
    runtime.leave(inside)
    assert released == [1] and not runtime._inside


def test_a_one_shot_stream_closed_as_soon_as_it_is_seen_lasts_the_call(monkeypatch):
    """A thread's new one-shot stream is held before release_cached() can see it: closed at
    that moment (as by release_cached() on another thread), it is destroyed after the call,
    which gives the model's bits, and the next call makes another."""
    import weakref
    gy, x, _, _ = _case(seed=36)
    want = device_model.swiglu_group_quant_grad_model(gy, x, clamp_limit=0.5)[0]
    acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)   # the layout
    acl_swiglu.release_cached()   # this thread has no stream now
    closed = []

    class ClosedOnSight(weakref.WeakSet):
        def add(self, stream):
            super().add(stream)
            stream.close()
            closed.append(stream)

    monkeypatch.setattr(_aclnn, "_thread_streams", ClosedOnSight())
    before = emulator.live_counts()["stream"]
    got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)[0]
    assert _same_bits(got, want) and len(closed) == 1
    assert emulator.live_counts()["stream"] == before   # destroyed when the call left it
    got = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=0.5)[0]
    assert _same_bits(got, want) and len(closed) == 2
    assert emulator.live_counts()["stream"] == before


def test_a_restored_phase_1_makes_repeats_go_through_c_again(setup, monkeypatch):
    """api.hot counts its rebindings: the record is checked again after one, and stands again
    once the function it calls is back."""
    call, check, _, _ = setup
    for _ in range(3):
        call()
    api = runtime.runtime_api()
    real = getattr(api.hot, PHASE1)
    before = api.hot.rebound
    with monkeypatch.context() as patch:
        patch.setattr(api.hot, PHASE1, lambda *args: real(*args))
        assert api.hot.rebound == before + 1
        python = _Python(patch)
        call()
        assert python.count == 1   # wrapped: from Python
    assert getattr(api.hot, PHASE1) is real and api.hot.rebound == before + 2
    python = _Python(monkeypatch)
    call()
    call()
    assert python.count == 0   # the record stands again
    check()
