"""Device-level calls (swiglu_group_quant_grad_device) as a careless or hostile user makes them.

A call's phase 1 is made once per layout of its arguments and the repeatable executor is kept (a
few per operator) and rebound to each call's addresses: so calls that alternate arrays of one
layout, views, wrapped pointers, scalars equal in value but of other types, revisions switched
between calls, more layouts than any cache holds, and executors evicted or released while work
queued with them is pending must each compute on their own arguments' data. Every result is
compared bit for bit with tests/device_model.py.
"""

from __future__ import annotations

import collections
import gc
import threading

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator, errors

from swiglu_cases import (CLAMP, JOIN_TIMEOUT, Rigged, case, idle_counts, raiser, check_clamp_types, model, run_threads, same_bits, want,
                          weighted_case)

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
PHASE2 = "aclnnSwigluGroupQuantGrad"


def call(d_gy, d_x, out=None, stream=None, clamp=CLAMP, **kw):
    return acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=clamp, grad_x=out, stream=stream, **kw)


@pytest.fixture
def weighted_setup():
    """Weighted calls with every output given, on an own stream; call() makes one, check() reads
    both outputs against the model."""
    gy, x, weight, y_origin = weighted_case(5, 12, seed=31)
    want_x, want_w = model(gy, x, weight, y_origin, clamp=1.25)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(weight) as d_w, acl_swiglu.to_device(y_origin) as d_yo, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as gx, \
            acl_swiglu.DeviceArray.empty(weight.shape, np.float32) as gw:
        def run():
            out = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, clamp_limit=1.25, grad_x=gx,
                                                            grad_weight=gw, stream=stream)
            assert out == (gx, gw)

        def check():
            assert same_bits(gx.to_numpy(), want_x) and same_bits(gw.to_numpy(), want_w)

        yield run, check, (d_gy, d_x, gx, gw, stream)


# ---- repeated calls ----


def test_repeated_calls_give_the_bits(weighted_setup):
    run, check, _ = weighted_setup
    for _ in range(6):
        run()
        check()


@pytest.mark.parametrize("attribute, value", [("shape", (2, 2)), ("strides", (0, 0)), ("offset", 1),
                                              ("dtype", np.dtype(np.float16)), ("buffer", None)])
def test_an_arrays_layout_is_fixed_once_made(weighted_setup, attribute, value):
    """What validation saw is what later calls launch with: a layout cannot be changed under the
    executors kept for it."""
    run, check, (d_gy, *_) = weighted_setup
    for _ in range(3):
        run()
    before = getattr(d_gy, attribute)
    with pytest.raises(AttributeError):
        setattr(d_gy, attribute, value)
    assert getattr(d_gy, attribute) == before
    run()
    check()


def test_calls_alternating_outputs_given_and_made():
    gy, x = case(6, 24, seed=11)
    expected = want(gy, x, 1.25)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for round_ in range(3):
            grad_x, grad_w = call(d_gy, d_x, out, stream, 1.25)
            assert grad_x is out and grad_w is None
            assert same_bits(grad_x.to_numpy(), expected), round_
            made, _ = call(d_gy, d_x, None, stream, 1.25)
            with made:
                assert made is not out and same_bits(made.to_numpy(), expected), round_
        other = want(gy, x, 1.5)
        grad_x, _ = call(d_gy, d_x, out, stream, 1.5)   # another clamp: another executor
        assert same_bits(grad_x.to_numpy(), other)
        assert same_bits(call(d_gy, d_x, out, stream, 1.25)[0].to_numpy(), expected)


def test_one_layout_reached_by_views_wrapped_pointers_and_other_buffers():
    """Views at an offset in bigger buffers, wrapped foreign pointers, arrays in their own
    buffers: the same layout (one kept executor) over other memory, alternated in turn; each
    call computes on its own arrays' data."""
    rows, hidden, offset = 6, 16, 8
    cases = []
    for seed in range(3):
        gy, x = case(rows, hidden, seed=seed)
        cases.append((gy, x, want(gy, x)))
    made = []

    def keep(array):
        made.append(array)
        return array

    with acl_swiglu.Stream() as stream:
        try:
            views = []
            for gy, x, expected in cases:
                arrays = []
                for host in (gy, x):
                    buffer = keep(acl_swiglu.DeviceBuffer((host.size + offset) * 4))
                    buffer.copy_from_host(np.concatenate([np.full(offset, np.nan, np.float32), host.ravel()]))
                    arrays.append(keep(acl_swiglu.DeviceArray(buffer, host.shape, np.float32, offset=offset)))
                views.append((*arrays, expected))
            owners = [(keep(acl_swiglu.to_device(gy)), keep(acl_swiglu.to_device(x)), e) for gy, x, e in cases]
            wrapped = [(keep(acl_swiglu.DeviceArray.wrap(g.ptr, g.shape, g.dtype)),
                        keep(acl_swiglu.DeviceArray.wrap(x.ptr, x.shape, x.dtype)), e) for g, x, e in owners]
            outs = [keep(acl_swiglu.DeviceArray.empty((rows, 2 * hidden), np.float32)) for _ in range(2)]
            for round_ in range(3):
                for family in (views, owners, wrapped):
                    for index, (d_gy, d_x, expected) in enumerate(family):
                        out = outs[index % 2]
                        call(d_gy, d_x, out, stream)
                        assert same_bits(out.to_numpy(), expected), (round_, index)
        finally:
            stream.synchronize()
            for array in reversed(made):
                array.close()


def test_stride_zero_and_empty_device_arrays():
    rows, hidden = 5, 8
    rng = np.random.default_rng(4)
    row_gy = rng.standard_normal(hidden).astype(np.float32)
    row_x = rng.standard_normal(2 * hidden).astype(np.float32)
    expected = want(np.broadcast_to(row_gy, (rows, hidden)), np.broadcast_to(row_x, (rows, 2 * hidden)))
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(row_gy) as b_gy, acl_swiglu.to_device(row_x) as b_x:
        # Every row of the view is the one row in memory (stride 0 on the leading dim).
        d_gy = acl_swiglu.DeviceArray(b_gy.buffer, (rows, hidden), np.float32, strides=(0, 1))
        d_x = acl_swiglu.DeviceArray(b_x.buffer, (rows, 2 * hidden), np.float32, strides=(0, 1))
        with acl_swiglu.DeviceArray.empty((rows, 2 * hidden), np.float32) as out:
            for attempt in range(3):
                call(d_gy, d_x, out, stream)
                assert same_bits(out.to_numpy(), expected), attempt
        e_gy = acl_swiglu.to_device(np.empty((0, hidden), np.float32))
        e_x = acl_swiglu.to_device(np.empty((0, 2 * hidden), np.float32))
        e_out = acl_swiglu.DeviceArray.empty((0, 2 * hidden), np.float32)
        for _ in range(3):
            got, _ = call(e_gy, e_x, e_out, stream)
            assert got is e_out and got.to_numpy().shape == (0, 2 * hidden)
        e_gy.close()
        with pytest.raises(errors.HandleClosedError, match="grad_y"):
            call(e_gy, e_x, e_out, stream)
        e_x.close()
        e_out.close()


def test_calls_refuse_what_was_closed():
    gy, x = case(6, 24, seed=12)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        d_gy = acl_swiglu.to_device(gy)
        for _ in range(2):
            call(d_gy, d_x, out, stream)
        with acl_swiglu.DeviceArray.empty((3,), np.float32):
            pass   # an unrelated close: calls go on
        assert same_bits(call(d_gy, d_x, out, stream)[0].to_numpy(), want(gy, x))
        d_gy.close()
        with pytest.raises(errors.HandleClosedError, match="grad_y is a closed DeviceArray"):
            call(d_gy, d_x, out, stream)
        closed_out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
        closed_out.close()
        with acl_swiglu.to_device(gy) as fresh:
            with pytest.raises(errors.HandleClosedError, match="grad_x"):
                call(fresh, d_x, closed_out, stream)
            other = acl_swiglu.Stream()
            other.close()
            with pytest.raises(errors.HandleClosedError, match="stream"):
                call(fresh, d_x, out, other)
            assert same_bits(call(fresh, d_x, out, stream)[0].to_numpy(), want(gy, x))


@pytest.mark.parametrize("victim", ["grad_y", "x"])
def test_an_array_closed_while_a_call_binds_its_arrays_fails_the_call(victim):
    """The kept executor exists; another party closes an input while the call reads the
    addresses it binds (the output's address getter runs the close): the call raises
    HandleClosedError naming it, and the memory it launched on stayed allocated meanwhile."""
    gy, x = case(3, 36, seed=19)
    with acl_swiglu.Stream() as stream, acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out:
        arrays = {"grad_y": acl_swiglu.to_device(gy), "x": acl_swiglu.to_device(x)}
        call(arrays["grad_y"], arrays["x"], out, stream)
        rigged = Rigged.over(out)
        rigged.arm(arrays[victim].close)
        with pytest.raises(errors.HandleClosedError, match=victim):
            call(arrays["grad_y"], arrays["x"], rigged, stream)
        stream.synchronize()   # (would fail if the launch had run on freed memory)
        for array in arrays.values():
            array.close()


@pytest.mark.parametrize("victim", ["grad_y", "x"])
def test_an_array_closed_while_a_call_makes_its_executor_fails_the_call_clearly(victim):
    gy, x = case(3, 37, seed=20)   # (a layout with no kept executor)
    with acl_swiglu.Stream() as stream, acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out:
        arrays = {"grad_y": acl_swiglu.to_device(gy), "x": acl_swiglu.to_device(x)}
        rigged = Rigged.over(out)   # (its tensor is made last: the inputs' tensors exist when it runs)
        rigged.arm(arrays[victim].close)
        try:
            with pytest.raises(errors.HandleClosedError, match=victim):
                call(arrays["grad_y"], arrays["x"], rigged, stream)
        finally:
            for array in arrays.values():
                array.close()


def test_a_stream_closed_during_a_call_fails_it_and_harms_no_other_stream():
    """The call's stream is closed (and another stream made) while the call binds its arrays:
    the call raises HandleClosedError naming the stream; nothing it queued runs on freed memory
    (the other stream, and the arrays, stay healthy)."""
    gy, x = case(6, 24, seed=21)
    newcomer = []
    with acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out:
        stream = acl_swiglu.Stream()
        call(d_gy, d_x, out, stream)
        rigged = Rigged.over(out)
        rigged.arm(lambda: (stream.close(), newcomer.append(acl_swiglu.Stream())))
        try:
            with pytest.raises(errors.HandleClosedError, match="stream"):
                call(d_gy, d_x, rigged, stream)
            newcomer[0].synchronize()
            assert same_bits(call(d_gy, d_x, out, newcomer[0])[0].to_numpy(), want(gy, x))
        finally:
            for s in newcomer:
                s.close()
            stream.close()


@pytest.mark.parametrize("moment", ["binding", "making the executor"])
@pytest.mark.parametrize("exception", [KeyboardInterrupt, SystemExit])
def test_an_exception_in_the_middle_of_a_call_leaves_nothing_held(moment, exception):
    """The exception arrives while the call reads the output's address: when it binds a kept
    executor, or while it makes one (a layout's first call). Nothing stays held: the next call
    works, and closing the arrays frees them."""
    gy, x = case(4, 30 + (moment == "binding"), seed=22)
    before = idle_counts()
    with acl_swiglu.Stream() as stream:
        d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
        out = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
        if moment == "binding":
            call(d_gy, d_x, out, stream)
        rigged = Rigged.over(out)
        rigged.arm(raiser(exception("at a bad moment")))
        with pytest.raises(exception):
            call(d_gy, d_x, rigged, stream)
        assert same_bits(call(d_gy, d_x, out, stream)[0].to_numpy(), want(gy, x))
        live = emulator.live_counts()
        for array in (d_gy, d_x, out):
            array.close()
        assert live["allocation"] - emulator.live_counts()["allocation"] == 3
    assert idle_counts() == before


def test_calls_without_a_pooled_workspace_and_across_streams():
    """The streams' workspace pools emptied between calls, and an input written on another
    stream just before each call: every call gives the model's bits."""
    gy, x = case(6, 24, seed=13)
    first = want(gy, x, 2.0)
    second = want(gy, first, 2.0)
    with acl_swiglu.Stream() as writer, acl_swiglu.Stream() as reader, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.to_device(x) as d_x, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as middle, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        for _ in range(3):
            call(d_gy, d_x, middle, writer, 2.0)
            writer.release_workspace()
            reader.release_workspace()
            call(d_gy, middle, out, reader, 2.0)   # reads what the writer's queued call writes
            assert same_bits(out.to_numpy(), second)
            acl_swiglu.default_stream().release_workspace()
            call(d_gy, d_x, middle, None, 2.0)
            assert same_bits(middle.to_numpy(), first)


def test_repeated_calls_from_several_threads(weighted_setup):
    run, check, (_, _, _, _, stream) = weighted_setup
    run()
    barrier = threading.Barrier(4)

    def worker():
        barrier.wait(JOIN_TIMEOUT)
        for _ in range(50):
            run()

    failures = run_threads([worker] * 4)
    assert not failures, failures
    stream.synchronize()
    check()


# ---- scalars and revisions ----


@pytest.mark.parametrize("clamp", [0.3, 1.0 + 2 ** -52, 7.5, 2.0 ** -126, 3.4e38])
def test_clamp_values_reach_phase_1_exactly(clamp):
    gy, x = case(5, 12, seed=32)
    expected = want(gy, x, clamp)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as gx:
        for _ in range(3):
            call(d_gy, d_x, gx, stream, clamp)
            assert same_bits(gx.to_numpy(), expected), clamp


def test_clamp_by_type_and_value():
    gy, x = case(6, 16, seed=9)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        check_clamp_types(lambda clamp: call(d_gy, d_x, out, stream, clamp)[0].to_numpy(), gy, x)


def test_equal_scalars_of_other_objects_and_1_for_1_0():
    gy, x = case(4, 20, seed=13)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.DeviceArray.empty(x.shape, np.float32) as out:
        clamp = float("1.5")
        other = float("1.") + 0.5
        assert other == clamp and other is not clamp
        for value in (clamp, clamp, other, clamp, other):
            assert same_bits(call(d_gy, d_x, out, stream, value)[0].to_numpy(), want(gy, x)), value
        want_one = want(gy, x, 1.0)
        for value in (1.0, 1.0, 1, 1, 1.0, np.float32(1), 1):
            assert same_bits(call(d_gy, d_x, out, stream, value)[0].to_numpy(), want_one), repr(value)


def test_abi_revision_switched_between_calls(monkeypatch):
    """ACL_SWIGLU_ABI changed between calls: each call is validated and marshalled for the
    revision in force (revision 1: clamp 0.0 is off and group_index host ints; revision 2: clamp
    -1.0 is off, group_index an int64 DeviceArray), one-shot and device-level alike."""
    gy, x = case(6, 16, seed=13)
    rng = np.random.default_rng(13)
    weight = (rng.random((6, 1)) + 0.5).astype(np.float32)
    y_origin = rng.standard_normal((6, 16)).astype(np.float32)
    groups = np.array([2, 3], np.int64)
    off = want(gy, x, None)
    grouped = model(gy, x, weight, y_origin, groups, 1.5)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(weight) as d_w, acl_swiglu.to_device(y_origin) as d_y, \
            acl_swiglu.to_device(groups) as d_groups, acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out, \
            acl_swiglu.DeviceArray.empty(weight.shape, np.float32) as out_w:
        for revision in (2, 1, 2, 1, 1, 2):
            monkeypatch.setenv("ACL_SWIGLU_ABI", str(revision))
            assert acl_swiglu.abi_revision() == revision
            assert same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x)[0], off), revision
            call(d_gy, d_x, out, stream, None)
            assert same_bits(out.to_numpy(), off), revision
            group_index = groups if revision == 1 else d_groups
            got_x, got_w = acl_swiglu.swiglu_group_quant_grad_device(
                d_gy, d_x, d_w, d_y, group_index, 1.5, grad_x=out, grad_weight=out_w, stream=stream)
            assert same_bits(got_x.to_numpy(), grouped[0]) and same_bits(got_w.to_numpy(), grouped[1]), revision
            one_x, one_w = acl_swiglu.swiglu_group_quant_grad(gy, x, weight, y_origin, groups, 1.5)
            assert same_bits(one_x, grouped[0]) and same_bits(one_w, grouped[1]), revision
            wrong = d_groups if revision == 1 else [2, 3]   # the other revision's form of group_index
            with pytest.raises((TypeError, errors.ArgumentError), match="group_index"):
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_y, wrong, 1.5, grad_x=out,
                                                          grad_weight=out_w, stream=stream)


# ---- the kept executors ----


def _layouts(count, hidden=4):
    out = []
    for rows in range(1, count + 1):
        gy, x = case(rows, hidden, seed=rows)
        out.append((gy, x, want(gy, x)))
    return out


def test_more_layouts_than_the_caches_hold():
    """More layouts in turn than the validation, arena and executor caches hold: every call,
    one-shot and device-level, still validates what it must and gives the model's bits."""
    cases = _layouts(264)
    with acl_swiglu.Stream() as stream:
        devices = [(acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.DeviceArray.empty(x.shape, x.dtype))
                   for gy, x, _ in cases]
        try:
            for round_ in range(2):
                for (gy, x, expected), (d_gy, d_x, out) in zip(cases, devices):
                    assert same_bits(acl_swiglu.swiglu_group_quant_grad(gy, x, clamp_limit=CLAMP)[0], expected)
                    call(d_gy, d_x, out, stream)
                for (_, _, expected), (_, _, out) in zip(cases, devices):
                    assert same_bits(out.to_numpy(), expected), round_
            # A layout seen long ago, and now wrong: refused (validated again).
            gy, x, _ = cases[0]
            with pytest.raises(errors.ArgumentError, match="x"):
                acl_swiglu.swiglu_group_quant_grad(gy, x[:, :-2], clamp_limit=CLAMP)
            d_gy, _, out = devices[0]
            with pytest.raises(errors.ArgumentError, match="x"):
                call(d_gy, devices[1][1], out, stream)
        finally:
            for arrays in devices:
                for array in arrays:
                    array.close()


def test_an_executor_evicted_or_released_with_work_queued_lives_until_the_work_is_done():
    """Calls of one layout queued on a stream (not waited for), then calls of a score of other
    layouts on another stream (its kept executor is evicted), or release_cached() (every kept
    executor and pooled workspace released): the queued work still computes the right bits, the
    evicted layout's next call works, and what was evicted is freed."""
    cases = _layouts(20, hidden=8)
    with acl_swiglu.Stream() as queued, acl_swiglu.Stream() as other:
        devices = [(acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.DeviceArray.empty(x.shape, x.dtype))
                   for gy, x, _ in cases]
        try:
            for disturb in ("evict", "release_cached", "both"):
                d_gy, d_x, out = devices[0]
                call(d_gy, d_x, out, queued)
                call(d_gy, d_x, out, queued)
                if disturb in ("evict", "both"):
                    for d_gy2, d_x2, out2 in devices[1:]:
                        call(d_gy2, d_x2, out2, other)
                    assert emulator.live_counts()["executor"] <= 16, "evicted executors were not freed"
                if disturb in ("release_cached", "both"):
                    acl_swiglu.release_cached()
                assert same_bits(out.to_numpy(), cases[0][2]), disturb
                for (_, _, expected), (_, _, out2) in zip(cases[1:], devices[1:]):
                    if disturb != "release_cached":
                        assert same_bits(out2.to_numpy(), expected), disturb
                call(d_gy, d_x, out, queued)   # the evicted layout again
                assert same_bits(out.to_numpy(), cases[0][2]), disturb
        finally:
            for arrays in devices:
                for array in arrays:
                    array.close()
    acl_swiglu.release_cached()
    assert emulator.live_counts()["executor"] == 0


@pytest.mark.emulator_only
def test_failed_calls_are_reported_and_leave_the_kept_executors_usable():
    gy, x = case(7, 20, seed=14)
    gy2, x2 = case(7, 20, seed=15)
    gy3, x3 = case(7, 20, seed=17)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(x) as d_x, \
            acl_swiglu.to_device(gy2) as d_gy2, acl_swiglu.to_device(x2) as d_x2, \
            acl_swiglu.to_device(gy3) as d_gy3, acl_swiglu.to_device(x3) as d_x3, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as out:
        expected, expected2, expected3 = want(gy, x), want(gy2, x2), want(gy3, x3)
        # A new layout's phase 1 fails: nothing is kept, the next call makes it.
        before = emulator.live_counts()["executor"]
        with emulator.inject_faults(f"{PHASE1}:1:161002"):
            with pytest.raises(errors.AclError) as info:
                call(d_gy, d_x, out, stream)
        assert info.value.api == PHASE1 and "injected fault" in info.value.message
        assert emulator.live_counts()["executor"] == before
        assert same_bits(call(d_gy, d_x, out, stream)[0].to_numpy(), expected)
        assert same_bits(call(d_gy2, d_x2, out, stream)[0].to_numpy(), expected2)   # (the layout's second)
        for _ in range(6):   # (and more: as many as the layout keeps)
            with acl_swiglu.to_device(gy) as filler:
                call(filler, d_x, out, stream)
        kept = emulator.live_counts()["executor"]
        for fault, api, arrays, fix in (
                (f"{PHASE2}:1:507015", PHASE2, (d_gy, d_x), None),
                # A third argument set: the least recently used executor is bound to it.
                ("aclSetInputTensorAddr:2:161002", "aclSetInputTensorAddr", (d_gy3, d_x3), None),
                ("aclrtMalloc:1:207001", "aclrtMalloc", (d_gy2, d_x2), stream.release_workspace),
                ("aclrtSynchronizeStream:1:507035", "aclrtSynchronizeStream", (d_gy, d_x), None)):
            if fix is not None:
                fix()
            with emulator.inject_faults(fault):
                with pytest.raises(errors.AclError) as info:
                    call(*arrays, out, stream)
                    out.to_numpy()
            assert info.value.api == api and info.value.message.count("injected fault") == 1, (fault, info.value)
            assert emulator.live_counts()["executor"] == kept, fault
            for pair, bits in (((d_gy2, d_x2), expected2), ((d_gy, d_x), expected)):
                assert same_bits(call(*pair, out, stream)[0].to_numpy(), bits), fault
        assert same_bits(call(d_gy3, d_x3, out, stream)[0].to_numpy(), expected3)


# ---- garbage collection ----


def test_arrays_dropped_without_close_between_calls():
    """Outputs and inputs left to the garbage collector between calls (some in reference
    cycles): every call gives the model's bits and everything dropped is freed."""
    gy, x = case(7, 20, seed=16)
    expected = want(gy, x)
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as keep_gy, acl_swiglu.to_device(x) as keep_x:
        with acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as warm:
            others = [acl_swiglu.to_device(gy) for _ in range(7)]
            for d_gy in [keep_gy, *others]:
                call(d_gy, keep_x, warm, stream)   # (the layout's kept executors: as many as it keeps)
            stream.synchronize()
            for d_gy in others:
                d_gy.close()
        gc.collect()
        before = emulator.live_counts()
        for round_ in range(30):
            d_gy = acl_swiglu.to_device(gy) if round_ % 3 == 0 else keep_gy
            out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
            for _ in range(2):
                call(d_gy, keep_x, out, stream)
            if round_ % 2:
                out.cycle = out   # collectable only by the cycle collector
            else:
                assert same_bits(out.to_numpy(), expected), round_
            del out, d_gy
            if round_ % 5 == 4:
                gc.collect()
        gc.collect()
        stream.synchronize()
        assert emulator.live_counts() == before


def test_gc_callbacks_that_call_and_close_during_calls():
    """A gc callback (run by any allocation, also inside a call) makes its own device call (of
    another layout: one of the same layout is test_reentrancy.py's) and closes arrays a call may
    be using: no deadlock, and every call gives the model's bits or raises HandleClosedError for
    an array that was closed."""
    gy, x = case(7, 20, seed=17)
    expected = want(gy, x)
    side_host = case(3, 20, seed=18)
    side_expected = want(*side_host)
    stream = acl_swiglu.Stream()
    d_x = acl_swiglu.to_device(x)
    side_gy, side_x = acl_swiglu.to_device(side_host[0]), acl_swiglu.to_device(side_host[1])
    side_out = acl_swiglu.DeviceArray.empty(side_host[1].shape, np.float32)
    victims = []
    events = collections.Counter()
    inside = [False]
    allowance = [0]   # closes the callback may make in this round

    def callback(phase, info):
        if phase != "start" or inside[0]:
            return
        inside[0] = True
        try:
            events["collections"] += 1
            call(side_gy, side_x, side_out, stream)   # a call made from inside another one
            if victims and allowance[0]:
                allowance[0] -= 1
                victims[-1 - events["closed"] % 2].close()   # the call's output or its grad_y
                events["closed"] += 1
        finally:
            inside[0] = False

    outcomes = collections.Counter()
    thresholds = gc.get_threshold()
    try:
        call(side_gy, side_x, side_out, stream)
        gc.callbacks.append(callback)
        gc.set_threshold(1, 1, 1)   # a collection at nearly every allocation
        for round_ in range(40):
            d_gy = acl_swiglu.to_device(gy)
            out = acl_swiglu.DeviceArray.empty(x.shape, x.dtype)
            victims.extend([d_gy, out])
            allowance[0] = round_ % 2   # odd rounds: one close, from inside whichever call collects
            for _ in range(3):
                try:
                    call(d_gy, d_x, out, stream)
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
                    assert same_bits(got, expected), round_
                    outcomes["ok"] += 1
    finally:
        gc.set_threshold(*thresholds)
        if callback in gc.callbacks:
            gc.callbacks.remove(callback)
        stream.synchronize()
        got = side_out.to_numpy()
        for array in victims + [d_x, side_gy, side_x, side_out]:
            array.close()
        stream.close()
    assert same_bits(got, side_expected)
    assert events["collections"] > 40 and events["closed"] >= 10 and outcomes["ok"] >= 20, (events, outcomes)
