"""Adversarial inputs to the NumPy and device-level APIs: odd layouts and byte orders give the
bytes of the plain contiguous call, group_index values that wrap in uint32 follow the reference,
junk dtypes and out-of-range integers are refused naming the argument before anything is
allocated, huge shapes fail cleanly, and plans refuse what does not fit the layout they were
built for."""

import copy
import os
import pickle
import subprocess
import sys
import textwrap
from contextlib import ExitStack

import ml_dtypes
import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import reference
from swiglu_cases import Proxy

T, H = 8, 16


def _inputs(dtype=np.float32, seed=5):
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((T, H), dtype=np.float32).astype(dtype)
    x = (rng.standard_normal((T, 2 * H), dtype=np.float32) * 3).astype(dtype)
    w = rng.uniform(0.5, 1.5, (T, 1)).astype(np.float32)
    yo = rng.standard_normal((T, H), dtype=np.float32).astype(dtype)
    return gy, x, w, yo


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_layouts_and_byte_orders_give_the_contiguous_bytes(dtype):
    gy, x, w, yo = _inputs(dtype)
    want_gx, want_gw = acl_swiglu.swiglu_group_quant_grad(gy, x, weight=w, y_origin=yo, clamp_limit=2.0)
    # Negative strides: the reversed views give the reversed rows.
    gx, gw = acl_swiglu.swiglu_group_quant_grad(gy[::-1], x[::-1], weight=w[::-1], y_origin=yo[::-1],
                                                clamp_limit=2.0)
    assert np.array_equal(_bits(gx), _bits(want_gx[::-1]))
    assert np.array_equal(_bits(gw), _bits(want_gw[::-1]))
    # Fortran order, read-only arrays, and views with a step inside a bigger buffer.
    ro = [np.asfortranarray(a) for a in (gy, x, w, yo)]
    for a in ro:
        a.flags.writeable = False
    gx, gw = acl_swiglu.swiglu_group_quant_grad(*ro[:2], weight=ro[2], y_origin=ro[3], clamp_limit=2.0)
    assert np.array_equal(_bits(gx), _bits(want_gx)) and np.array_equal(_bits(gw), _bits(want_gw))
    wide = np.zeros((T, 2 * H, 2), dtype=gy.dtype)
    wide[:, :H, 1] = gy
    gx, _ = acl_swiglu.swiglu_group_quant_grad(wide[:, :H, 1], x, weight=w, y_origin=yo, clamp_limit=2.0)
    assert np.array_equal(_bits(gx), _bits(want_gx))
    # The inputs were not written to.
    assert np.array_equal(_bits(wide[:, :H, 1]), _bits(gy))


def test_non_native_byte_order_is_read_as_its_values():
    gy, x, w, yo = _inputs(np.float32)
    want_gx, want_gw = acl_swiglu.swiglu_group_quant_grad(gy, x, weight=w, y_origin=yo)
    swapped = [a.astype(a.dtype.newbyteorder(">")) for a in (gy, x, w, yo)]
    gx, gw = acl_swiglu.swiglu_group_quant_grad(*swapped[:2], weight=swapped[2], y_origin=swapped[3])
    assert np.array_equal(gx.astype(np.float32), want_gx) and np.array_equal(gw.astype(np.float32), want_gw)


@pytest.mark.parametrize("groups, rows", [
    ([2**32 - 1, 3], 2),          # sums in uint32: 2**32 - 1 + 3 wraps to 2
    ([-1, 2], 1),                 # -1 is 2**32 - 1 as uint32
    ([2**31, 2**31], 0),          # wraps to exactly 0
    ([2**32, 3], 3),              # 2**32 is 0 as uint32
    ([], 0),                      # G = 0: trunc = 0
    ([100], T),                   # more than T: every row
])
def test_group_index_counts_wrap_in_uint32(groups, rows):
    gy, x, w, yo = _inputs(np.float32, seed=6)
    gi = np.array(groups, np.int64)
    gx, gw = acl_swiglu.swiglu_group_quant_grad(gy, x, weight=w, y_origin=yo, group_index=gi, clamp_limit=1.5)
    ref_gx, ref_gw = reference.swiglu_group_quant_grad(gy, x, weight=w, y_origin=yo, group_index=gi, clamp_limit=1.5)
    written = np.flatnonzero(np.any(gx != 0, axis=1) | (gw[:, 0] != 0))
    assert list(written) == list(range(rows))
    assert np.all(_bits(gx[rows:]) == 0) and np.all(_bits(gw[rows:]) == 0)   # +0.0, not -0.0
    assert np.allclose(gx, ref_gx, rtol=1e-5, atol=1e-6) and np.allclose(gw, ref_gw, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("make, name, rule", [
    (lambda gy, x: (gy.astype(object), x.astype(object)), "grad_y", "dtype object"),
    (lambda gy, x: (np.zeros(gy.shape, dtype=[("a", "<f4")]), x), "grad_y", "float32, float16 or bfloat16"),
    (lambda gy, x: (np.zeros(gy.shape, dtype="V4"), x), "grad_y", "float32, float16 or bfloat16"),
    (lambda gy, x: (gy.astype(np.float64), x.astype(np.float64)), "grad_y", "dtype float64"),
    (lambda gy, x: (gy, x.astype(np.float16)), "x", "they must match"),
    (lambda gy, x: (gy, x[:, :-1]), "x", ""),
    (lambda gy, x: (np.zeros((1,) * 8 + (2,), np.float32), np.zeros((1,) * 8 + (4,), np.float32)), "grad_y", "1 to 8 dims"),
])
def test_junk_arrays_are_refused_naming_the_argument(make, name, rule):
    gy, x, _, _ = _inputs()
    before = acl_swiglu.emulator.live_counts()
    with pytest.raises(acl_swiglu.ArgumentError) as info:
        acl_swiglu.swiglu_group_quant_grad(*make(gy, x))
    assert name in str(info.value) and rule in str(info.value)
    assert acl_swiglu.emulator.live_counts() == before


@pytest.mark.parametrize("group_index, exc, words", [
    (np.array([1, 2], np.int32), acl_swiglu.ArgumentError, "int64"),
    (np.array([1, 2], np.uint64), acl_swiglu.ArgumentError, "int64"),
    (np.array([True]), acl_swiglu.ArgumentError, "int64"),
    (np.array([[1, 2]], np.int64), acl_swiglu.ArgumentError, "1-D"),
    ([1, 2], TypeError, "group_index"),
])
def test_bad_group_index_is_refused(group_index, exc, words):
    gy, x, _, _ = _inputs()
    with pytest.raises(exc) as info:
        acl_swiglu.swiglu_group_quant_grad(gy, x, group_index=group_index)
    assert "group_index" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize("clamp, exc, words", [
    (0.0, acl_swiglu.ArgumentError, "> 0"), (-0.0, acl_swiglu.ArgumentError, "> 0"),
    (-1.0, acl_swiglu.ArgumentError, "None"), (float("nan"), acl_swiglu.ArgumentError, "finite"),
    (float("inf"), acl_swiglu.ArgumentError, "finite"), (1e-50, acl_swiglu.ArgumentError, "rounds to 0"),
    (1e308, acl_swiglu.ArgumentError, "float32 range"), (True, TypeError, "bool"),
    ("1", TypeError, "str"), (1j, TypeError, "complex"),
])
def test_bad_clamp_limits_are_refused(clamp, exc, words):
    gy, x, _, _ = _inputs()
    with pytest.raises(exc) as info:
        acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=clamp)
    assert "clamp_limit" in str(info.value) and words in str(info.value)


@pytest.mark.parametrize("call", ["one-shot", "device"])
def test_a_number_only_in_name_is_refused_as_clamp_limit(call):
    """A transparent proxy of a float passes isinstance(numbers.Real) but float() refuses it."""
    gy, x, _, _ = _inputs()
    with pytest.raises(TypeError, match="clamp_limit must be None .* Proxy"):
        if call == "one-shot":
            acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=Proxy(1.5))
        else:
            with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x:
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=Proxy(1.5))


def test_a_buffers_size_is_fixed_once_made():
    """Copies are checked against the size: a larger one set afterwards would let them write past
    the allocation."""
    with acl_swiglu.DeviceBuffer(64) as buffer:
        with pytest.raises(AttributeError):
            buffer.nbytes = 1 << 20
        with pytest.raises(acl_swiglu.ArgumentError, match="exceeds the buffer's 64 bytes"):
            buffer.copy_from_host(np.zeros(1024, np.uint8))


def test_what_launches_rely_on_cannot_be_reassigned():
    """A plan's stream and an executor's workspace size and repeatability are what its launches
    are made with: reassigning them would make the object say one thing and do another (a
    single-use executor taken for repeatable is one CANN frees and the package would free again)."""
    gy, x, _, _ = _inputs()
    with acl_swiglu.Stream() as stream, acl_swiglu.Stream() as other, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.to_device(x) as d_x, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as d_gx:
        want = acl_swiglu.swiglu_group_quant_grad(gy, x)[0]
        with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=d_gx, stream=stream) as plan:
            with pytest.raises(AttributeError):
                plan.stream = other
            assert plan.stream is stream
            plan(synchronize=True)
        with acl_swiglu.get_workspace_size(d_gy, d_x, grad_x=d_gx) as executor:
            for attribute, value in (("repeatable", True), ("workspace_size", 0), ("launches", 5)):
                with pytest.raises(AttributeError):
                    setattr(executor, attribute, value)
            assert not executor.repeatable and executor.launches == 0
            executor.launch(stream)
            stream.synchronize()
            assert executor.launches == 1 and executor.closed
        assert np.array_equal(_bits(d_gx.to_numpy()), _bits(want))


def test_numpy_scalars_are_taken_as_their_values():
    gy, x, _, _ = _inputs()
    want, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=1.0)
    for clamp in (np.float32(1.0), np.int64(1), np.float64(1.0)):
        got, _ = acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=clamp)
        assert np.array_equal(_bits(got), _bits(want))
    with acl_swiglu.DeviceBuffer(np.int64(64)) as buffer:
        data = np.arange(16, dtype=np.float32)
        buffer.copy_from_host(data)
        back = np.zeros(16, np.float32)
        buffer.copy_to_host(back)
        assert np.array_equal(back, data)
        with pytest.raises(acl_swiglu.ArgumentError, match="exceeds the buffer's 64 bytes"):
            buffer.copy_from_host(np.zeros(17, np.float32))


@pytest.mark.parametrize("value", [2**64, -1, 0, 4.0, True, 2**63])
def test_out_of_range_sizes_are_refused_before_allocating(value):
    before = acl_swiglu.emulator.live_counts()
    with pytest.raises(acl_swiglu.ArgumentError) as info:
        acl_swiglu.DeviceBuffer(value)
    assert "nbytes" in str(info.value)
    assert acl_swiglu.emulator.live_counts() == before


@pytest.mark.parametrize("ptr, words", [(0, "between 1"), (-1, "between 1"), (2**64, "between 1"), (1.5, "whole number")])
def test_wrap_refuses_impossible_pointers(ptr, words):
    with pytest.raises(acl_swiglu.ArgumentError) as info:
        acl_swiglu.DeviceArray.wrap(ptr, (4,), np.float32)
    assert "ptr" in str(info.value) and words in str(info.value)


def test_wrapped_views_outside_their_allocation_fail_with_the_status():
    gy, x, _, _ = _inputs()
    with acl_swiglu.to_device(gy) as dgy, acl_swiglu.to_device(x) as dx:
        shifted = acl_swiglu.DeviceArray.wrap(dgy.ptr, gy.shape, np.float32, offset=1)
        with pytest.raises(acl_swiglu.AclError) as info:
            acl_swiglu.swiglu_group_quant_grad_device(shifted, dx)
        assert info.value.code == 161002 and "gradY" in str(info.value) and "past the end" in str(info.value)
        shifted.close()
        room = np.zeros(T * H + 8, np.float32)
        start = (-room.ctypes.data % 32) // 4   # device tensor addresses must be 32-byte aligned
        room[start:start + T * H] = gy.ravel()
        host = acl_swiglu.DeviceArray.wrap(room[start:].ctypes.data, gy.shape, np.float32)
        with pytest.raises(acl_swiglu.AclError) as info:
            acl_swiglu.swiglu_group_quant_grad_device(host, dx)
        assert info.value.code == 161002 and "not device memory" in str(info.value)
        host.close()
        with pytest.raises(acl_swiglu.ArgumentError, match="strides"):
            acl_swiglu.DeviceArray.wrap(dgy.ptr, gy.shape, np.float32, strides=(-H, 1))
        with pytest.raises(acl_swiglu.ArgumentError, match="more than any device can address"):
            acl_swiglu.DeviceArray.wrap(dgy.ptr, gy.shape, np.float32, strides=(2**62, 1))


def test_huge_broadcast_shapes_fail_cleanly_before_allocating():
    before = acl_swiglu.emulator.live_counts()
    gy = np.broadcast_to(np.float32(1), (2**31, 2**20))
    x = np.broadcast_to(np.float32(1), (2**31, 2**21))
    with pytest.raises(acl_swiglu.HostMemoryError) as info:
        acl_swiglu.swiglu_group_quant_grad(gy, x)
    assert "grad_x" in str(info.value)
    assert acl_swiglu.emulator.live_counts() == before
    with pytest.raises(acl_swiglu.ArgumentError, match="more than any device can address"):
        acl_swiglu.DeviceArray.empty((2**40, 2**40), np.float32)


def test_plan_keeps_the_last_binding_and_refuses_other_layouts():
    gy, x, w, yo = _inputs()
    gi = np.array([3, 2], np.int64)
    arrays = [acl_swiglu.to_device(a) for a in (gy, x, w, yo, gi)]
    gy2 = (gy * 2).astype(np.float32)
    other = acl_swiglu.to_device(gy2)
    with acl_swiglu.Stream() as stream:
        plan = acl_swiglu.SwigluGroupQuantGradPlan(*arrays[:2], weight=arrays[2], y_origin=arrays[3],
                                                   group_index=arrays[4], clamp_limit=1.5, stream=stream)
        try:
            plan(grad_y=other)
            wrapped = acl_swiglu.to_device(np.array([2**32 - 1, 2], np.int64))
            plan(group_index=wrapped)   # grad_y stays the rebound one
            want = reference.swiglu_group_quant_grad(gy2, x, weight=w, y_origin=yo,
                                                     group_index=np.array([2**32 - 1, 2]), clamp_limit=1.5)
            assert np.allclose(plan.grad_x.to_numpy(), want[0], rtol=1e-5, atol=1e-6)
            assert np.allclose(plan.grad_weight.to_numpy(), want[1], rtol=1e-5, atol=1e-5)
            for bad in (acl_swiglu.to_device(gy[:4]), acl_swiglu.to_device(gy.astype(np.float16)), plan.grad_x,
                        acl_swiglu.to_device(np.array([1, 2, 3], np.int64))):
                name = "group_index" if bad.dtype == np.int64 else "grad_y"
                with pytest.raises(acl_swiglu.ArgumentError) as info:
                    plan(**{name: bad})
                assert name in str(info.value) and "the plan was built for" in str(info.value)
                if bad is not plan.grad_x:
                    bad.close()
            arrays[1].close()
            with pytest.raises(acl_swiglu.HandleClosedError, match="x is a closed DeviceArray"):
                plan()
            wrapped.close()
        finally:
            plan.close()
        with pytest.raises(acl_swiglu.HandleClosedError):
            plan()
    for a in arrays + [other]:
        a.close()


_FORK_SCRIPT = textwrap.dedent("""
    import os, threading, warnings
    import numpy as np
    warnings.simplefilter("ignore")
    import acl_swiglu
    rng = np.random.default_rng(2)
    gy = rng.standard_normal((64, 64)).astype(np.float32)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    want = acl_swiglu.swiglu_group_quant_grad(gy, x)[0]
    results, codes = [], []
    def worker():
        for _ in range(20):
            results.append(np.array_equal(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], want))
    def forker():
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                try:
                    acl_swiglu.swiglu_group_quant_grad(gy, x)
                    os._exit(0)
                except acl_swiglu.AclError as e:
                    os._exit(10 if e.code == 100001 else 11)
                except BaseException:
                    os._exit(12)
            codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    threads = [threading.Thread(target=worker) for _ in range(3)] + [threading.Thread(target=forker)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    print(len(results), all(results), codes)
""")


def test_fork_while_other_threads_call_leaves_a_child_that_refuses_cleanly(tmp_path):
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator")
    done = subprocess.run([sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=180,
                          env=env, start_new_session=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "60 True [10, 10, 10, 10]", done.stdout + done.stderr


# ---- objects that stand for native state ----


def _native_objects(stack, gy, x):
    stream = stack.enter_context(acl_swiglu.Stream())
    d_gy, d_x = stack.enter_context(acl_swiglu.to_device(gy)), stack.enter_context(acl_swiglu.to_device(x))
    d_gx = stack.enter_context(acl_swiglu.DeviceArray.empty(x.shape, x.dtype))
    return {
        "Stream": stream, "default stream": acl_swiglu.default_stream(),
        "DeviceBuffer": stack.enter_context(acl_swiglu.DeviceBuffer(64)), "DeviceArray": d_gy,
        "empty DeviceArray": acl_swiglu.DeviceArray.empty((0, 4), np.float32),
        "wrapped DeviceArray": acl_swiglu.DeviceArray.wrap(d_x.ptr, x.shape, x.dtype),
        "plan": stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=d_gx, stream=stream)),
        "Executor": stack.enter_context(acl_swiglu.get_workspace_size(d_gy, d_x, grad_x=d_gx)),
    }


def test_objects_that_stand_for_native_state_refuse_copies_and_pickling():
    """A copy would share the handle but not its life: closing or collecting one would free it
    under the other (and a copied executor's repeatability would disagree with its twin's)."""

    gy, x, _, _ = _inputs()
    with ExitStack() as stack:
        objects = _native_objects(stack, gy, x)
        for name, obj in objects.items():
            for attempt, words in ((copy.copy, "cannot be copied"), (copy.deepcopy, "cannot be copied"),
                                   (pickle.dumps, "cannot be pickled")):
                with pytest.raises(TypeError, match=f"{type(obj).__name__} objects {words}"):
                    attempt(obj)
        objects["Executor"].launch(objects["Stream"])   # (each still works)
        grad_x, _ = objects["plan"](synchronize=True)
        assert np.array_equal(_bits(grad_x.to_numpy()), _bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0]))


class _LyingArray(acl_swiglu.DeviceArray):
    """Says another array's address and layout, and that it is open: the package reads its own
    records instead."""

    other = None

    @property
    def ptr(self):
        return self.other.ptr

    @property
    def closed(self):
        return False

    @property
    def strides(self):
        return (0, 0)


def test_a_subclass_that_lies_about_its_memory_is_not_believed():
    gy, x, _, _ = _inputs()
    want = acl_swiglu.swiglu_group_quant_grad(gy, x)[0]
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(np.zeros_like(gy)) as zeros, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as d_gx:
        _LyingArray.other = zeros
        liar = _LyingArray(d_gy.buffer, gy.shape, gy.dtype)
        acl_swiglu.swiglu_group_quant_grad_device(liar, d_x, grad_x=d_gx, stream=stream)
        with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, grad_x=d_gx, stream=stream) as plan:
            plan(liar, synchronize=True)
            assert np.array_equal(_bits(d_gx.to_numpy()), _bits(want))
            zeros.close()   # (never used: the package reads the liar's own address)
            plan(synchronize=True)
            assert np.array_equal(_bits(d_gx.to_numpy()), _bits(want))
            with acl_swiglu.to_device(gy) as closing:
                closed_liar = _LyingArray(closing.buffer, gy.shape, gy.dtype)
            for attempt in (lambda: acl_swiglu.swiglu_group_quant_grad_device(closed_liar, d_x, grad_x=d_gx,
                                                                              stream=stream),
                            lambda: plan(closed_liar),
                            lambda: acl_swiglu.get_workspace_size(closed_liar, d_x, grad_x=d_gx)):
                with pytest.raises(acl_swiglu.HandleClosedError, match="grad_y"):
                    attempt()
