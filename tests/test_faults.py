"""Every ACL call the binding makes, made to fail in turn with the emulator's fault injection.

The calls are discovered, not listed: for every C function the package declares
(``acl_swiglu._ffi.declarations()``, ``symbol``) and N = 1, 2, 3..., the plan ``name:N:code`` is
set and one operation is run, until the fault no longer fires. Operations (scenarios): the
one-shot NumPy call (fp32 / fp16 / bf16 x ABI revisions 1 and 2, with weight, y_origin,
group_index and clamp), the device-level call (own and default stream, synchronize_device),
phase 1 + phase 2 by hand (pooled and explicit workspace), plan builds, plan calls that rebind
every address (aclSetInputTensorAddr / aclSetOutputTensorAddr; revision 1 also regroups),
release_cached, and the first use on a new thread (aclrtSetDevice). aclInit, aclFinalize and
aclrtResetDevice (process start and exit) are injected in subprocesses through ACL_EMU_FAIL.

For every fault that fired:

* it surfaced as the injected code's exception class (``errors.error_class(code)``) with
  ``.code``, ``.api`` and a ``.message`` containing "injected fault"; OR the failing call is one
  the binding deliberately does not check (SWALLOWED below) and the operation still succeeded
  with the right bits (or, with a second, primary fault, raised that original error);
* every handle and buffer is released: ``live_counts()`` is back to the starting counts after
  ``gc.collect()`` and ``release_cached()``. The one exception is inherent: when a destroy/free
  itself fails, that one handle is still live in the emulator (an injected failure has no other
  effect) and the binding, which swallowed the failure, has dropped it. The test records such
  handles through a wrapper around the raw destroy functions, checks that exactly the handle
  whose destroy failed is the one left, and destroys it itself before counting;
* the next, un-faulted call on the same objects succeeds with the exact bits of
  tests/device_model.py.

The number of distinct faults injected is printed at the end of the module (and by
``test_fault_summary``) for the project's issue note.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
from contextlib import ExitStack
from typing import Dict, List, Optional, Tuple

import ml_dtypes
import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402
import forward_model  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import _ffi, emulator, errors, reference  # noqa: E402

pytestmark = pytest.mark.emulator_only

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPE_IDS = {F32: "fp32", F16: "fp16", BF16: "bf16"}

PHASE1 = "aclnnSwigluGroupQuantGradGetWorkspaceSize"
PHASE2 = "aclnnSwigluGroupQuantGrad"
FORWARD_PHASE1 = "aclnnSwigluGroupQuantGetWorkspaceSize"
FORWARD_PHASE2 = "aclnnSwigluGroupQuant"

# Every ACL function the package declares (the package's own helper is not ACL: the emulator
# cannot fail its calls, only the ACL calls it makes).
DECLARED_APIS: Tuple[str, ...] = tuple(dict.fromkeys(decl.symbol for decl in _ffi.declarations()
                                                     if decl.library != "helper"))

# Realistic codes per call (docs/c_abi.md). Phases get two codes each: every (api, N) of a
# phase is injected once with each.
CODES: Dict[str, Tuple[int, ...]] = {
    "aclInit": (500000,),                    # ACL_ERROR_INTERNAL_ERROR
    "aclFinalize": (500000,),
    "aclrtSetDevice": (107001,),             # ACL_ERROR_RT_INVALID_DEVICEID
    "aclrtResetDevice": (507000,),           # ACL_ERROR_RT_INTERNAL_ERROR
    "aclrtGetDevice": (107002,),             # ACL_ERROR_RT_CONTEXT_NULL (no current device)
    "aclrtGetDeviceCount": (507000,),
    "aclrtCreateStream": (200000,),          # ACL_ERROR_BAD_ALLOC
    "aclrtDestroyStream": (507000,),
    "aclrtSynchronizeStream": (507015,),     # ACL_ERROR_RT_AICORE_EXCEPTION
    "aclrtSynchronizeDevice": (507015,),
    "aclrtMalloc": (207001,),                # ACL_ERROR_RT_MEMORY_ALLOCATION
    "aclrtFree": (507000,),
    "aclrtMemcpy": (507000,),
    "aclrtMemcpyAsync": (507000,),
    "aclrtMemset": (507000,),
    "aclGetRecentErrMsg": (500000,),         # returns text, no status: not injectable
    "aclCreateTensor": (561103,),            # ACLNN_ERR_INNER_NULLPTR (constructors return NULL)
    "aclDestroyTensor": (161002,),           # ACLNN_ERR_PARAM_INVALID
    "aclCreateIntArray": (561103,),
    "aclDestroyIntArray": (161002,),
    "aclSetAclOpExecutorRepeatable": (161002,),
    "aclDestroyAclOpExecutor": (161002,),
    "aclSetInputTensorAddr": (161002,),
    "aclSetOutputTensorAddr": (161002,),
    "aclSetRawTensorAddr": (161002,),
    "aclsysGetCANNVersion": (100003,),       # ACL_ERROR_INVALID_FILE (the package is not installed)
    "aclGetDeviceCapability": (107001,),     # ACL_ERROR_RT_INVALID_DEVICEID
    "aclrtGetDeviceInfo": (107001,),
    PHASE1: (561002, 161002),                # ACLNN_ERR_INNER_TILING_ERROR / PARAM_INVALID
    PHASE2: (161002, 561002),
    FORWARD_PHASE1: (561002, 161002),
    FORWARD_PHASE2: (161002, 561002),
}

# Calls the binding makes without checking the status, on purpose: destroy/free in
# finalizers and cleanup (close(), error unwinding, release_cached) and the quiet
# synchronisation made before freeing buffers that queued work may use (error paths; the test's
# own unwinding uses one too). A failure there must not replace the operation's result or its
# original error.
# aclrtGetDevice is among them: its failure is the answer "this thread has no current device", after
# which the binding binds one (DEVICE_QUERY below).
SWALLOWED = {"aclDestroyTensor", "aclDestroyIntArray", "aclDestroyAclOpExecutor", "aclrtDestroyStream",
             "aclrtFree", "aclrtSynchronizeStream", "aclrtResetDevice", "aclFinalize", "aclrtGetDevice",
             "aclsysGetCANNVersion", "aclGetDeviceCapability", "aclrtGetDeviceInfo"}
DESTROY_PROTOTYPE = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)   # (every destroy: a handle in, a status out)
DESTROYERS = ("aclDestroyTensor", "aclDestroyIntArray", "aclDestroyAclOpExecutor", "aclrtDestroyStream", "aclrtFree")
KIND_OF_DESTROYER = {"aclDestroyTensor": "tensor", "aclDestroyIntArray": "int_array",
                     "aclDestroyAclOpExecutor": "executor", "aclrtDestroyStream": "stream",
                     "aclrtFree": "allocation"}

# Declared but never called by the binding (only by users through _ffi, or not at all).
NEVER_CALLED = {"aclrtGetDeviceCount", "aclrtMemcpyAsync", "aclSetRawTensorAddr", "aclsysGetCANNVersion",
                "aclGetDeviceCapability", "aclrtGetDeviceInfo"}
# Declared, called, but with no status to fail (the emulator has no fault hook in it).
NOT_INJECTABLE = {"aclGetRecentErrMsg"}
# Called once per process (aclInit) or at exit: injected in subprocesses (test_process_*).
PROCESS_LEVEL = {"aclInit", "aclFinalize", "aclrtResetDevice"}
# Asked once per thread, before its first aclrtSetDevice; a failure means "no current device"
# (the binding then sets one), and a runtime without it is asked nothing.
# The install's version and the device's core count are asked too (at load, and by the release
# guard on releases that need it): a failure means "the runtime cannot say", and the answer falls
# back (to the version files, to the largest core count of the family).
DEVICE_QUERY = {"aclrtGetDevice", "aclsysGetCANNVersion", "aclGetDeviceCapability", "aclrtGetDeviceInfo"}

MAX_N = 200   # a call made more often than this in one operation is itself a finding


# ----------------------------------------------------------------------------- helpers


def bits(a: Optional[np.ndarray]) -> Optional[np.ndarray]:
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def same_bits(got, want) -> bool:
    if got is None or want is None:
        return got is None and want is None
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(bits(got), bits(want))


def collect_and_release() -> None:
    gc.collect()
    acl_swiglu.release_cached()
    gc.collect()


def quiet_sync(stream) -> None:
    """What a careful caller does before freeing buffers used by queued work."""
    try:
        stream.synchronize()
    except acl_swiglu.AclSwigluError:
        pass


class DestroyLog:
    """Finds the handles a failed destroy/free left live in the emulator (the binding, which
    swallowed the failure, has dropped them), so the test can see which ones and release them.

    Destroys made from Python go through the bound API's raw functions, which objects capture
    when they are made: those are wrapped, and each failure recorded. A one-shot call makes its
    destroys in the package's native helper; such a call owns nothing once it returns, so for
    it (``mark(owns_nothing=True)``) every handle made since the mark and still live after a
    collection is one a failed destroy left."""

    def __init__(self, monkeypatch):
        api = self.api = _ffi.api()
        self.original = {}
        self.failed: List[Tuple[str, object, int]] = []
        self.before: Optional[Dict[str, set]] = None
        for name in DESTROYERS:
            original = getattr(api.raw, name)
            self.original[name] = original

            def wrapper(address, _name=name, _original=original):
                handle = ctypes.cast(address, _original.argtypes[0])
                status = _original(handle)
                if status != 0:
                    self.failed.append((_name, handle, int(status)))
                return status

            # (a C function, as the package frees handles through its helper)
            monkeypatch.setattr(api.raw, name, DESTROY_PROTOTYPE(wrapper))

    def mark(self, owns_nothing: bool) -> None:
        self.before = None
        if owns_nothing:
            collect_and_release()
            self.before = {kind: set(emulator.live_handles(kind)) for kind in KIND_OF_DESTROYER.values()}

    def recover(self) -> List[Tuple[str, int]]:
        """Destroys, for real, every handle whose destroy failed; returns (api, status) of each
        retry (0 = it was still live, i.e. the swallowed failure had left it behind)."""
        retried = []
        failed, self.failed = self.failed, []
        for name, handle, _status in failed:
            retried.append((name, int(self.original[name](handle))))
        if self.before is not None:
            collect_and_release()
            for name, kind in KIND_OF_DESTROYER.items():
                for handle in sorted(set(emulator.live_handles(kind)) - self.before[kind]):
                    destroy = self.original[name]
                    retried.append((name, int(destroy(ctypes.cast(handle, destroy.argtypes[0])))))
        return retried


# ----------------------------------------------------------------------------- inputs


ROWS_LEAD = (2, 3)   # T = 6: ranks 3 work in both ABI revisions
H = 16
CLAMP = 2.5


def make_case(dtype, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-4, 4, ROWS_LEAD + (2 * H,)).astype(np.float32).astype(dtype)
    gy = rng.uniform(-2, 2, ROWS_LEAD + (H,)).astype(np.float32).astype(dtype)
    w = rng.uniform(0.25, 1.5, ROWS_LEAD + (1,)).astype(np.float32)
    yo = reference.swiglu(x, CLAMP).astype(np.float32).astype(dtype)
    return gy, x, w, yo


GROUPS_A = np.array([3, 2], np.int64)   # trunc 5 of 6
GROUPS_B = np.array([1, 1], np.int64)   # trunc 2 (same G: revision 2 rebinds a [2] tensor)


def model(case, groups):
    gy, x, w, yo = case
    return device_model.swiglu_group_quant_grad_model(gy, x, w, yo, groups, CLAMP)


# ----------------------------------------------------------------------------- scenarios


class Scenario:
    """One operation: setup() (not faulted), run(ctx) -> results (faulted), teardown(ctx)."""

    name = "scenario"
    abi = 2
    owns_nothing = False   # once run() returns (a one-shot call)

    def setup(self):
        return None

    def run(self, ctx):
        raise NotImplementedError

    def teardown(self, ctx) -> None:
        pass

    def expected(self):
        raise NotImplementedError

    def check_swallowed(self, got) -> Optional[str]:
        """The check after a fault the binding swallowed (default: the same exact bits)."""
        return self.check(got)

    def check(self, got) -> Optional[str]:
        """None when `got` are the exact expected bits, else a description."""
        want = self.expected()
        if len(got) != len(want):
            return f"{len(got)} results, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            if not same_bits(g, w):
                return f"result {i} has wrong bits"
        return None


class OneShot(Scenario):
    owns_nothing = True

    def __init__(self, dtype, abi):
        self.dtype, self.abi = np.dtype(dtype), abi
        self.name = f"one-shot-{DTYPE_IDS[self.dtype]}-abi{abi}"
        self.case = make_case(self.dtype, 10 + abi)

    def setup(self):
        acl_swiglu.release_cached()   # the call makes its stream and workspace inside the block

    def run(self, ctx):
        gy, x, w, yo = self.case
        return acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, GROUPS_A, CLAMP)

    def expected(self):
        return model(self.case, GROUPS_A)


class Device(Scenario):
    def __init__(self, abi, own_stream: bool):
        self.abi, self.own_stream = abi, own_stream
        self.name = f"device-{'own' if own_stream else 'default'}-stream-abi{abi}"
        self.case = make_case(F16, 20 + abi)

    def run(self, ctx):
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream()) if self.own_stream else None
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in self.case]
            group = (stack.enter_context(acl_swiglu.to_device(GROUPS_A)) if self.abi == 2
                     else [int(v) for v in GROUPS_A])
            gx, gw = acl_swiglu.swiglu_group_quant_grad_device(*d, group, CLAMP, stream=stream)
            stack.enter_context(gx)
            stack.enter_context(gw)
            stack.callback(quiet_sync, stream or acl_swiglu.default_stream())
            acl_swiglu.synchronize_device()
            return gx.to_numpy(), gw.to_numpy()

    def expected(self):
        return model(self.case, GROUPS_A)


class Phases(Scenario):
    def __init__(self, abi, explicit_workspace: bool):
        self.abi, self.explicit = abi, explicit_workspace
        self.name = f"phases-{'explicit' if explicit_workspace else 'pooled'}-workspace-abi{abi}"
        self.case = make_case(BF16, 30 + abi)

    def run(self, ctx):
        with ExitStack() as stack:
            stream = stack.enter_context(acl_swiglu.Stream())
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in self.case]
            group = (stack.enter_context(acl_swiglu.to_device(GROUPS_A)) if self.abi == 2
                     else GROUPS_A.tolist())
            gx = stack.enter_context(acl_swiglu.DeviceArray.empty(self.case[1].shape, self.case[1].dtype))
            gw = stack.enter_context(acl_swiglu.DeviceArray.empty(self.case[2].shape, np.float32))
            stack.callback(quiet_sync, stream)
            executor = stack.enter_context(acl_swiglu.get_workspace_size(*d, group, CLAMP, grad_x=gx, grad_weight=gw))
            assert executor.workspace_size > 0
            if self.explicit:
                workspace = stack.enter_context(acl_swiglu.DeviceBuffer(executor.workspace_size))
                executor.launch(stream, workspace=workspace)
            else:
                executor.launch(stream)
            stream.synchronize()
            return gx.to_numpy(), gw.to_numpy()

    def expected(self):
        return model(self.case, GROUPS_A)


class PlanBuild(Scenario):
    """Build a plan (it allocates its outputs), call it once, read, close it: all faulted."""

    def __init__(self, abi, own_stream: bool):
        self.abi, self.own_stream = abi, own_stream
        self.name = f"plan-build-{'own' if own_stream else 'default'}-stream-abi{abi}"
        self.case = make_case(F32, 40 + abi)

    def setup(self):
        stack = ExitStack()
        d = [stack.enter_context(acl_swiglu.to_device(a)) for a in self.case]
        group = stack.enter_context(acl_swiglu.to_device(GROUPS_A)) if self.abi == 2 else GROUPS_A.tolist()
        stream = stack.enter_context(acl_swiglu.Stream()) if self.own_stream else None
        return stack, d, group, stream

    def run(self, ctx):
        _, d, group, stream = ctx
        with acl_swiglu.SwigluGroupQuantGradPlan(*d, group, CLAMP, stream=stream) as plan:
            plan()
            return plan.grad_x.to_numpy(), plan.grad_weight.to_numpy()

    def teardown(self, ctx):
        ctx[0].close()

    def expected(self):
        return model(self.case, GROUPS_A)


class PlanCall(Scenario):
    """A plan built before the block; in it, a call that rebinds every address to a second set
    (and, in revision 1, new group counts), then one that rebinds back."""

    def __init__(self, abi, own_stream: bool):
        self.abi, self.own_stream = abi, own_stream
        self.name = f"plan-call-rebind-{'own' if own_stream else 'default'}-stream-abi{abi}"
        self.case_a = make_case(BF16, 50 + abi)
        self.case_b = make_case(BF16, 60 + abi)

    def setup(self):
        stack = ExitStack()
        try:
            stream = stack.enter_context(acl_swiglu.Stream()) if self.own_stream else None
            sets = []
            for case, groups in ((self.case_a, GROUPS_A), (self.case_b, GROUPS_B)):
                d = [stack.enter_context(acl_swiglu.to_device(a)) for a in case]
                g = stack.enter_context(acl_swiglu.to_device(groups)) if self.abi == 2 else groups.tolist()
                gx = stack.enter_context(acl_swiglu.DeviceArray.empty(case[1].shape, case[1].dtype))
                gw = stack.enter_context(acl_swiglu.DeviceArray.empty(case[2].shape, np.float32))
                sets.append((d, g, gx, gw))
            d, g, gx, gw = sets[0]
            plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(
                *d, g, CLAMP, grad_x=gx, grad_weight=gw, stream=stream))
            plan.stream.synchronize()
        except BaseException:
            stack.close()
            raise
        return stack, plan, sets

    def run(self, ctx):
        _, plan, sets = ctx
        out = []
        for d, g, gx, gw in (sets[1], sets[0]):
            plan(*d, group_index=g, grad_x=gx, grad_weight=gw)
            out += [gx.to_numpy(), gw.to_numpy()]
        return tuple(out)

    def teardown(self, ctx):
        ctx[0].close()

    def expected(self):
        return model(self.case_b, GROUPS_B) + model(self.case_a, GROUPS_A)


class ReleaseCached(Scenario):
    """release_cached() after one-shot calls (a per-thread stream and its workspace) and a
    device-level call on the default stream (the default stream's workspace)."""

    name = "release-cached"

    def __init__(self):
        self.case = make_case(F32, 70)

    def setup(self):
        gy, x, w, yo = self.case
        acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, GROUPS_A, CLAMP)
        with ExitStack() as stack:
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in self.case]
            gx, gw = acl_swiglu.swiglu_group_quant_grad_device(*d, clamp_limit=CLAMP)
            stack.enter_context(gx)
            stack.enter_context(gw)
            acl_swiglu.default_stream().synchronize()
        counts = emulator.live_counts()
        # What is cached: the thread's one-shot stream (a one-shot call's workspace is in its
        # arena), the default stream's pooled workspace, and the device-level call's executor with
        # its six tensors.
        assert (counts["stream"], counts["allocation"], counts["executor"], counts["tensor"]) == (1, 1, 1, 6), counts

    def run(self, ctx):
        acl_swiglu.release_cached()
        return ()

    def check(self, got):
        counts = emulator.live_counts()
        return None if not any(counts.values()) else f"release_cached left {counts}"

    def check_swallowed(self, got):
        # The handle whose destroy failed is still live (the test releases it); the end-of-run
        # count comparison checks that nothing else is.
        return None


class NewThread(Scenario):
    """A one-shot call on a thread that never used ACL (aclrtSetDevice on first use)."""

    name = "new-thread-one-shot"
    owns_nothing = True

    def __init__(self):
        self.case = make_case(F32, 80)

    def run(self, ctx):
        box = {}

        def work():
            try:
                gy, x, w, yo = self.case
                box["result"] = acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, GROUPS_A, CLAMP)
            except BaseException as exc:   # re-raised on the calling thread
                box["error"] = exc

        thread = threading.Thread(target=work)
        thread.start()
        thread.join(60)
        assert not thread.is_alive(), "the one-shot call on a new thread hung"
        if "error" in box:
            raise box.pop("error")
        return box["result"]

    def expected(self):
        return model(self.case, GROUPS_A)


class Forward(Scenario):
    """The forward operator's three forms: a one-shot call (FP8 codes, fp32 scales), a
    device-level call (MX FP4), and a plan built, called and closed (MX FP8), all with group
    truncation: the outputs the layer allocates start zeroed past it."""

    def __init__(self, form: str):
        self.form = form
        self.name = f"forward-{form}"
        self.owns_nothing = form == "one-shot"
        rng = np.random.default_rng({"one-shot": 90, "device": 91, "plan": 92}[form])
        self.x = rng.uniform(-4, 4, ROWS_LEAD + (512,)).astype(BF16 if form == "plan" else F16)
        self.weight = rng.uniform(0.25, 1.5, int(np.prod(ROWS_LEAD))).astype(np.float32)
        self.dst, self.mode = {"one-shot": ("float8_e4m3fn", 0), "device": ("float4_e2m1fn", 1),
                               "plan": ("float8_e5m2", 1)}[form]

    def setup(self):
        if self.form == "one-shot":
            acl_swiglu.release_cached()

    def run(self, ctx):
        options = dict(dst_type=self.dst, quant_mode=self.mode, clamp_limit=CLAMP)
        if self.form == "one-shot":
            return acl_swiglu.swiglu_group_quant(self.x, self.weight, GROUPS_A, **options)
        with ExitStack() as stack:
            d = [stack.enter_context(acl_swiglu.to_device(a)) for a in (self.x, self.weight, GROUPS_A)]
            if self.form == "device":
                outputs = acl_swiglu.swiglu_group_quant_device(*d, **options)
            else:
                plan = stack.enter_context(acl_swiglu.SwigluGroupQuantPlan(*d, **options))
                outputs = plan()
            for output in outputs:
                if self.form == "device":
                    stack.enter_context(output)
            stack.callback(quiet_sync, acl_swiglu.default_stream())
            return tuple(output.to_numpy() for output in outputs)

    def expected(self):
        """The bit-exact model's bytes of y and y_scale (rows past the truncation zero)."""
        code = {"float8_e4m3fn": 36, "float8_e5m2": 35, "float4_e2m1fn": 40}[self.dst]
        y, scales = forward_model.forward(self.x, self.weight, GROUPS_A, dst=code, quant_mode=self.mode,
                                          round_scale=self.mode == 1, clamp=CLAMP)
        return y.reshape(-1), scales.view(np.uint8).reshape(-1)

    def check(self, got):
        want = self.expected()
        if len(got) != len(want):
            return f"{len(got)} results, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            if not np.array_equal(np.ascontiguousarray(g).view(np.uint8).reshape(-1), w):
                return f"result {i} has wrong bytes"
        return None


# ----------------------------------------------------------------------------- exploration


class Record:
    """Outcome of exploring one scenario."""

    def __init__(self, name: str):
        self.name = name
        self.fired: Dict[str, int] = {}                 # api -> highest N that fired
        self.injections = 0                             # (api, N, code) that fired
        self.surfaced: List[Tuple[str, int, int]] = []  # raised as the injected error
        self.swallowed: List[Tuple[str, int, int]] = [] # not checked on purpose; op succeeded
        self.leaked_then_recovered: List[Tuple[str, int]] = []
        self.problems: List[str] = []
        self.runs = 0

    @property
    def distinct(self) -> int:
        return sum(self.fired.values())


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def inject_once(scenario: Scenario, log: DestroyLog, plan: str, expect: List[Tuple[str, int, int]],
                record: Record, primary: Optional[Tuple[str, int, int]] = None) -> int:
    """Runs the scenario once under `plan`; checks the outcome; returns how many faults fired.

    `expect` lists the (api, N, code) of the plan. With `primary`, the operation must raise
    that (original) error whatever else fired.
    """
    collect_and_release()
    start = emulator.live_counts()
    ctx = scenario.setup()
    log.mark(scenario.owns_nothing)
    got = raised = None
    record.runs += 1
    tag = f"{scenario.name} [{plan}]"
    try:
        with emulator.inject_faults(plan):
            try:
                got = scenario.run(ctx)
            except Exception as exc:   # judged below
                raised = exc
            fired = emulator.faults_injected()
        if fired == 0:
            # A plain run: it must work.
            if raised is not None:
                record.problems.append(f"{tag}: nothing fired but the call raised {_describe(raised)}")
            elif scenario.check(got) is not None:
                record.problems.append(f"{tag}: nothing fired but {scenario.check(got)}")
        else:
            problem, kind = judge(scenario, expect, fired, got, raised, primary)
            if problem:
                record.problems.append(f"{tag}: {problem}")
            elif kind == "surfaced":
                record.surfaced.append(expect[-1])
            else:
                record.swallowed.append(expect[-1])
        raised = None   # the traceback holds frames that hold device arrays
        # Handles whose destroy failed are still live in the emulator: the binding dropped them.
        for name, status in log.recover():
            record.leaked_then_recovered.append((name, status))
            failed_here = any(api == name for api, _, _ in expect)
            if status != 0 or not failed_here:
                record.problems.append(f"{tag}: a failed {name} left a handle that could not be destroyed "
                                       f"afterwards (status {status})" if status else
                                       f"{tag}: {name} failed although no fault was planned in it")
        # The next, un-faulted call on the same objects works and gives the exact bits.
        try:
            again = scenario.run(ctx)
            why = scenario.check(again)
            if why:
                record.problems.append(f"{tag}: the next un-faulted call gave wrong results: {why}")
        except Exception as exc:
            record.problems.append(f"{tag}: the next un-faulted call raised {_describe(exc)}")
    finally:
        try:
            scenario.teardown(ctx)
        except Exception as exc:
            record.problems.append(f"{tag}: teardown raised {_describe(exc)}")
        collect_and_release()
        for name, status in log.recover():
            record.problems.append(f"{tag}: {name} failed during teardown (retry status {status})")
        collect_and_release()
    end = emulator.live_counts()
    if end != start:
        record.problems.append(f"{tag}: live counts {start} -> {end} after gc.collect() + release_cached()")
    return fired


def judge(scenario, expect, fired, got, raised, primary) -> Tuple[Optional[str], str]:
    """(problem or None, "surfaced" / "swallowed")."""
    if primary is not None:
        api, _, code = primary
        if not isinstance(raised, errors.AclError) or raised.api != api or raised.code != code:
            return (f"the original error ({api} {code}) should surface, got "
                    f"{_describe(raised) if raised is not None else 'no error'}"), "swallowed"
        return None, "swallowed"
    (api, _, code), = expect
    if raised is not None:
        if not isinstance(raised, errors.AclError):
            return f"raised {_describe(raised)}, not an AclError", "surfaced"
        wrong = []
        if type(raised) is not errors.error_class(code):
            wrong.append(f"class {type(raised).__name__} (want {errors.error_class(code).__name__})")
        if raised.code != code:
            wrong.append(f"code {raised.code}")
        if raised.api != api:
            wrong.append(f"api {raised.api!r}")
        if "injected fault" not in raised.message:
            wrong.append(f"message {raised.message!r}")
        return (("surfaced wrongly: " + ", ".join(wrong)) if wrong else None), "surfaced"
    if api not in SWALLOWED:
        return f"a fault in {api} fired but the operation succeeded (the failure was lost)", "swallowed"
    why = scenario.check_swallowed(got)
    return (f"the swallowed {api} failure changed the result: {why}" if why else None), "swallowed"


def explore(scenario: Scenario, log: DestroyLog, apis=DECLARED_APIS) -> Record:
    record = Record(scenario.name)
    assert acl_swiglu.abi_revision() == scenario.abi
    for api in apis:
        for code in CODES[api]:
            n = 1
            while n <= MAX_N:
                plan = f"{api}:{n}:{code}"
                fired = inject_once(scenario, log, plan, [(api, n, code)], record)
                if not fired:
                    break
                record.injections += 1
                record.fired[api] = max(record.fired.get(api, 0), n)
                n += 1
            else:
                record.problems.append(f"{api} was called more than {MAX_N} times in one operation")
    return record


# Exploration results, shared by the parametrised tests and the summary.
RECORDS: Dict[str, Record] = {}
CLEANUP_RECORDS: Dict[str, Record] = {}


def scenarios():
    out = []
    for dtype in (F32, F16, BF16):
        for abi in (1, 2):
            out.append(OneShot(dtype, abi))
    for abi in (1, 2):
        out.append(Device(abi, own_stream=True))
        out.append(Device(abi, own_stream=False))
        out.append(Phases(abi, explicit_workspace=False))
        out.append(Phases(abi, explicit_workspace=True))
        out.append(PlanBuild(abi, own_stream=True))
        out.append(PlanBuild(abi, own_stream=False))
        out.append(PlanCall(abi, own_stream=True))
        out.append(PlanCall(abi, own_stream=False))
    out.append(ReleaseCached())
    out.append(NewThread())
    out.extend(Forward(form) for form in ("one-shot", "device", "plan"))
    return out


SCENARIOS = {s.name: s for s in scenarios()}


def run_exploration(name: str, monkeypatch) -> Record:
    if name not in RECORDS:
        scenario = SCENARIOS[name]
        acl_swiglu.runtime.runtime_api()   # aclInit + aclrtSetDevice here, not in the first faulted run
        with monkeypatch.context() as mp:
            mp.setenv("ACL_SWIGLU_ABI", str(scenario.abi))
            log = DestroyLog(mp)
            record = explore(scenario, log)
        RECORDS[name] = record
    return RECORDS[name]


# Minimal per-scenario expectations: calls that must be among the discovered ones.
MUST_FIRE = {
    "one-shot": {"aclrtCreateStream", "aclrtMalloc", "aclrtMemcpy", "aclCreateTensor", PHASE1, PHASE2,
                 "aclrtSynchronizeStream", "aclDestroyTensor", "aclrtFree"},
    # (a device-level call keeps its executor and tensors for the next call of the same layout)
    "device": {"aclrtMalloc", "aclrtMemcpy", "aclCreateTensor", PHASE1, "aclSetAclOpExecutorRepeatable", PHASE2,
               "aclrtSynchronizeDevice", "aclrtFree"},
    "phases": {"aclrtCreateStream", "aclrtDestroyStream", "aclrtMalloc", PHASE1, PHASE2, "aclrtSynchronizeStream"},
    "plan-build": {"aclCreateTensor", PHASE1, "aclSetAclOpExecutorRepeatable", PHASE2, "aclDestroyAclOpExecutor",
                   "aclDestroyTensor", "aclrtMalloc", "aclrtFree"},
    "plan-call": {"aclSetInputTensorAddr", "aclSetOutputTensorAddr", PHASE2, "aclrtSynchronizeStream",
                  "aclrtMemcpy"},
    "release-cached": {"aclrtDestroyStream", "aclrtFree", "aclrtSynchronizeStream", "aclDestroyAclOpExecutor",
                       "aclDestroyTensor"},
    "new-thread": {"aclrtSetDevice"},
    "forward-one-shot": {"aclrtMalloc", "aclrtMemcpy", "aclCreateTensor", FORWARD_PHASE1, FORWARD_PHASE2,
                         "aclrtSynchronizeStream", "aclrtFree"},
    "forward-device": {"aclrtMalloc", "aclrtMemset", "aclrtMemcpy", "aclCreateTensor", FORWARD_PHASE1,
                       "aclSetAclOpExecutorRepeatable", FORWARD_PHASE2, "aclrtFree"},
    "forward-plan": {"aclrtMalloc", "aclrtMemset", "aclCreateTensor", FORWARD_PHASE1, FORWARD_PHASE2,
                     "aclDestroyAclOpExecutor", "aclDestroyTensor", "aclrtFree"},
}


def must_fire(name: str, abi: int) -> set:
    for prefix, apis in MUST_FIRE.items():
        if name.startswith(prefix):
            need = set(apis)
            if abi == 1 and prefix in ("one-shot", "device", "phases", "plan-build", "plan-call"):
                need |= {"aclCreateIntArray", "aclDestroyIntArray"}
            if abi == 1 and prefix == "plan-call":
                # (new counts are read at phase 1: the plan makes a new executor on the new arrays)
                need = (need - {"aclSetInputTensorAddr", "aclSetOutputTensorAddr"}) | {PHASE1,
                                                                                    "aclSetAclOpExecutorRepeatable"}
            return need
    return set()


# ----------------------------------------------------------------------------- tests


def test_codes_cover_every_declared_function():
    """A newly declared C function must get a realistic code (and so gets explored)."""
    assert set(DECLARED_APIS) == set(CODES), set(DECLARED_APIS) ^ set(CODES)
    for api, codes in CODES.items():
        for code in codes:
            assert errors.error_class(code) is not None and code // 100000 in (1, 2, 3, 5), (api, code)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_call_fails_in_turn(name, monkeypatch):
    record = run_exploration(name, monkeypatch)
    scenario = SCENARIOS[name]
    assert not record.problems, f"{len(record.problems)} problem(s):\n" + "\n".join(record.problems[:40])
    missing = must_fire(name, scenario.abi) - set(record.fired)
    assert not missing, f"{name}: these calls were expected but never fired: {sorted(missing)}; fired {record.fired}"
    assert record.injections >= len(record.fired) > 0


# -- faults in cleanup while another error unwinds -----------------------------

# Plan calls create nothing, so nothing is destroyed while their errors unwind: not listed.
CLEANUP_SCENARIOS = ["one-shot-bf16-abi1", "one-shot-fp32-abi2", "one-shot-fp16-abi1", "device-own-stream-abi2",
                     "device-default-stream-abi1", "phases-pooled-workspace-abi1", "phases-explicit-workspace-abi2",
                     "plan-build-own-stream-abi1", "plan-build-default-stream-abi2"]
PRIMARIES = [(PHASE1, 1, 561002), (PHASE2, 1, 161002), ("aclrtSynchronizeStream", 1, 507015)]
CLEANUP_APIS = ("aclDestroyTensor", "aclDestroyIntArray", "aclDestroyAclOpExecutor", "aclrtFree",
                "aclrtDestroyStream", "aclrtSynchronizeStream")


@pytest.mark.parametrize("name", CLEANUP_SCENARIOS)
def test_cleanup_failures_during_error_unwinding_keep_the_original_error(name, monkeypatch):
    """A primary fault makes the operation fail; a second fault hits every destroy / free /
    quiet synchronisation (each N in turn) made while unwinding. The original error surfaces,
    nothing else leaks, and the next call works."""
    scenario = SCENARIOS[name]
    monkeypatch.setenv("ACL_SWIGLU_ABI", str(scenario.abi))
    log = DestroyLog(monkeypatch)
    record = Record(name)
    primaries_fired = 0
    for primary in PRIMARIES:
        # Does the primary fire on its own in this scenario?
        if not inject_once(scenario, log, "{}:{}:{}".format(*primary), [primary], record):
            continue
        primaries_fired += 1
        for cleanup in CLEANUP_APIS:
            if cleanup == primary[0]:
                continue
            code = CODES[cleanup][0]
            n = 1
            while n <= MAX_N:
                plan = "{}:{}:{},{}:{}:{}".format(*primary, cleanup, n, code)
                fired = inject_once(scenario, log, plan, [primary, (cleanup, n, code)], record, primary=primary)
                if fired < 2:
                    break
                record.injections += 1
                record.fired[f"{primary[0]}+{cleanup}"] = n
                n += 1
    CLEANUP_RECORDS[name] = record
    assert primaries_fired >= 2, f"{name}: only {primaries_fired} primary faults fired"
    assert not record.problems, f"{len(record.problems)} problem(s):\n" + "\n".join(record.problems[:40])
    assert record.injections > 0


# -- plan regrouping (revision 1) after a failed rebuild ------------------------


def test_plan_regroup_after_failed_rebuild_uses_the_new_counts(monkeypatch):
    """Revision 1 reads group counts at phase 1, so a plan call with new counts builds a new
    executor. If that build fails, the next call with the same new counts must still use them."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "1")
    scenario = PlanCall(1, own_stream=True)
    stack, plan, sets = scenario.setup()
    with stack:
        (d_a, g_a, gx_a, gw_a), (d_b, g_b, gx_b, gw_b) = sets
        with emulator.inject_faults(f"{PHASE1}:1:561002"):
            with pytest.raises(errors.AclnnErrInnerTilingError) as info:
                plan(*d_b, group_index=g_b, grad_x=gx_b, grad_weight=gw_b)
            assert emulator.faults_injected() == 1
        assert info.value.api == PHASE1 and "injected fault" in info.value.message
        plan(*d_b, group_index=g_b, grad_x=gx_b, grad_weight=gw_b)
        want_x, want_w = model(scenario.case_b, GROUPS_B)
        got_x, got_w = gx_b.to_numpy(), gw_b.to_numpy()
        stale_x, _ = device_model.swiglu_group_quant_grad_model(*scenario.case_b, GROUPS_A, CLAMP)
        assert not same_bits(want_x, stale_x)   # the two group counts give different results
        assert same_bits(got_x, want_x), (
            "after a failed regroup the plan kept the old executor (old counts) but remembered the new "
            f"counts, so the retry did not rebuild: rows computed {int(np.count_nonzero(bits(got_x).any(axis=-1)))} "
            f"(trunc {int(GROUPS_B.sum())} expected)")
        assert same_bits(got_w, want_w)


def test_plan_exit_during_an_error_keeps_the_original_error(monkeypatch):
    """`with plan: plan()` where phase 2 fails and the plan's close() then cannot synchronise
    its stream: the caller should see the phase-2 error (the one-shot API keeps the original
    error in the same situation: its unwinding synchronisation is quiet)."""
    monkeypatch.setenv("ACL_SWIGLU_ABI", "2")
    case = make_case(F32, 90)
    with ExitStack() as stack:
        d = [stack.enter_context(acl_swiglu.to_device(a)) for a in case[:2]]
        stream = stack.enter_context(acl_swiglu.Stream())
        with emulator.inject_faults(f"{PHASE2}:1:161002,aclrtSynchronizeStream:1:507015"):
            with pytest.raises(errors.AclError) as info:
                with acl_swiglu.SwigluGroupQuantGradPlan(*d, stream=stream) as plan:
                    plan()
            assert emulator.faults_injected() == 2
        assert plan.closed   # close() did release everything despite the failed synchronisation
        assert (info.value.api, info.value.code) == (PHASE2, 161002), (
            f"the plan's close() replaced the original phase-2 error with {info.value!r}")


# -- a new thread's first use: aclrtSetDevice, then a retry on the same thread ----


def test_set_device_failure_on_a_new_thread_then_retry_on_that_thread():
    case = make_case(F32, 81)
    box = {}

    def work():
        try:
            with emulator.inject_faults("aclrtSetDevice:1:107001"):
                try:
                    acl_swiglu.swiglu_group_quant_grad(*case, GROUPS_A, CLAMP)
                except errors.AclError as exc:
                    box["error"] = (type(exc), exc.code, exc.api, exc.message)
                box["fired"] = emulator.faults_injected()
            box["result"] = acl_swiglu.swiglu_group_quant_grad(*case, GROUPS_A, CLAMP)
        except BaseException as exc:
            box["unexpected"] = exc

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert not thread.is_alive()
    assert "unexpected" not in box, box.get("unexpected")
    assert box["fired"] == 1
    cls, code, api, message = box["error"]
    assert cls is errors.AclErrorRtInvalidDeviceid and code == 107001 and api == "aclrtSetDevice"
    assert "injected fault" in message
    want = model(case, GROUPS_A)
    assert same_bits(box["result"][0], want[0]) and same_bits(box["result"][1], want[1])


# -- process-level calls: aclInit at first use, aclrtResetDevice / aclFinalize at exit ----

CHILD = textwrap.dedent(r"""
    import atexit, json, os, sys
    sys.path.insert(0, sys.argv[1])
    leave_for_exit = sys.argv[2] == "leave"
    import numpy as np
    import device_model
    import acl_swiglu
    from acl_swiglu import emulator, errors, reference

    out = {}

    def at_end():   # registered before the package's own exit handler, so it runs after it
        out["fired_at_exit"] = emulator.faults_injected()
        print("RESULT " + json.dumps(out), flush=True)

    atexit.register(at_end)
    rng = np.random.default_rng(5)
    x = rng.uniform(-4, 4, (2, 3, 32)).astype(np.float32)
    gy = rng.uniform(-2, 2, (2, 3, 16)).astype(np.float32)
    w = rng.uniform(0.25, 1.5, (2, 3, 1)).astype(np.float32)
    yo = reference.swiglu(x, 2.5).astype(np.float32)
    gi = np.array([3, 2], np.int64)
    want = device_model.swiglu_group_quant_grad_model(gy, x, w, yo, gi, 2.5)
    try:
        acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, gi, 2.5)
        out["first"] = "ok"
    except errors.AclError as exc:
        out["first"] = [type(exc).__name__, exc.code, exc.api, exc.message]
    out["fired_after_first"] = emulator.faults_injected()
    gx, gw = acl_swiglu.swiglu_group_quant_grad(gy, x, w, yo, gi, 2.5)
    out["second_ok"] = bool(np.array_equal(gx.view(np.uint32), want[0].view(np.uint32))
                            and np.array_equal(gw.view(np.uint32), want[1].view(np.uint32)))
    # a live plan (tensors, executor, buffers), a stream with a workspace, the cached
    # per-thread stream: left to the exit path, or released here
    stream = acl_swiglu.Stream()
    d = [acl_swiglu.to_device(a) for a in (gy, x)]
    plan = acl_swiglu.SwigluGroupQuantGradPlan(*d, stream=stream)
    plan()
    out["plan_ok"] = bool(np.array_equal(plan.grad_x.to_numpy().view(np.uint32),
                                         device_model.swiglu_group_quant_grad_model(gy, x)[0].view(np.uint32)))
    out["live_before_exit"] = emulator.live_counts()
    if not leave_for_exit:
        plan.close()
        for a in d:
            a.close()
        stream.close()
        acl_swiglu.release_cached()
        out["live_at_end"] = emulator.live_counts()
""")


def run_child(tmp_path, fault_plan: str, leave: bool):
    env = dict(os.environ, ACL_SWIGLU_BACKEND="emulator", ACL_EMU_LEAK_CHECK="1")
    if fault_plan:
        env["ACL_EMU_FAIL"] = fault_plan
    env.pop("ACL_SWIGLU_ABI", None)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.run([sys.executable, str(script), os.path.dirname(__file__), "leave" if leave else "close"],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert len(lines) == 1, (proc.stdout[-2000:], proc.stderr[-2000:])
    result = json.loads(lines[0][len("RESULT "):])
    assert result["second_ok"] is True and result["plan_ok"] is True, result
    assert result["live_before_exit"]["executor"] == 1, result
    return result, proc.stderr


PROCESS_FAULTS: List[Tuple[str, int, int, str]] = []   # (api, N, code, outcome) for the summary
NO_LEAKS_AT_FINALIZE = "leak check at aclFinalize: no live handles"


@pytest.mark.parametrize("api,code", [("aclInit", 500000), ("aclrtSetDevice", 107001)])
def test_process_first_use_fault(tmp_path, api, code):
    """aclInit (once per process) and the main thread's aclrtSetDevice fail at first use: the
    error surfaces, nothing is half-initialised, the next call initialises and works, and the
    process ends with nothing live."""
    n = 1
    while n <= 5:
        result, stderr = run_child(tmp_path, f"{api}:{n}:{code}", leave=False)
        assert not any(result["live_at_end"].values()), result
        assert NO_LEAKS_AT_FINALIZE in stderr, stderr[-2000:]
        if result["fired_after_first"] == 0:
            assert result["first"] == "ok"
            break
        name, got_code, got_api, message = result["first"]
        assert name == errors.error_class(code).__name__ and got_code == code and got_api == api, result
        assert "injected fault" in message
        PROCESS_FAULTS.append((api, n, code, "surfaced"))
        n += 1
    assert n == 2, f"{api} was called {n - 1} times at first use; expected exactly once"


@pytest.mark.parametrize("api,code", [("aclrtResetDevice", 507000), ("aclFinalize", 500000)])
def test_process_exit_fault_is_swallowed(tmp_path, api, code):
    """At interpreter exit the package resets the device and finalises; a failure there is
    swallowed (exit must finish): exit code 0, nothing printed as an error."""
    n = 1
    while n <= 5:
        result, stderr = run_child(tmp_path, f"{api}:{n}:{code}", leave=True)
        assert result["first"] == "ok"
        if result["fired_at_exit"] == 0:
            break
        assert result["fired_at_exit"] == 1
        assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr[-2000:]
        if api == "aclrtResetDevice":
            assert "leak check at aclFinalize" in stderr, stderr[-2000:]   # aclFinalize still ran
        else:
            assert "leak check" not in stderr   # the faulted aclFinalize did nothing
        PROCESS_FAULTS.append((api, n, code, "swallowed at exit"))
        n += 1
    assert n == 2, f"{api} was called {n - 1} times at exit; expected exactly once"


def test_exit_releases_owned_handles_before_finalize(tmp_path):
    """runtime.py: owned objects are freed "at interpreter exit (before aclFinalize)". A plan,
    its arrays, a stream and the cached one-shot stream left alive at exit must be released by
    the package's exit handler before it calls aclFinalize (ACL_EMU_LEAK_CHECK=1 reports them)."""
    result, stderr = run_child(tmp_path, "", leave=True)
    assert result["fired_at_exit"] == 0
    assert NO_LEAKS_AT_FINALIZE in stderr, (
        "handles still live at aclFinalize: the exit handler's finalizer calls did nothing "
        "(weakref.finalize's own atexit hook ran first and disabled them):\n" + stderr[-1500:])


# ----------------------------------------------------------------------------- summary


def _summary_lines() -> List[str]:
    distinct = sum(r.distinct for r in RECORDS.values())
    injections = sum(r.injections for r in RECORDS.values())
    apis = sorted({api for r in RECORDS.values() for api in r.fired} | {p[0] for p in PROCESS_FAULTS})
    cleanup = sum(r.injections for r in CLEANUP_RECORDS.values())
    runs = sum(r.runs for r in RECORDS.values()) + sum(r.runs for r in CLEANUP_RECORDS.values())
    lines = [f"fault injection summary: {len(RECORDS)} scenarios, {distinct} distinct (scenario, api, N) single faults "
             f"fired ({injections} injections counting each phase code), {len(apis)} APIs: {', '.join(apis)}",
             f"  distinct (api, N) pairs over all scenarios: {len({(a, n) for r in RECORDS.values() for a, m in r.fired.items() for n in range(1, m + 1)})}",
             f"  double faults (primary + cleanup during unwinding): {cleanup} in {len(CLEANUP_RECORDS)} scenarios",
             f"  process-level faults (subprocesses): {len(PROCESS_FAULTS)} {sorted({p[0] for p in PROCESS_FAULTS})}",
             f"  total operations run: {runs}",
             f"  surfaced as the injected error: {sum(len(r.surfaced) for r in RECORDS.values())}; swallowed on purpose "
             f"(operation succeeded, right bits): {sum(len(r.swallowed) for r in RECORDS.values())} in "
             f"{sorted({a for r in RECORDS.values() for a, _, _ in r.swallowed})}; handles left live by a failed "
             f"destroy and released by the test: {sum(len(r.leaked_then_recovered) for r in RECORDS.values())}",
             f"  never called by the binding: {sorted(NEVER_CALLED)}; not injectable: {sorted(NOT_INJECTABLE)}"]
    for name, r in RECORDS.items():
        lines.append(f"  {name}: {r.distinct} faults ({r.injections} injections) over {len(r.fired)} APIs "
                     + ", ".join(f"{a} x{n}" for a, n in r.fired.items()))
    return lines


@pytest.fixture(scope="module", autouse=True)
def print_fault_summary(request):
    yield
    if not RECORDS and not PROCESS_FAULTS:
        return
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print("\n" + "\n".join(_summary_lines()))


def test_fault_summary(monkeypatch, record_property):
    """Every declared function was either made to fail or is known not to be called /
    injectable / process-level; prints the totals (also kept as a test property)."""
    for name in SCENARIOS:   # scenarios not run (e.g. with -k) are explored here
        run_exploration(name, monkeypatch)
    fired = {api for r in RECORDS.values() for api in r.fired}
    accounted = fired | NEVER_CALLED | NOT_INJECTABLE | PROCESS_LEVEL | DEVICE_QUERY
    assert set(DECLARED_APIS) <= accounted, set(DECLARED_APIS) - accounted
    assert not (fired & NEVER_CALLED), fired & NEVER_CALLED
    distinct = sum(r.distinct for r in RECORDS.values())
    record_property("distinct_faults", distinct)
    print("\n".join(_summary_lines()))
    assert distinct >= 300
