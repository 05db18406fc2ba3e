"""Ordering of queued work against later writes and reads (SPEC section 8): a read of a device
array waits for its last writer; a write to it (a copy from the host, a call that outputs to it)
waits for every queued call that reads it, on any stream. The emulator runs queued work only when
its stream is synchronised, so a write that does not wait shows as a result computed from the new
data; every result here is compared bit for bit with the old data's.
"""

from __future__ import annotations

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import errors

from swiglu_cases import CLAMP, case, same_bits, want

ROUNDS = 3   # the first call of a layout, and repeats (a plan's repeat launches without a check)


@pytest.fixture
def data():
    """grad_y, an old and a new x, and what each gives."""
    gy, old = case(8, 16, seed=61)
    _, new = case(8, 16, seed=62)
    return gy, old, new, want(gy, old), want(gy, new)


def _reader(kind, d_gy, d_x, stream, stack):
    """A way to queue a read of d_x on `stream` (not waited for); each returns the output."""
    if kind == "plan":
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(d_gy, d_x, clamp_limit=CLAMP, stream=stream))
        return lambda: plan()[0]
    if kind == "device-call":
        out = stack.enter_context(acl_swiglu.DeviceArray.empty(d_x.shape, np.float32))
        return lambda: acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out,
                                                                 stream=stream)[0]
    out = stack.enter_context(acl_swiglu.DeviceArray.empty(d_x.shape, np.float32))
    if kind == "repeatable-executor":
        executor = stack.enter_context(acl_swiglu.get_workspace_size(d_gy, d_x, clamp_limit=CLAMP, grad_x=out))
        executor.make_repeatable()
        return lambda: (executor.launch(stream), out)[1]

    def single_use():
        acl_swiglu.get_workspace_size(d_gy, d_x, clamp_limit=CLAMP, grad_x=out).launch(stream)
        return out

    return single_use


READERS = ["plan", "device-call", "repeatable-executor", "single-use-executor"]


@pytest.mark.parametrize("reader", READERS)
def test_a_host_write_waits_for_a_queued_read(data, reader):
    """A call queued to read x, then copy_from into x: the call's result is from the old x."""
    from contextlib import ExitStack
    gy, old, new, want_old, want_new = data
    with ExitStack() as stack:
        stream = stack.enter_context(acl_swiglu.Stream())
        d_gy, d_x = (stack.enter_context(acl_swiglu.to_device(a)) for a in (gy, old))
        read = _reader(reader, d_gy, d_x, stream, stack)
        for round_ in range(ROUNDS):
            d_x.copy_from(old)
            out = read()
            d_x.copy_from(new)   # must wait for the queued read
            assert same_bits(out.to_numpy(), want_old), (reader, round_)
            assert same_bits(read().to_numpy(), want_new), (reader, round_)   # and the next call sees the new x


@pytest.mark.parametrize("reader", ["plan", "device-call"])
def test_a_device_write_on_another_stream_waits_for_a_queued_read(data, reader):
    """A call on stream A queued to read x, then a device-level call on stream B that writes x:
    A's result is from the old x, and x holds B's result."""
    from contextlib import ExitStack
    gy, old, new, want_old, want_new = data
    with ExitStack() as stack:
        a, b = stack.enter_context(acl_swiglu.Stream()), stack.enter_context(acl_swiglu.Stream())
        d_gy, d_x, d_new = (stack.enter_context(acl_swiglu.to_device(a_)) for a_ in (gy, old, new))
        read = _reader(reader, d_gy, d_x, a, stack)
        for round_ in range(ROUNDS):
            d_x.copy_from(old)
            out = read()
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_new, clamp_limit=CLAMP, grad_x=d_x, stream=b)
            assert same_bits(out.to_numpy(), want_old), (reader, round_)
            assert same_bits(d_x.to_numpy(), want_new), (reader, round_)


def test_a_write_waits_for_queued_reads_on_several_streams(data):
    gy, old, new, want_old, _ = data
    with acl_swiglu.Stream() as a, acl_swiglu.Stream() as c, acl_swiglu.Stream() as b, \
            acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(old) as d_x, acl_swiglu.to_device(new) as d_new:
        for round_ in range(ROUNDS):
            d_x.copy_from(old)
            outs = [acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, stream=s)[0] for s in (a, c)]
            if round_ % 2:
                d_x.copy_from(new)
            else:
                acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_new, clamp_limit=CLAMP, grad_x=d_x, stream=b)
            for out in outs:
                with out:
                    assert same_bits(out.to_numpy(), want_old), round_


def test_two_writes_on_two_streams_keep_their_order(data):
    """out written on stream A, then on stream B: out holds B's result (B waited for A)."""
    gy, old, new, want_old, want_new = data
    with acl_swiglu.Stream() as a, acl_swiglu.Stream() as b, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.to_device(old) as d_old, acl_swiglu.to_device(new) as d_new, \
            acl_swiglu.DeviceArray.empty(old.shape, np.float32) as out:
        for round_ in range(ROUNDS):
            first, second = (d_old, d_new) if round_ % 2 == 0 else (d_new, d_old)
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, first, clamp_limit=CLAMP, grad_x=out, stream=a)
            acl_swiglu.swiglu_group_quant_grad_device(d_gy, second, clamp_limit=CLAMP, grad_x=out, stream=b)
            assert same_bits(out.to_numpy(), want_new if second is d_new else want_old), round_


def test_a_plan_reads_what_another_stream_wrote_last():
    """A plan reads an array that device-level calls on another stream keep rewriting with other
    data (and unrelated arrays are closed meanwhile): every plan call waits for the last write and
    gives the bits of the data written last; closing the plan's input then fails its next call."""
    gy, x = case(6, 16, seed=41)
    sources = [case(6, 16, seed=50 + k)[1] for k in range(3)]
    middles = [want(gy, source) for source in sources]   # what the writer's calls write
    wants = [want(gy, middle) for middle in middles]     # what the plan computes from it
    with acl_swiglu.Stream() as writer, acl_swiglu.Stream() as reader, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.DeviceArray.empty(x.shape, x.dtype) as middle:
        d_sources = [acl_swiglu.to_device(source) for source in sources]
        try:
            with acl_swiglu.SwigluGroupQuantGradPlan(d_gy, middle, clamp_limit=CLAMP, stream=reader) as plan:
                for round_ in range(12):
                    k = round_ % 3
                    acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_sources[k], clamp_limit=CLAMP, grad_x=middle,
                                                              stream=writer)   # queued: not run yet
                    assert middle.pending is writer
                    if round_ % 4 == 1:
                        acl_swiglu.to_device(gy).close()   # an unrelated close
                    grad_x, _ = plan()
                    assert same_bits(grad_x.to_numpy(), wants[k]), round_
                middle.close()
                with pytest.raises(errors.HandleClosedError):
                    plan()
        finally:
            for array in d_sources:
                array.close()




@pytest.mark.parametrize("alias", ["same-buffer", "wrapped-pointer"])
def test_a_write_through_one_array_waits_for_a_read_queued_through_another_over_the_same_memory(data, alias):
    gy, old, new, want_old, _ = data
    with acl_swiglu.Stream() as stream, acl_swiglu.to_device(gy) as d_gy, acl_swiglu.to_device(old) as d_x:
        other = (acl_swiglu.DeviceArray(d_x.buffer, d_x.shape, d_x.dtype) if alias == "same-buffer"
                 else acl_swiglu.DeviceArray.wrap(d_x.ptr, d_x.shape, d_x.dtype))
        out, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, stream=stream)
        with out:
            other.copy_from(new)
            assert same_bits(out.to_numpy(), want_old)


def test_a_read_through_one_array_waits_for_a_write_queued_through_another_over_the_same_memory(data):
    gy, old, new, _, want_new = data
    with acl_swiglu.Stream() as a, acl_swiglu.Stream() as b, acl_swiglu.to_device(gy) as d_gy, \
            acl_swiglu.to_device(new) as d_new, acl_swiglu.DeviceArray.empty(old.shape, np.float32) as middle:
        middle.copy_from(old)
        alias = acl_swiglu.DeviceArray(middle.buffer, middle.shape, middle.dtype)
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_new, clamp_limit=CLAMP, grad_x=middle, stream=a)
        out, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, alias, clamp_limit=CLAMP, stream=b)
        with out:
            assert same_bits(out.to_numpy(), want(gy, want_new))
