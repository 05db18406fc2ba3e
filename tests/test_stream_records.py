"""What the ordering records keep of streams: a stream another thread is destroying (its queued
work still to run), one whose destroy failed, and a borrowed wrapper of a stream the package owned
and destroyed. Writes and frees after reads queued on such a stream wait for exactly the work that
is still to run.

The emulator runs queued work only when its stream is drained (a synchronize or the destroy), so
a read that a write does not wait for shows as wrong bits, deterministically; a thread is paused
at a chosen source line with a trace function, never by timing.
"""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import _device, emulator, runtime

from swiglu_cases import CLAMP, JOIN_TIMEOUT, case, line_of, run_child, same_bits, want

pytestmark = pytest.mark.emulator_only

ROWS, HIDDEN = 6, 16


def _live():
    acl_swiglu.release_cached()
    gc.collect()
    acl_swiglu.release_cached()
    return emulator.live_counts()


def _queue_read(d_gy, d_x, out, stream):
    """Queues on `stream` a launch that reads d_gy, d_x and writes out, with a workspace of its own
    (not the stream's pool: closing the stream then destroys it without a wait before)."""
    executor = acl_swiglu.get_workspace_size(d_gy, d_x, clamp_limit=CLAMP, grad_x=out)
    workspace = acl_swiglu.DeviceBuffer(max(executor.workspace_size, 32))
    executor.launch(stream, workspace)
    return executor, workspace


_DESTROY_LINE = line_of(runtime._free, "status = api.hot.acl_swiglu_destroy(")
_WAIT_LOCK_LINE = line_of(_device.StreamLife.wait, "with self.lock:")


def _while_destroying(stream, action):
    """Closes `stream` on a thread that pauses right before aclrtDestroyStream (which runs the work
    queued on it); meanwhile runs action() on another thread. The destroy goes on once action()
    has finished, or has started to wait for `stream` (what it must do when it needs that
    work done). Returns whether action() finished before the destroy ran its queued work."""
    life = stream._life
    paused, go, done, waits = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    errors_seen = []

    def closer():
        runtime.runtime_api()   # (bound to the device: this thread frees; not a synchronize, which drains)

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == _DESTROY_LINE and frame.f_locals.get("life") is life:
                paused.set()
                go.wait(JOIN_TIMEOUT)
            return local

        sys.settrace(lambda f, e, a: local if f.f_code is runtime._free.__code__ else None)
        try:
            stream.close()
        except BaseException as exc:
            errors_seen.append(exc)
        finally:
            sys.settrace(None)

    def other():
        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == _WAIT_LOCK_LINE and frame.f_locals.get("self") is life:
                waits.set()
            return local

        sys.settrace(lambda f, e, a: local if f.f_code is _device.StreamLife.wait.__code__ else None)
        try:
            action()
        except BaseException as exc:
            errors_seen.append(exc)
        finally:
            sys.settrace(None)
            done.set()

    first = threading.Thread(target=closer, daemon=True)
    first.start()
    assert paused.wait(JOIN_TIMEOUT)
    second = threading.Thread(target=other, daemon=True)
    second.start()
    for _ in range(int(JOIN_TIMEOUT * 20)):
        if done.is_set() or waits.is_set():
            break
        done.wait(0.05)
    finished_first = done.is_set()
    go.set()
    first.join(JOIN_TIMEOUT)
    second.join(JOIN_TIMEOUT)
    assert not first.is_alive() and not second.is_alive(), "hung"
    assert not errors_seen, errors_seen
    return finished_first


@pytest.mark.parametrize("then", ["host write", "free", "device write"])
def test_what_follows_a_read_queued_on_a_stream_another_thread_is_destroying_waits_for_it(then):
    """A read of x queued on stream s while another thread destroys s (its queued work still to
    run); meanwhile x is read on stream c, then written from the host, freed, or written on a
    third stream: each waits for s's read, which computes from the old x."""
    gy, x = case(ROWS, HIDDEN, seed=3)
    gy2, x2 = case(ROWS, HIDDEN, seed=6)
    made = [acl_swiglu.to_device(a) for a in (gy, x, gy2, x2)]
    d_gy, d_x, d_gy2, d_x2 = made
    out_s, out_c = (acl_swiglu.DeviceArray.zeros(x.shape, np.float32) for _ in range(2))
    s, c, w = acl_swiglu.Stream(), acl_swiglu.Stream(), acl_swiglu.Stream()
    executor, workspace = _queue_read(d_gy, d_x, out_s, s)

    def read_elsewhere_then_write():
        acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, grad_x=out_c, stream=c)
        if then == "host write":
            d_x.copy_from(np.zeros_like(x))
        elif then == "free":
            d_x.close()   # (freed after the streams that read it: s too)
        else:
            acl_swiglu.swiglu_group_quant_grad_device(d_gy2, d_x2, clamp_limit=CLAMP, grad_x=d_x, stream=w)
            w.synchronize()

    try:
        _while_destroying(s, read_elsewhere_then_write)
        assert same_bits(out_c.to_numpy(), want(gy, x))
        assert same_bits(out_s.to_numpy(), want(gy, x)), "the read queued on the stream being destroyed saw the write"
        if then == "device write":
            assert same_bits(d_x.to_numpy(), want(gy2, x2))
    finally:
        for obj in (executor, workspace, c, w, out_s, out_c, *made):
            obj.close()


_BORROWED_DEAD = r"""
import json, sys
import numpy as np, acl_swiglu
from swiglu_cases import case, want, same_bits, CLAMP
gy, x = case(6, 16, seed=15)
d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
native = acl_swiglu.Stream()
borrowed = acl_swiglu.Stream.from_handle(native.handle)
gx, _ = acl_swiglu.swiglu_group_quant_grad_device(d_gy, d_x, clamp_limit=CLAMP, stream=borrowed)
native.close()   # destroyed: its queued work ran
result = {}
try:
    result["read"] = bool(same_bits(gx.to_numpy(), want(gy, x)))
except Exception as exc:
    result["read"] = type(exc).__name__
try:
    d_x.copy_from(x * 2)
    result["write"] = bool(same_bits(d_x.to_numpy(), x * 2))
except Exception as exc:
    result["write"] = type(exc).__name__
address = d_x.ptr
d_x.close()
fresh = acl_swiglu.DeviceArray.empty(x.shape, np.float32)
result["reused"] = fresh.ptr == address
try:
    fresh.copy_from(x)
    result["fresh"] = bool(same_bits(fresh.to_numpy(), x))
except Exception as exc:
    result["fresh"] = type(exc).__name__
print(json.dumps(result), flush=True)
"""


def _borrowed_dead_report(tmp_path):
    return run_child(_BORROWED_DEAD, tmp_path, timeout=60)


def test_a_borrowed_wrapper_of_a_destroyed_owned_stream_does_not_break_later_copies(tmp_path):
    report = _borrowed_dead_report(tmp_path)
    assert report["read"] is True, report
    assert report["write"] is True, report


def test_a_failed_stream_destroy_does_not_count_as_its_work_done():
    import ctypes
    from acl_swiglu import _ffi
    gy, x = case(ROWS, HIDDEN, seed=16)
    d_gy, d_x = acl_swiglu.to_device(gy), acl_swiglu.to_device(x)
    out = acl_swiglu.DeviceArray.zeros(x.shape, np.float32)
    s = acl_swiglu.Stream()
    address = s.handle
    executor, workspace = _queue_read(d_gy, d_x, out, s)
    _live()   # (nothing else due: the planned fault hits this destroy)
    try:
        with emulator.inject_faults("aclrtDestroyStream:1:507899"):
            s.close()
        d_x.copy_from(np.zeros_like(x))   # must wait for the read queued on s
        acl_swiglu.synchronize_device()
        assert same_bits(out.to_numpy(), want(gy, x))
    finally:
        acl_swiglu.synchronize_device()
        if address in emulator.live_handles("stream"):
            _ffi.api().raw.aclrtDestroyStream(ctypes.cast(ctypes.c_void_p(address), _ffi.aclrtStream_p))   # (the stream the failed destroy left)
        for obj in (executor, workspace, out, d_gy, d_x):
            obj.close()


# ---- 4. plans: what an interrupted rebind keeps while its exception is kept ----

