"""How device-level calls keep and reuse their executors, attacked as a hostile user would.

A device-level call with the very same argument objects (arrays by identity, other values equal
and of the same type), stream, device and ABI revision as the last checked launch of a kept
executor, with nothing closed and no access record changed since, launches at once; any other call
is validated and bound again. Kept executors hold their arrays by weak reference only and hold off
no close(); the checks on values run on every call. So: arrays closed, dropped, replaced by new
objects at the same id(), rewritten in place, written on other streams; scalars, revisions and
devices changed between calls; many threads; subclasses: every call must compute exactly what a
fresh call would (bit for bit against tests/device_model.py) or refuse as a fresh call would, and
nothing may leak.
"""

from __future__ import annotations

import gc
import numbers
import threading
import weakref

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator, errors

from swiglu_cases import (CLAMP, JOIN_TIMEOUT, case, idle_counts, model, run_child, run_threads, same_bits, want,
                          weighted_case)

pytestmark = pytest.mark.emulator_only   # (live counts and a second emulated device)

ROWS, HIDDEN = 6, 16


def call(d_gy, d_x, out=None, stream=None, clamp=CLAMP, **kw):
    return acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=clamp, grad_x=out, stream=stream, **kw)


class Arrays:
    """Device arrays made by a test, all closed at its end (newest first)."""

    def __init__(self):
        self.made = []

    def __call__(self, array):
        self.made.append(array)
        return array

    def host(self, host):
        return self(acl_swiglu.to_device(host))

    def empty(self, shape, dtype=np.float32):
        return self(acl_swiglu.DeviceArray.empty(shape, dtype))

    def close(self):
        for array in reversed(self.made):
            array.close()
        self.made.clear()


@pytest.fixture
def arrays():
    made = Arrays()
    try:
        yield made
    finally:
        acl_swiglu.synchronize_device()
        made.close()


@pytest.fixture
def stream():
    with acl_swiglu.Stream() as own:
        yield own


def outcome(run):
    """('bits', result bytes) or ('refused', exception type): what a call gave."""
    try:
        return ("bits", run().tobytes())
    except (TypeError, errors.AclSwigluError) as error:
        return ("refused", type(error).__name__)


# ---- closes and drops between repeats ----


@pytest.mark.parametrize("victim", ["grad_y", "x", "grad_x"])
def test_a_repeat_after_one_of_its_arrays_was_closed_is_refused_naming_it(arrays, stream, victim):
    gy, x = case(ROWS, HIDDEN, seed=1)
    given = {"grad_y": arrays.host(gy), "x": arrays.host(x), "grad_x": arrays.empty(x.shape)}
    for _ in range(3):   # (the second and third are repeats)
        call(given["grad_y"], given["x"], given["grad_x"], stream)
    assert same_bits(given["grad_x"].to_numpy(), want(gy, x))
    call(given["grad_y"], given["x"], given["grad_x"], stream)   # queued, not waited for
    before = emulator.live_counts()["allocation"]
    given[victim].close()
    assert emulator.live_counts()["allocation"] == before - 1, "the kept executor held off the free"
    for _ in range(2):
        with pytest.raises(errors.HandleClosedError, match=victim):
            call(given["grad_y"], given["x"], given["grad_x"], stream)
    stream.synchronize()   # nothing was launched on the freed memory (a kernel there fails here)
    if victim != "grad_x":
        assert same_bits(given["grad_x"].to_numpy(), want(gy, x))


def test_a_repeat_refused_for_a_closed_array_leaves_the_other_argument_sets_repeating(arrays, stream):
    sets = []
    for seed in range(2):
        gy, x = case(ROWS, HIDDEN, seed=10 + seed)
        sets.append((arrays.host(gy), arrays.host(x), arrays.empty(x.shape), want(gy, x)))
    for _ in range(3):
        for d_gy, d_x, out, expected in sets:
            call(d_gy, d_x, out, stream)
            assert same_bits(out.to_numpy(), expected)
    sets[0][1].close()
    with pytest.raises(errors.HandleClosedError, match="x"):
        call(*sets[0][:3], stream)
    for _ in range(3):
        d_gy, d_x, out, expected = sets[1]
        call(d_gy, d_x, out, stream)
        assert same_bits(out.to_numpy(), expected)
    with pytest.raises(errors.HandleClosedError, match="x"):
        call(*sets[0][:3], stream)


def test_closing_an_array_right_after_a_call_frees_it_once_the_stream_passed_the_work(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=2)
    d_x, out = arrays.host(x), arrays.empty(x.shape)
    call(arrays.host(gy), d_x, out, stream)   # (the stream's pooled workspace, kept)
    stream.synchronize()
    base = emulator.live_counts()["allocation"]
    for round_ in range(4):
        d_gy = acl_swiglu.to_device(gy)
        assert emulator.live_counts()["allocation"] == base + 1
        call(d_gy, d_x, out, stream)
        call(d_gy, d_x, out, stream)   # a repeat, queued
        d_gy.close()   # the work still queued reads it: the free waits for the stream, not for another call
        assert emulator.live_counts()["allocation"] == base, round_
        assert same_bits(out.to_numpy(), want(gy, x)), round_


def test_kept_executors_keep_no_array_alive_and_a_dropped_one_is_freed(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=3)
    d_x = arrays.host(x)
    call(arrays.host(gy), d_x, arrays.empty(x.shape), stream)   # (the stream's pooled workspace, kept)
    stream.synchronize()
    base = emulator.live_counts()["allocation"]
    for round_ in range(4):
        d_gy, out = acl_swiglu.to_device(gy), acl_swiglu.DeviceArray.empty(x.shape, np.float32)
        for _ in range(3):
            call(d_gy, d_x, out, stream)
        assert same_bits(out.to_numpy(), want(gy, x))
        refs = weakref.ref(d_gy), weakref.ref(out)
        del d_gy, out   # no close()
        gc.collect()
        assert all(ref() is None for ref in refs), "a kept executor keeps an array alive"
        other = acl_swiglu.to_device(gy)   # (a call that can frees what was collected)
        call(other, d_x, None, stream)[0].close()
        other.close()
        stream.synchronize()
        assert emulator.live_counts()["allocation"] == base, round_


def _same_id(target_id, make, limit=2000):
    """Makes objects until one has the id `target_id` (CPython reuses a freed object's memory);
    returns it, or the last one made when none did within the limit."""
    held = []
    for _ in range(limit):
        candidate = make()
        if id(candidate) == target_id:
            return candidate, True
        held.append(candidate)
    return held.pop(), False


@pytest.mark.parametrize("memory", ["kept", "freed"])
def test_a_new_array_at_a_dropped_arrays_id_is_read_for_its_own_data(arrays, stream, memory):
    """An input dropped without close() and collected, and a new array that gets its id() over
    other memory holding other data: the next call reads the new array. With "kept", the dropped
    array was a view of a buffer the test keeps, so nothing was freed or closed: only the
    identity of the argument tells the calls apart."""
    gy, x = case(ROWS, HIDDEN, seed=4)
    gy2, _ = case(ROWS, HIDDEN, seed=5)
    d_x, out = arrays.host(x), arrays.empty(x.shape)
    old_buffer = arrays(acl_swiglu.DeviceBuffer(gy.nbytes))
    old_buffer.copy_from_host(gy)
    new_buffer = arrays(acl_swiglu.DeviceBuffer(gy2.nbytes))
    new_buffer.copy_from_host(gy2)
    matched = 0
    for round_ in range(16):   # (until the attack happened twice)
        if matched >= 2:
            break
        if memory == "kept":
            d_gy = acl_swiglu.DeviceArray(old_buffer, gy.shape, np.float32)
        else:
            d_gy = acl_swiglu.to_device(gy)
        for _ in range(3):
            call(d_gy, d_x, out, stream)
        assert same_bits(out.to_numpy(), want(gy, x))
        old_id, box = id(d_gy), [d_gy]
        del d_gy
        box.clear()   # (the last reference: the new array is made right after)
        d_gy, same = _same_id(old_id, lambda: acl_swiglu.DeviceArray(new_buffer, gy2.shape, np.float32))
        matched += same
        for _ in range(2):
            call(d_gy, d_x, out, stream)
            assert same_bits(out.to_numpy(), want(gy2, x)), (round_, same)
        del d_gy
    assert matched, "no new array got a dropped array's id (the attack did not happen)"


def test_an_input_rewritten_with_copy_from_between_repeats_gives_the_new_result(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=6)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    previous = x
    for seed in range(20, 26):
        new_gy, new_x = case(ROWS, HIDDEN, seed=seed)
        call(d_gy, d_x, out, stream)   # a repeat from the second round on, queued
        d_x.copy_from(new_x)   # waits for the queued read of the old data first
        assert same_bits(out.to_numpy(), want(gy, previous)), seed
        call(d_gy, d_x, out, stream)
        assert same_bits(out.to_numpy(), want(gy, new_x)), seed
        d_gy.copy_from(new_gy)
        call(d_gy, d_x, out, stream)
        assert same_bits(out.to_numpy(), want(new_gy, new_x)), seed
        gy, previous = new_gy, new_x


# ---- ordering between streams ----


def test_an_input_written_on_another_stream_between_repeats_is_waited_for(arrays, stream):
    """x of a repeated call on one stream is written (as grad_x) by a call on another stream,
    nothing waited for by the test: the next call on the first stream reads what was written,
    and the write waited for the reads queued before it."""
    gy, x = case(ROWS, HIDDEN, seed=7)
    gy2, x2 = case(ROWS, HIDDEN, seed=8)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    d_gy2, d_x2 = arrays.host(gy2), arrays.host(x2)
    first, written = want(gy, x), want(gy2, x2)
    with acl_swiglu.Stream() as other:
        for round_ in range(3):
            d_x.copy_from(x)
            call(d_gy, d_x, out, stream)
            call(d_gy, d_x, out, stream)   # (a repeat from the second round on), queued
            mid = arrays.empty(x.shape)
            call(d_gy, d_x, mid, stream)   # another read of d_x queued on the first stream
            call(d_gy2, d_x2, d_x, other)   # writes d_x on the other stream
            call(d_gy2, d_x2, d_x, other)
            assert same_bits(mid.to_numpy(), first), round_   # read before the write
            call(d_gy, d_x, out, stream)
            call(d_gy, d_x, out, stream)
            assert same_bits(out.to_numpy(), want(gy, written)), round_
            assert same_bits(d_x.to_numpy(), written), round_


def test_an_output_read_on_another_stream_is_not_overwritten_before_the_read(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=9)
    _, x_next = case(ROWS, HIDDEN, seed=90)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    with acl_swiglu.Stream() as other:
        for round_ in range(3):
            d_x.copy_from(x)
            call(d_gy, d_x, out, stream)
            call(d_gy, d_x, out, stream)   # queued
            reader_out = arrays.empty(x.shape)
            call(d_gy, out, reader_out, other)   # reads out on the other stream (after its writer)
            d_x.copy_from(x_next)
            call(d_gy, d_x, out, stream)   # overwrites out: after the other stream's read
            assert same_bits(out.to_numpy(), want(gy, x_next)), round_
            assert same_bits(reader_out.to_numpy(), want(gy, want(gy, x))), round_


def test_repeats_on_two_streams_alternately(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=11)
    d_gy, d_x = arrays.host(gy), arrays.host(x)
    shared, own = arrays.empty(x.shape), [arrays.empty(x.shape) for _ in range(2)]
    with acl_swiglu.Stream() as other:
        streams = (stream, other)
        current = x
        for round_ in range(8):
            for index, s in enumerate(streams):
                call(d_gy, d_x, shared, s)   # one output written on both streams in turn
                call(d_gy, d_x, own[index], s)
                call(d_gy, d_x, own[index], s)
            if round_ % 3 == 2:
                _, current = case(ROWS, HIDDEN, seed=100 + round_)
                d_x.copy_from(current)
                for index, s in enumerate(streams):
                    call(d_gy, d_x, own[index], s)
                    call(d_gy, d_x, shared, s)
            expected = want(gy, current)
            for array in (shared, *own):
                assert same_bits(array.to_numpy(), expected), round_


# ---- threads ----


def test_the_same_arrays_from_many_threads_at_once_leave_nothing_behind():
    base = idle_counts()
    gy, x, weight, y_origin = weighted_case(ROWS, HIDDEN, seed=12)
    want_x, want_w = model(gy, x, weight, y_origin, clamp=CLAMP)
    shared_stream = acl_swiglu.Stream()
    inputs = [acl_swiglu.to_device(a) for a in (gy, x, weight, y_origin)]
    shared_out = acl_swiglu.DeviceArray.empty(x.shape, np.float32), acl_swiglu.DeviceArray.empty(weight.shape,
                                                                                                  np.float32)
    barrier = threading.Barrier(6)
    wrong = []

    def own_stream_worker():
        with acl_swiglu.Stream() as s, acl_swiglu.DeviceArray.empty(x.shape, np.float32) as gx, \
                acl_swiglu.DeviceArray.empty(weight.shape, np.float32) as gw:
            barrier.wait(JOIN_TIMEOUT)
            for i in range(30):
                if i % 5 == 4:   # outputs made by the call
                    made = acl_swiglu.swiglu_group_quant_grad_device(*inputs, clamp_limit=CLAMP, stream=s)
                    try:
                        if not (same_bits(made[0].to_numpy(), want_x) and same_bits(made[1].to_numpy(), want_w)):
                            wrong.append(("made", i))
                    finally:
                        for array in made:
                            array.close()
                    continue
                acl_swiglu.swiglu_group_quant_grad_device(*inputs, clamp_limit=CLAMP, grad_x=gx, grad_weight=gw,
                                                          stream=s)
                if i % 3 == 0 and not (same_bits(gx.to_numpy(), want_x) and same_bits(gw.to_numpy(), want_w)):
                    wrong.append(("own", i))

    def shared_worker():
        barrier.wait(JOIN_TIMEOUT)
        for _ in range(30):
            acl_swiglu.swiglu_group_quant_grad_device(*inputs, clamp_limit=CLAMP, grad_x=shared_out[0],
                                                      grad_weight=shared_out[1], stream=shared_stream)

    try:
        failures = run_threads([own_stream_worker] * 4 + [shared_worker] * 2)
        assert not failures, failures
        assert not wrong, wrong
        shared_stream.synchronize()
        assert same_bits(shared_out[0].to_numpy(), want_x) and same_bits(shared_out[1].to_numpy(), want_w)
        acl_swiglu.synchronize_device()
        assert emulator.live_counts()["executor"] <= 16   # (the pool's bound per operator)
    finally:
        shared_stream.synchronize()
        for array in (*inputs, *shared_out):
            array.close()
        shared_stream.close()
    gc.collect()
    assert idle_counts() == base


# ---- caches released, pool bounds ----


def test_release_cached_between_repeats(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=13)
    _, x2 = case(ROWS, HIDDEN, seed=14)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    for round_ in range(4):
        call(d_gy, d_x, out, stream)
        call(d_gy, d_x, out, stream)   # queued with the kept executor
        acl_swiglu.release_cached()
        assert same_bits(out.to_numpy(), want(gy, x)), round_
        call(d_gy, d_x, out, stream)
        call(d_gy, d_x, out, None)   # the default stream's pooled workspace was released too
        assert same_bits(out.to_numpy(), want(gy, x)), round_
        acl_swiglu.release_cached()
        assert emulator.live_counts()["executor"] == 0
        d_x.copy_from(x2)
        call(d_gy, d_x, out, stream)
        assert same_bits(out.to_numpy(), want(gy, x2)), round_
        d_x.copy_from(x)


def test_idle_executors_are_bounded_per_layout_and_per_operator(arrays, stream):
    """Up to eight idle executors per layout, sixteen per operator (live executors counted once the
    queued work is done)."""
    base = emulator.live_counts()["executor"]
    sets = []
    for seed in range(11):
        gy, x = case(ROWS, HIDDEN, seed=30 + seed)
        sets.append((arrays.host(gy), arrays.host(x), arrays.empty(x.shape), want(gy, x)))
    for round_ in range(3):
        for d_gy, d_x, out, expected in sets:
            call(d_gy, d_x, out, stream)
            assert same_bits(out.to_numpy(), expected), round_
        stream.synchronize()
        assert emulator.live_counts()["executor"] - base <= 8
    layouts = []
    for rows in range(1, 21):
        gy, x = case(rows, 8, seed=rows)
        layouts.append((arrays.host(gy), arrays.host(x), arrays.empty(x.shape), want(gy, x)))
    for round_ in range(2):
        for d_gy, d_x, out, expected in layouts:
            call(d_gy, d_x, out, stream)
        stream.synchronize()
        assert emulator.live_counts()["executor"] - base <= 16
        for d_gy, d_x, out, expected in layouts:
            assert same_bits(out.to_numpy(), expected), round_


def test_eight_argument_sets_of_one_layout_taking_turns_are_each_a_repeat(arrays, stream):
    """A model's layers, each with its own buffers, say: once each set has run, every call launches its own kept
    executor as it stands (no phase 1, no address set), and computes its own set's bits."""
    sets = []
    for seed in range(8):
        gy, x = case(ROWS, HIDDEN, seed=60 + seed)
        sets.append((arrays.host(gy), arrays.host(x), arrays.empty(x.shape), want(gy, x)))
    for d_gy, d_x, out, _ in sets * 2:
        call(d_gy, d_x, out, stream)
    stream.synchronize()
    faults = [(name, 1, 161002) for name in ("aclnnSwigluGroupQuantGradGetWorkspaceSize", "aclSetInputTensorAddr",
                                             "aclSetOutputTensorAddr")]
    for round_ in range(3):
        for d_gy, d_x, out, _ in sets:
            out.copy_from(np.full(out.shape, np.nan, np.float32))
        with emulator.inject_faults(faults):
            for d_gy, d_x, out, _ in sets:
                call(d_gy, d_x, out, stream)
        assert emulator.inject_faults.last_injected == 0, round_
        for _, _, out, expected in sets:
            assert same_bits(out.to_numpy(), expected), round_
    # A ninth set makes one of them bind again: then the faults fire, and the call refuses.
    gy, x = case(ROWS, HIDDEN, seed=70)
    with emulator.inject_faults(faults), pytest.raises(errors.AclError):
        call(arrays.host(gy), arrays.host(x), arrays.empty(x.shape), stream)


def test_three_or_more_argument_sets_alternating_all_give_their_bits(arrays, stream):
    sets = []
    for seed in range(5):
        gy, x = case(ROWS, HIDDEN, seed=40 + seed)
        sets.append((arrays.host(gy), arrays.host(x), want(gy, x)))
    outs = [arrays.empty(sets[0][2].shape) for _ in range(3)]
    for count in (3, 4, 5):
        for round_ in range(4):
            for index, (d_gy, d_x, expected) in enumerate(sets[:count]):
                out = outs[index % len(outs)]
                call(d_gy, d_x, out, stream)
                assert same_bits(out.to_numpy(), expected), (count, round_, index)
            # The same, queued without waiting between calls: each output read at the end.
            for index, (d_gy, d_x, _) in enumerate(sets[:count]):
                call(d_gy, d_x, outs[index % len(outs)], stream)
            for index in range(min(count, len(outs))):
                last = max(i for i in range(count) if i % len(outs) == index)
                assert same_bits(outs[index].to_numpy(), sets[last][2]), (count, round_, index)


def test_outputs_not_given_are_new_every_call_and_never_alias(arrays, stream):
    gy, x, weight, y_origin = weighted_case(ROWS, HIDDEN, seed=15)
    d_gy, d_x, d_w, d_yo = (arrays.host(a) for a in (gy, x, weight, y_origin))
    made, expected = [], []
    for seed in range(6):
        _, new_x = case(ROWS, HIDDEN, seed=50 + seed)
        d_x.copy_from(new_x)
        for _ in range(2):
            gx, gw = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, clamp_limit=CLAMP,
                                                                stream=stream)
            made.extend([arrays(gx), arrays(gw)])
            expected.extend(model(gy, new_x, weight, y_origin, clamp=CLAMP))
    assert len({id(a) for a in made}) == len(made)
    assert len({a.ptr for a in made}) == len(made), "two calls' outputs share memory"
    for index, (array, bits) in enumerate(zip(made, expected)):
        assert same_bits(array.to_numpy(), bits), index


# ---- subclasses ----


class Tagged(acl_swiglu.DeviceArray):
    """A DeviceArray subclass that compares equal to every other Tagged (identity is what counts)."""

    def __eq__(self, other):
        return isinstance(other, Tagged)

    __hash__ = object.__hash__


def _tagged(array):
    return Tagged(array.buffer, array.shape, array.dtype, array.strides, array.offset)


def test_device_array_subclasses_that_compare_equal_are_told_apart(arrays, stream):
    sets = []
    for seed in range(3):
        gy, x = case(ROWS, HIDDEN, seed=60 + seed)
        sets.append((_tagged(arrays.host(gy)), _tagged(arrays.host(x)), want(gy, x)))
    out = _tagged(arrays.empty(sets[0][2].shape))
    for round_ in range(4):
        for index, (d_gy, d_x, expected) in enumerate(sets):
            for _ in range(2):
                got, _ = call(d_gy, d_x, out, stream)
                assert got is out and same_bits(out.to_numpy(), expected), (round_, index)
    d_gy, d_x, expected = sets[0]
    d_x.close()
    with pytest.raises(errors.HandleClosedError, match="x"):
        call(d_gy, d_x, out, stream)


def test_device_array_subclasses_with_another_clamp_compute_with_their_own_clamp(arrays, stream):
    """Subclass arrays (whose layout no cache keys) of one layout, called with a clamp other than
    the one their kept executors were made with: each call computes with its own clamp, as the
    same call on plain DeviceArrays does."""
    sets = []
    for seed in range(3):
        gy, x = case(ROWS, HIDDEN, seed=70 + seed)
        sets.append((gy, x, arrays.host(gy), arrays.host(x)))
    out = arrays.empty(sets[0][1].shape)
    for kind in ("plain", "subclass"):
        for index, clamp in ((0, 1.5), (1, 1.5), (2, 2.0), (0, None), (1, 2.0), (2, 1.5), (0, 1.5)):
            gy, x, d_gy, d_x = sets[index]
            if kind == "subclass":
                d_gy, d_x = _tagged(d_gy), _tagged(d_x)
            call(d_gy, d_x, out, stream, clamp)
            assert same_bits(out.to_numpy(), want(gy, x, clamp)), (kind, index, clamp)


# ---- scalars ----


def test_clamp_changed_between_repeats_behaves_as_a_fresh_call(arrays, stream):
    gy, x = case(ROWS, HIDDEN, seed=16)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    for clamp, refused in ((1.0, None), (1.0, None), (True, TypeError), (1.0, None), (1, None), (1, None),
                           (True, TypeError), (1, None), (2.0, None), (2.0, None), (np.float64(2.0), None),
                           (2, None), (-1.0, errors.ArgumentError), (2.0, None), (0.0, errors.ArgumentError),
                           (2.0, None), (-0.0, errors.ArgumentError), (float("nan"), errors.ArgumentError),
                           (None, None), (None, None), (1.0, None), (np.bool_(True), TypeError), (1.0, None)):
        if refused is not None:
            with pytest.raises(refused):
                call(d_gy, d_x, out, stream, clamp)
            continue
        got, _ = call(d_gy, d_x, out, stream, clamp)
        assert same_bits(got.to_numpy(), want(gy, x, None if clamp is None else float(clamp))), repr(clamp)


class Knob:
    """A real number whose value can change (a scheduled hyper-parameter, say)."""

    def __init__(self, value):
        self.value = value

    def __float__(self):
        return float(self.value)


numbers.Real.register(Knob)


def _clamp_outcome(gy, x, value):
    """What a fresh call with this clamp value gives: its bits, or the refusal of a value <= 0."""
    return ("refused", "ArgumentError") if value <= 0 else ("bits", want(gy, x, value).tobytes())


def test_a_scalar_object_changed_in_place_between_calls_gives_its_new_value(arrays, stream):
    """The same clamp object, its value changed between calls (as a host list of group_index
    may be): each call computes with, or refuses, the value it has now."""
    gy, x = case(ROWS, HIDDEN, seed=17)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    knob = Knob(1.5)
    for value in (1.5, 1.5, 2.0, 2.0, -1.0, 1.5, 0.75):
        knob.value = value
        got = outcome(lambda: call(d_gy, d_x, out, stream, knob)[0].to_numpy())
        assert got == _clamp_outcome(gy, x, value), value


def test_scalar_objects_no_cache_keys_compute_with_their_own_values(arrays, stream):
    """A new clamp object for every call, of a kind whose value no cache keys (a registered
    numbers.Real): each call computes with its own value, whatever executors earlier calls of
    other values left."""
    gy, x = case(ROWS, HIDDEN, seed=17)
    d_gy, d_x, out = arrays.host(gy), arrays.host(x), arrays.empty(x.shape)
    for value in (1.5, 1.5, 2.0, 2.0, -1.0, 1.5, 0.75, 2.0):
        got = outcome(lambda: call(d_gy, d_x, out, stream, Knob(value))[0].to_numpy())
        assert got == _clamp_outcome(gy, x, value), value


# ---- revisions, group_index ----


def _grouped_case(seed):
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((ROWS, HIDDEN)).astype(np.float32)
    x = rng.standard_normal((ROWS, 2 * HIDDEN)).astype(np.float32)
    weight = rng.uniform(0.5, 1.5, (ROWS, 1)).astype(np.float32)
    y_origin = rng.standard_normal((ROWS, HIDDEN)).astype(np.float32)
    return gy, x, weight, y_origin


def test_abi_revision_changed_between_repeats(arrays, stream, monkeypatch):
    """The very same argument objects called under revision 2, then 1, then 2...: each call is
    made for the revision in force (clamp None, off, is -1.0 in one and 0.0 in the other), and
    group_index in each revision's form gives the grouped bits."""
    gy, x, weight, y_origin = _grouped_case(18)
    groups = np.array([2, 3], np.int64)
    d_gy, d_x, d_w, d_yo = (arrays.host(a) for a in (gy, x, weight, y_origin))
    d_groups = arrays.host(groups)
    out, out_w = arrays.empty(x.shape), arrays.empty(weight.shape)
    grouped = model(gy, x, weight, y_origin, groups, CLAMP)
    for revision in (2, 2, 1, 1, 2, 1, 2, 2, 1):
        monkeypatch.setenv("ACL_SWIGLU_ABI", str(revision))
        for clamp in (None, None, CLAMP, CLAMP, None):
            call(d_gy, d_x, out, stream, clamp)
            assert same_bits(out.to_numpy(), want(gy, x, clamp)), (revision, clamp)
        group_index = groups.tolist() if revision == 1 else d_groups
        for _ in range(2):
            got_x, got_w = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, group_index, CLAMP,
                                                                      grad_x=out, grad_weight=out_w, stream=stream)
            assert same_bits(got_x.to_numpy(), grouped[0]) and same_bits(got_w.to_numpy(), grouped[1]), revision
        wrong = d_groups if revision == 1 else groups.tolist()
        with pytest.raises((TypeError, errors.ArgumentError), match="group_index"):
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, wrong, CLAMP, grad_x=out,
                                                      grad_weight=out_w, stream=stream)


@pytest.mark.parametrize("form", ["list", "ndarray"])
def test_a_host_group_index_changed_in_place_between_calls_gives_its_new_values(arrays, stream, monkeypatch, form):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "1")
    gy, x, weight, y_origin = _grouped_case(19)
    d_gy, d_x, d_w, d_yo = (arrays.host(a) for a in (gy, x, weight, y_origin))
    out, out_w = arrays.empty(x.shape), arrays.empty(weight.shape)
    group_index = [2, 3] if form == "list" else np.array([2, 3], np.int64)

    def run(groups):
        gx, gw = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, groups, CLAMP, grad_x=out,
                                                            grad_weight=out_w, stream=stream)
        return np.concatenate([gx.to_numpy().ravel(), gw.to_numpy().ravel()])

    for values in ([2, 3], [2, 3], [1, 5], [1, 5], [6, 0], [0, 0], [4, 4], [-1, 2], [2, 3], [3, 3]):
        group_index[:] = values
        fresh = outcome(lambda: run(list(values) if form == "list" else np.array(values, np.int64)))
        kept = outcome(lambda: run(group_index))
        assert kept == fresh, values
        if sum(values) <= ROWS and min(values) >= 0:
            gx, gw = model(gy, x, weight, y_origin, np.array(values, np.int64), CLAMP)
            assert fresh == ("bits", np.concatenate([gx.ravel(), gw.ravel()]).tobytes()), values


def test_revision_1_calls_with_host_group_index_compute_with_their_own_clamp(arrays, stream, monkeypatch):
    """Revision 1, group_index as host ints (a list, as the docs show): the same arrays called with
    clamp 1.5, 1.5, then 2.0, None, 0.5...: each call computes with its own clamp (a fresh call
    of each value gives these bits)."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "1")
    gy, x, weight, y_origin = _grouped_case(21)
    groups = np.array([2, 3], np.int64)
    d_gy, d_x, d_w, d_yo = (arrays.host(a) for a in (gy, x, weight, y_origin))
    out, out_w = arrays.empty(x.shape), arrays.empty(weight.shape)
    for clamp in (1.5, 1.5, 2.0, None, 0.5, 1.5, 2.0):
        gx, gw = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, [2, 3], clamp, grad_x=out,
                                                            grad_weight=out_w, stream=stream)
        want_x, want_w = model(gy, x, weight, y_origin, groups, clamp)
        assert same_bits(gx.to_numpy(), want_x) and same_bits(gw.to_numpy(), want_w), clamp


def test_a_device_group_index_rewritten_between_repeats_gives_its_new_values(arrays, stream, monkeypatch):
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    gy, x, weight, y_origin = _grouped_case(20)
    d_gy, d_x, d_w, d_yo = (arrays.host(a) for a in (gy, x, weight, y_origin))
    d_groups = arrays.host(np.array([2, 3], np.int64))
    out, out_w = arrays.empty(x.shape), arrays.empty(weight.shape)
    for values in ([2, 3], [1, 5], [6, 0], [0, 0], [3, 3], [2, 3]):
        d_groups.copy_from(np.array(values, np.int64))
        for _ in range(2):
            gx, gw = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, d_w, d_yo, d_groups, CLAMP, grad_x=out,
                                                                grad_weight=out_w, stream=stream)
            want_x, want_w = model(gy, x, weight, y_origin, np.array(values, np.int64), CLAMP)
            assert same_bits(gx.to_numpy(), want_x) and same_bits(gw.to_numpy(), want_w), values


# ---- devices ----


_DEVICE_SWITCH = r"""
import gc, json
import numpy as np
import acl_swiglu
from acl_swiglu import emulator
from swiglu_cases import case, same_bits, want

gy, x = case(6, 16, seed=83)
expected = want(gy, x, 1.5)
report = {}


def run(arrays, stream):
    d_gy, d_x, out = arrays
    try:
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=1.5, grad_x=out, stream=stream)
        return same_bits(out.to_numpy(), expected)
    except acl_swiglu.AclSwigluError as error:
        return f"{type(error).__name__}: {error}"


zero = [acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.DeviceArray.empty(x.shape, np.float32)]
own0 = acl_swiglu.Stream()
report["device 0"] = [run(zero, s) for s in (None, None, own0, own0)]
acl_swiglu.set_device(1)
report["device 0 arrays on device 1"] = [run(zero, None), run(zero, None)]
report["device 0 stream on device 1"] = run(zero, own0)
one = [acl_swiglu.to_device(gy), acl_swiglu.to_device(x), acl_swiglu.DeviceArray.empty(x.shape, np.float32)]
own1 = acl_swiglu.Stream()
report["device 1"] = [run(one, s) for s in (None, None, own1, own1)]
acl_swiglu.set_device(0)
report["device 1 arrays on device 0"] = [run(one, None), run(one, None)]
report["device 0 again"] = [run(zero, s) for s in (None, None, own0, own0)]
for array in zero:
    array.close()
own0.close()
acl_swiglu.set_device(1)
for array in one:
    array.close()
own1.close()
acl_swiglu.set_device(0)
gc.collect()
acl_swiglu.release_cached()
report["live"] = emulator.live_counts()
print(json.dumps(report))
"""


def test_set_device_between_repeats(tmp_path):
    """The same arguments repeated on device 0, then called after set_device(1): refused naming
    the device the arrays belong to (as a fresh call is), never launched on device 0's kept
    executor; device 1's own arrays work; back on device 0 the calls work again."""
    report = run_child(_DEVICE_SWITCH, tmp_path, ACL_EMU_DEVICES="2")
    assert report["device 0"] == [True] * 4, report
    assert report["device 1"] == [True] * 4, report
    assert report["device 0 again"] == [True] * 4, report
    for name, device in (("device 0 arrays on device 1", "device 0"), ("device 1 arrays on device 0", "device 1")):
        assert all(isinstance(m, str) and device in m for m in report[name]), (name, report)
    assert isinstance(report["device 0 stream on device 1"], str), report
    assert not any(report["live"].values()), report
