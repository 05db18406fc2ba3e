"""aclnnSwigluGroupQuantGrad: the two phases, a one-shot NumPy call, a device-level call and a
reusable plan for hot loops."""

from __future__ import annotations

import ctypes
import math
import os
import re
import threading
from threading import get_ident as _get_ident
from contextlib import ExitStack
from typing import Optional, Sequence, Tuple

import numpy as np

from . import _ffi
from ._loader import abi_revision
from ._validate import Problem, validate
from .errors import ArgumentError, HandleClosedError, HostMemoryError
from ._scratch import CallScratch, check
from .runtime import (DeviceArray, DeviceBuffer, Owned, Stream, _closes, default_stream, in_forked_child,
                      runtime_api)
from .tensor import AclIntArray, AclTensor, tensor_for

INPUT_SLOTS = ("grad_y", "x", "weight", "y_origin", "group_index")   # aclSetInputTensorAddr indexes
# The operator's parameter names, as CANN messages use them, and the Python argument of each.
C_PARAMETERS = {"gradY": "grad_y", "weightOptional": "weight", "yOriginOptional": "y_origin",
                "groupIndexOptional": "group_index", "clampLimit": "clamp_limit", "gradXOut": "grad_x",
                "gradWeightOutOptional": "grad_weight"}
_C_PARAMETER = re.compile(r"\b(" + "|".join(C_PARAMETERS) + r")\b")


def describe_arguments(message: str) -> str:
    """'gradXOut is grad_x, ...' for the operator parameters a CANN message names."""
    seen = dict.fromkeys(_C_PARAMETER.findall(message))
    return ", ".join(f"{name} is the {C_PARAMETERS[name]} argument" for name in seen)


def op_check(api, status: int, name: str) -> None:
    """Raises for a failed operator call, saying which Python arguments its message means."""
    if status != 0:
        _ffi.raise_status(status, name, api.get_message, describe_arguments)


class _HotLaunch(ctypes.Structure):
    """One plan call for native/src/hotpath/hotpath.c: what to call and with what."""

    _fields_ = [("launch", ctypes.c_void_p), ("synchronize", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_size", ctypes.c_uint64), ("executor", ctypes.c_void_p), ("stream", ctypes.c_void_p)]


_HOTPATH_LIBRARY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native", "libaclswiglu_hotpath.so")
_hotpath_function = []


def _hotpath():
    """acl_swiglu_hot_launch from the package's small C helper, or None (then plans make the
    two calls from Python)."""
    if not _hotpath_function:
        function = None
        if os.path.isfile(_HOTPATH_LIBRARY):
            try:
                function = ctypes.CDLL(_HOTPATH_LIBRARY).acl_swiglu_hot_launch
                function.restype = ctypes.c_int32
            except (OSError, AttributeError):
                function = None
        _hotpath_function.append(function)
    return _hotpath_function[0]


def _stream_argument(stream) -> Stream:
    """The stream to use: the default one for None; a TypeError or HandleClosedError otherwise."""
    if stream is None:
        return default_stream()
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an acl_swiglu.Stream or None, got {type(stream).__name__} (wrap a "
                        "foreign aclrtStream with acl_swiglu.Stream.from_handle)")
    stream.check_open("stream")
    return stream
OUTPUT_SLOTS = ("grad_x", "grad_weight")                              # aclSetOutputTensorAddr indexes
_SLOT_ORDER = ("grad_y", "x", "weight", "y_origin", "group_index", "grad_x", "grad_weight")
_CALL_ORDER = ("grad_y", "x", "weight", "y_origin", "group_index")   # positional arguments of a plan call
_SYNC_OFF, _SYNC_ON = ctypes.c_int32(0), ctypes.c_int32(1)
PHASE2 = "aclnnSwigluGroupQuantGrad"


class Executor(Owned):
    """The aclOpExecutor phase 1 returned, with the handles it was made from.

    Single-use unless made repeatable: ``launch`` consumes a single-use one (CANN frees it),
    a repeatable one lives until close().
    """

    _kind = "Executor"

    def __init__(self, handle, workspace_size: int, problem: Problem, keep_alive: Sequence[object],
                 arrays: Optional[dict] = None):
        super().__init__()
        self.workspace_size = int(workspace_size)
        self.problem = problem
        self.repeatable = False
        self.launches = 0
        self._keep_alive = list(keep_alive)   # tensors must outlive the executor
        self._arrays = dict(arrays or {})      # checked at launch: closed memory must not be used
        handle = ctypes.cast(handle, _ffi.aclOpExecutor_p)
        raw_destroy = runtime_api().raw.aclDestroyAclOpExecutor
        self._own(handle, lambda handle=handle: raw_destroy(handle))

    def make_repeatable(self) -> None:
        """aclSetAclOpExecutorRepeatable: keep the executor for many launches."""
        self.check_open()
        runtime_api().aclSetAclOpExecutorRepeatable(self)
        self.repeatable = True

    def launch(self, stream: Optional[Stream] = None, workspace=None) -> None:
        """Phase 2 on `stream` (default stream if None). The work runs asynchronously: wait
        with stream.synchronize() (DeviceArray.to_numpy does it for its writer)."""
        self.check_open("this Executor (a single-use executor is consumed by its launch)")
        stream = _stream_argument(stream)
        handle = self._as_parameter_
        _check_open(**self._arrays)
        api = runtime_api()
        if workspace is not None:
            if not isinstance(workspace, DeviceBuffer):
                raise TypeError(f"workspace must be an acl_swiglu.DeviceBuffer or None, got {type(workspace).__name__}")
            workspace.check_open("workspace")
            if self.workspace_size and workspace.nbytes < self.workspace_size:
                raise ArgumentError(f"workspace has {workspace.nbytes} bytes; phase 1 asked for {self.workspace_size}")
            self._launch_now(api, handle, workspace.ptr if self.workspace_size else None, stream)
        else:
            stream.run_with_workspace(
                self.workspace_size, lambda ptr: self._launch_now(api, handle, ptr, stream))

    def _launch_now(self, api, handle, workspace_ptr, stream) -> None:
        status = api.raw.aclnnSwigluGroupQuantGrad(workspace_ptr, self.workspace_size, handle, stream)
        self.launches += 1
        if not self.repeatable:
            # CANN consumed it, failed or not: never destroy it ourselves.
            self._disown()
            self._keep_alive = []
            self._arrays = {}
        op_check(api, status, PHASE2)


def get_workspace_size(grad_y: DeviceArray, x: DeviceArray, weight: Optional[DeviceArray] = None,
                       y_origin: Optional[DeviceArray] = None, group_index=None, clamp_limit=None, *,
                       grad_x: DeviceArray, grad_weight: Optional[DeviceArray] = None) -> Executor:
    """Phase 1 (aclnnSwigluGroupQuantGradGetWorkspaceSize) on device arrays: validates, and
    returns the Executor (``.workspace_size`` bytes of workspace needed, ``.launch()`` is phase 2).
    Revision 1 takes group_index as host ints; revision 2 as an int64 DeviceArray."""
    abi = abi_revision()
    problem = validate(grad_y, x, weight, y_origin, group_index, clamp_limit, abi=abi, array_types=(DeviceArray,),
                       array_text="a DeviceArray", group_host=abi == 1, grad_x=grad_x, grad_weight=grad_weight,
                       check_outputs=True)
    if grad_x is None:
        raise ArgumentError("grad_x is required: phase 1 needs the output tensor")
    if weight is not None and grad_weight is None:
        raise ArgumentError("grad_weight is required when weight is given")
    _check_open(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin, grad_x=grad_x, grad_weight=grad_weight,
                group_index=group_index if abi == 2 else None)
    with ExitStack() as stack:
        group = _group_argument(problem, group_index, stack)
        executor = _phase1(problem, tensor_for(grad_y), tensor_for(x), tensor_for(weight), tensor_for(y_origin),
                           group, tensor_for(grad_x), tensor_for(grad_weight))
    executor._arrays = {name: a for name, a in (("grad_y", grad_y), ("x", x), ("weight", weight),
                                                ("y_origin", y_origin), ("grad_x", grad_x),
                                                ("grad_weight", grad_weight),
                                                ("group_index", group_index if abi == 2 else None))
                        if a is not None}
    return executor


def _check_open(**arrays) -> None:
    for name, array in arrays.items():
        if array is not None and array.closed:
            raise HandleClosedError(f"{name} is a closed DeviceArray; its device memory was freed")


def _check_all_open(grad_y, x, weight, y_origin, group_index, grad_x, grad_weight) -> None:
    """_check_open for the operator's arguments, without building a dict on the common path."""
    for array in (grad_y, x, weight, y_origin, group_index, grad_x, grad_weight):
        if array is not None and array.closed:
            _check_open(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin, group_index=group_index,
                        grad_x=grad_x, grad_weight=grad_weight)


def _native(array):
    """A NumPy array in native byte order (a converted copy when it is not)."""
    if isinstance(array, np.ndarray) and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _group_argument(problem: Problem, group_index, stack: ExitStack):
    """groupIndex as the current revision takes it: an int64 tensor or (revision 1) int array."""
    if group_index is None:
        return None
    if problem.abi == 1:
        # Revision 1 reads the values at phase 1; the array can go right after.
        return stack.enter_context(AclIntArray(np.asarray(group_index, dtype=np.int64)))
    return tensor_for(group_index)


def _phase1(problem: Problem, gy, x, weight, y_origin, group, grad_x, grad_weight) -> Executor:
    api = runtime_api()
    handle, size = _phase1_call(api, problem, gy, x, weight, y_origin, group, grad_x, grad_weight)
    keep = [t for t in (gy, x, weight, y_origin, grad_x, grad_weight) if t is not None]
    if problem.abi == 2 and group is not None:
        keep.append(group)
    return Executor(handle, size, problem, keep)


# ---- one-shot NumPy call ----

_thread_state = threading.local()
_thread_streams_lock = threading.Lock()
_thread_streams: "list[Stream]" = []


def _reset_after_fork() -> None:
    global _thread_streams_lock, _thread_state, _get_ident
    _thread_streams_lock = threading.Lock()   # another thread may have held it at the fork
    _thread_state = threading.local()
    _thread_streams.clear()
    # The forking thread keeps its identity in the child: make every plan call go through
    # runtime_api() again, which refuses ACL use in a forked child.
    _get_ident = _no_thread_identity


def _no_thread_identity() -> object:
    return object()   # equal to no stored identity


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _thread_stream() -> Stream:
    """A private stream per thread for one-shot calls, so threads do not wait on each other."""
    stream = getattr(_thread_state, "stream", None)
    if stream is None or stream.closed:
        stream = _thread_state.stream = Stream()
        with _thread_streams_lock:
            _thread_streams[:] = [s for s in _thread_streams if not s.closed]
            _thread_streams.append(stream)
    return stream


def release_cached() -> None:
    """Destroys the per-thread streams of one-shot calls and frees every cached workspace
    (they are made again on demand). Call it when no call is in flight, e.g. between tests."""
    if in_forked_child():
        return   # the parent's device resources are not this process's to free
    with _thread_streams_lock:
        streams, _thread_streams[:] = list(_thread_streams), []
    for stream in streams:
        stream.close()
    default_stream().release_workspace()


def _quiet_synchronize(stream: Stream) -> None:
    try:
        stream.synchronize()
    except Exception:   # the original error is what the caller needs to see
        pass


def swiglu_group_quant_grad(grad_y: np.ndarray, x: np.ndarray, weight: Optional[np.ndarray] = None,
                            y_origin: Optional[np.ndarray] = None, group_index: Optional[np.ndarray] = None,
                            clamp_limit: Optional[float] = None) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """SwiGLU backward on NumPy arrays: copies to the device, runs both phases, copies back.

    grad_y [..., H], x [..., 2H] (float32, float16 or ml_dtypes.bfloat16, 1-8 dims), weight
    (float32, T = prod(leading dims) elements) with y_origin (grad_y's shape and dtype),
    group_index (int64 [G] token counts: only the first min(sum, T) rows are computed, the
    rest are zero), clamp_limit None (off) or > 0. Returns fresh arrays (grad_x like x,
    grad_weight like weight or None). Inputs are never modified.
    """
    abi = abi_revision()
    grad_y, x, weight, y_origin, group_index = map(_native, (grad_y, x, weight, y_origin, group_index))
    problem = validate(grad_y, x, weight, y_origin, group_index, clamp_limit, abi=abi, array_types=(np.ndarray,),
                       array_text="a numpy.ndarray", group_host=False)
    try:
        grad_x = np.empty(problem.x_shape, problem.dtype)
        grad_weight = np.empty(problem.weight_shape, np.float32) if weight is not None else None
    except MemoryError:
        raise HostMemoryError(f"x has shape {problem.x_shape}: the result grad_x needs "
                              f"{math.prod(problem.x_shape) * problem.dtype.itemsize} bytes, more than this "
                              "host can allocate") from None
    stream = _thread_stream()
    api = runtime_api()
    with CallScratch(api) as scratch:
        inputs = [scratch.stage_input(a) if a is not None else None
                  for a in (grad_y, x, weight, y_origin, group_index if abi == 2 else None)]
        out_x = scratch.stage_output(grad_x)
        out_w = scratch.stage_output(grad_weight) if grad_weight is not None else None
        scratch.allocate()
        t_gy, t_x, t_w, t_yo, group = [scratch.upload(s) if s is not None else None for s in inputs]
        if abi == 1 and group_index is not None:
            group = scratch.int_array(group_index)
        t_gx = scratch.tensor_for(out_x)
        t_gw = scratch.tensor_for(out_w) if out_w is not None else None
        executor, size = _phase1_call(api, problem, t_gy, t_x, t_w, t_yo, group, t_gx, t_gw)
        scratch.drain = stream._as_parameter_
        _launch_single_use(api, executor, size, stream)
        check(api, api.raw.aclrtSynchronizeStream(stream._as_parameter_), "aclrtSynchronizeStream")
        scratch.download(out_x)
        if out_w is not None:
            scratch.download(out_w)
    return grad_x, grad_weight


def _phase1_call(api, problem: Problem, gy, x, weight, y_origin, group, grad_x, grad_weight):
    """Phase 1 on native handles: (executor as a c_void_p, workspace size). Each handle is an
    AclTensor / AclIntArray (its cached address), a raw handle, or None. The call goes through
    the unprototyped function with ready ctypes arguments: no per-argument conversions."""
    size = ctypes.c_uint64()
    executor = ctypes.c_void_p()
    handles = [getattr(h, "address", h) for h in (gy, x, weight, y_origin, group, grad_x, grad_weight)]
    status = api.hot.aclnnSwigluGroupQuantGradGetWorkspaceSize(
        *handles[:5], ctypes.c_double(problem.clamp_c_value), *handles[5:], ctypes.byref(size), ctypes.byref(executor))
    if status:
        op_check(api, status, _ffi.OPERATOR_PHASE1)
    return executor, size.value


def _launch_single_use(api, executor: ctypes.c_void_p, workspace_size: int, stream: Stream) -> None:
    """Phase 2 of a single-use executor (consumed either way) with the stream's workspace."""
    launch, size, stream_address = api.hot.aclnnSwigluGroupQuantGrad, ctypes.c_uint64(workspace_size), stream._address
    launched = []

    def run(ptr):
        launched.append(True)
        return launch(ctypes.c_void_p(ptr), size, executor, stream_address)

    try:
        status = stream.run_with_workspace(workspace_size, run)
    except BaseException:
        if not launched:   # the workspace could not be had: the executor was never handed over
            api.raw.aclDestroyAclOpExecutor(ctypes.cast(executor, _ffi.aclOpExecutor_p))
        raise
    op_check(api, status, PHASE2)


# ---- device-level call ----


def swiglu_group_quant_grad_device(grad_y: DeviceArray, x: DeviceArray, weight: Optional[DeviceArray] = None,
                                   y_origin: Optional[DeviceArray] = None, group_index=None, clamp_limit=None, *,
                                   grad_x: Optional[DeviceArray] = None, grad_weight: Optional[DeviceArray] = None,
                                   stream: Optional[Stream] = None) -> Tuple[DeviceArray, Optional[DeviceArray]]:
    """Both phases on device arrays, queued on `stream` (default stream if None); returns
    (grad_x, grad_weight), allocated when not given. Does not wait: synchronise the stream, or
    call to_numpy() on an output (which waits for it)."""
    abi = abi_revision()
    problem = validate(grad_y, x, weight, y_origin, group_index, clamp_limit, abi=abi, array_types=(DeviceArray,),
                       array_text="a DeviceArray", group_host=abi == 1, grad_x=grad_x, grad_weight=grad_weight,
                       check_outputs=True)
    _check_all_open(grad_y, x, weight, y_origin, group_index if abi == 2 else None, grad_x, grad_weight)
    stream = _stream_argument(stream)
    made = []
    try:
        if grad_x is None:
            grad_x = DeviceArray.empty(problem.x_shape, problem.dtype)
            made.append(grad_x)
        if weight is not None and grad_weight is None:
            grad_weight = DeviceArray.empty(problem.weight_shape, np.float32)
            made.append(grad_weight)
        api = runtime_api()
        with ExitStack() as stack:
            group = _group_argument(problem, group_index, stack)
            executor, size = _phase1_call(api, problem, tensor_for(grad_y), tensor_for(x), tensor_for(weight),
                                          tensor_for(y_origin), group, tensor_for(grad_x), tensor_for(grad_weight))
            _launch_single_use(api, executor, size, stream)
    except BaseException:
        for array in made:
            array.close()
        raise
    grad_x.pending = stream
    if grad_weight is not None:
        grad_weight.pending = stream
    return grad_x, grad_weight


# ---- plan ----


class SwigluGroupQuantGradPlan:
    """A repeatable executor for fixed shapes, dtypes and options, for hot loops.

    Built once from device arrays (their layouts are the plan's; their addresses the first
    binding). Each call rebinds only the addresses that changed (aclSetInputTensorAddr /
    aclSetOutputTensorAddr on the plan's own tensor handles) and launches phase 2 on the plan's
    stream. Calls are serialised by a lock, so one plan may be shared between threads.
    """

    def __init__(self, grad_y: DeviceArray, x: DeviceArray, weight: Optional[DeviceArray] = None,
                 y_origin: Optional[DeviceArray] = None, group_index=None, clamp_limit=None, *,
                 grad_x: Optional[DeviceArray] = None, grad_weight: Optional[DeviceArray] = None,
                 stream: Optional[Stream] = None):
        abi = abi_revision()
        self.problem = validate(grad_y, x, weight, y_origin, group_index, clamp_limit, abi=abi,
                                array_types=(DeviceArray,), array_text="a DeviceArray", group_host=abi == 1,
                                grad_x=grad_x, grad_weight=grad_weight, check_outputs=True)
        _check_open(grad_y=grad_y, x=x, weight=weight, y_origin=y_origin, grad_x=grad_x, grad_weight=grad_weight,
                    group_index=group_index if abi == 2 else None)
        self.stream = _stream_argument(stream)
        self._lock = threading.Lock()
        self._closed = False
        self._owned_outputs = []
        self._tensors = {}
        self._executor: Optional[Executor] = None
        self._workspace: Optional[DeviceBuffer] = None
        self._workspace_ptr = None
        self._workspace_size = 0
        self._launch = None
        self._hot_call = None
        self._last_thread = None
        try:
            if grad_x is None:
                grad_x = DeviceArray.empty(self.problem.x_shape, self.problem.dtype)
                self._owned_outputs.append(grad_x)
            if weight is not None and grad_weight is None:
                grad_weight = DeviceArray.empty(self.problem.weight_shape, np.float32)
                self._owned_outputs.append(grad_weight)
            self._arrays = {"grad_y": grad_y, "x": x, "weight": weight, "y_origin": y_origin,
                            "group_index": group_index if abi == 2 else None,
                            "grad_x": grad_x, "grad_weight": grad_weight}
            self._layouts = {name: a.layout() for name, a in self._arrays.items() if a is not None}
            self._bound = {name: a.ptr for name, a in self._arrays.items() if a is not None}
            # The plan's own handles: rebinding writes into them, so they are not shared.
            self._tensors = {name: AclTensor(a) for name, a in self._arrays.items() if a is not None}
            self._setters = self._address_setters()
            self._group_values = (tuple(int(v) for v in np.asarray(group_index, dtype=np.int64))
                                  if abi == 1 and group_index is not None else None)
            self._executor = self._build_executor(self._group_values)
            # The plan's own workspace: no pool lock on the hot path, never swapped under it.
            self._workspace_size = self._executor.workspace_size
            if self._workspace_size:
                self._workspace = DeviceBuffer(self._workspace_size)
                self._workspace_ptr = self._workspace.ptr
            hot = runtime_api().hot
            self._launch = hot.aclnnSwigluGroupQuantGrad
            self._synchronize = hot.aclrtSynchronizeStream
            self._set_launch_args()
            self._outputs = (self._arrays["grad_x"], self._arrays["grad_weight"])
            self._checked_at = -1
        except BaseException:
            self.close()
            raise

    def _address_setters(self) -> dict:
        """For each bindable argument: its setter, slot index, tensor and API name, as ctypes wants them."""
        hot = runtime_api().hot
        setters = {}
        for name, tensor in self._tensors.items():
            output = name in OUTPUT_SLOTS
            setters[name] = (hot.aclSetOutputTensorAddr if output else hot.aclSetInputTensorAddr,
                             ctypes.c_size_t((OUTPUT_SLOTS if output else INPUT_SLOTS).index(name)),
                             ctypes.cast(tensor._as_parameter_, ctypes.c_void_p),
                             "aclSetOutputTensorAddr" if output else "aclSetInputTensorAddr")
        return setters

    def _build_executor(self, group_values=None) -> Executor:
        """A repeatable executor over the plan's tensors (revision 1: with these group counts)."""
        t = self._tensors
        with ExitStack() as stack:
            group = (stack.enter_context(AclIntArray(group_values)) if group_values is not None
                     else t.get("group_index"))
            executor = _phase1(self.problem, t["grad_y"], t["x"], t.get("weight"), t.get("y_origin"), group,
                               t["grad_x"], t.get("grad_weight"))
        try:
            executor.make_repeatable()
        except BaseException:
            executor.close()
            raise
        return executor

    def _set_launch_args(self) -> None:
        self._launch_args = (ctypes.c_void_p(self._workspace_ptr), ctypes.c_uint64(self._workspace_size),
                             ctypes.cast(self._executor._as_parameter_, ctypes.c_void_p), self.stream._address)
        hot = _hotpath()
        if hot is not None:
            self._hot_struct = _HotLaunch(ctypes.cast(self._launch, ctypes.c_void_p).value,
                                          ctypes.cast(self._synchronize, ctypes.c_void_p).value,
                                          self._workspace_ptr, self._workspace_size, self._launch_args[2].value,
                                          self.stream._address.value)
            self._hot_arguments = ctypes.byref(self._hot_struct)
            self._hot_failed = ctypes.byref(ctypes.c_int32())
            self._hot_call = hot

    @property
    def grad_x(self) -> DeviceArray:
        return self._arrays["grad_x"]

    @property
    def grad_weight(self) -> Optional[DeviceArray]:
        return self._arrays["grad_weight"]

    @property
    def workspace_size(self) -> int:
        return self._executor.workspace_size if self._executor is not None else 0

    def __call__(self, *arrays: DeviceArray, synchronize: bool = False, **named: DeviceArray
                 ) -> Tuple[DeviceArray, Optional[DeviceArray]]:
        """plan(grad_y=None, x=None, weight=None, y_origin=None, group_index=None, *, grad_x=None,
        grad_weight=None, synchronize=False): launches phase 2 with the given arrays rebound
        (others keep their last binding) and returns the bound (grad_x, grad_weight). The work
        is queued on the plan's stream; with synchronize=True the call also waits for it (one
        call instead of two on the hot path)."""
        if arrays or named:
            return self._rebind_and_launch(arrays, named, synchronize)
        ident = _get_ident()
        if ident != self._last_thread:
            runtime_api()   # a thread's first call: bind it to the device
            self._last_thread = ident
        lock = self._lock
        lock.acquire()
        try:
            # The hot path needs the C helper and nothing closed since the last check (close()
            # clears _hot_call, so a closed plan never takes it).
            hot = self._hot_call
            if hot is not None and self._checked_at == _closes[0]:
                status = hot(self._hot_arguments, _SYNC_ON if synchronize else _SYNC_OFF, self._hot_failed)
                if status:
                    self._raise_launch_failure(status, self._hot_failed._obj.value == 1)
                outputs = self._outputs
                if not synchronize:
                    self._mark_pending(outputs)
                return outputs
            if self._closed:
                raise HandleClosedError("this SwigluGroupQuantGradPlan was closed")
            return self._launch_locked(synchronize)
        finally:
            lock.release()

    def _mark_pending(self, outputs) -> None:
        stream = self.stream
        for array in outputs:
            if array is not None:
                array.pending = stream

    def _rebind_and_launch(self, arrays, named, synchronize: bool):
        if len(arrays) > len(_CALL_ORDER):
            raise TypeError(f"a plan takes at most {len(_CALL_ORDER)} positional arrays ({', '.join(_CALL_ORDER)}), "
                            f"got {len(arrays)}")
        for name in named:
            if name not in _SLOT_ORDER:
                raise TypeError(f"a plan takes no argument {name!r}; it takes {', '.join(_SLOT_ORDER)} and "
                                "synchronize")
            if name in _CALL_ORDER[:len(arrays)]:
                raise TypeError(f"{name} given twice")
        api = runtime_api()
        with self._lock:
            if self._closed:
                raise HandleClosedError("this SwigluGroupQuantGradPlan was closed")
            counts = None
            for name, array in (*zip(_CALL_ORDER, arrays), *named.items()):
                if array is None:
                    continue
                if name == "group_index" and self.problem.abi == 1:
                    counts = array   # host counts, read at phase 1: after every address is rebound
                else:
                    self._rebind(api, name, array)
            if counts is not None:
                self._regroup(counts)
            return self._launch_locked(synchronize)

    def _launch_locked(self, synchronize: bool):
        """Phase 2 (and the synchronisation if asked); the plan's lock is held."""
        if self._checked_at != _closes[0]:
            # Something was closed since the last check: every bound array, and the stream,
            # must still own its memory.
            _check_open(**self._arrays)
            self.stream.check_open("stream")
            self._checked_at = _closes[0]
        hot = self._hot_call
        if hot is not None:
            status = hot(self._hot_arguments, _SYNC_ON if synchronize else _SYNC_OFF, self._hot_failed)
            if status:
                self._raise_launch_failure(status, self._hot_failed._obj.value == 1)
        else:
            status = self._launch(*self._launch_args)
            if status:
                self._raise_launch_failure(status, True)
            if synchronize:
                status = self._synchronize(self._launch_args[3])
                if status:
                    self._raise_launch_failure(status, False)
        outputs = self._outputs
        if not synchronize:
            self._mark_pending(outputs)
        return outputs

    @staticmethod
    def _raise_launch_failure(status: int, in_phase2: bool) -> None:
        api = runtime_api()
        if in_phase2:
            op_check(api, status, PHASE2)
        _ffi.raise_status(status, "aclrtSynchronizeStream", api.get_message)

    def _rebind(self, api, name: str, array: DeviceArray) -> None:
        layout = self._layouts.get(name)
        if layout is None:
            raise ArgumentError(f"the plan was built without {name}; build another plan to use it")
        if not isinstance(array, DeviceArray):
            raise TypeError(f"{name} must be a DeviceArray, got {type(array).__name__}")
        if array.closed:
            raise HandleClosedError(f"{name} is a closed DeviceArray")
        if array.layout() != layout:
            raise ArgumentError(f"{name} has layout (shape, dtype, strides, offset) {array.layout()}; the plan was "
                                f"built for {layout}")
        ptr = array.ptr
        if ptr != self._bound[name]:
            set_address, index, tensor, api_name = self._setters[name]
            status = set_address(self._launch_args[2], index, tensor, ctypes.c_void_p(ptr))
            if status:
                op_check(api, status, api_name)
            self._bound[name] = ptr
        self._arrays[name] = array
        if name in OUTPUT_SLOTS:
            self._outputs = (self._arrays["grad_x"], self._arrays["grad_weight"])

    def _regroup(self, group_index) -> None:
        values = np.asarray(group_index)
        if values.ndim != 1 or (values.size and not np.issubdtype(values.dtype, np.integer)):
            raise ArgumentError(f"group_index must be 1-D integers, got {values.dtype} {values.shape}")
        values = tuple(int(v) for v in values.astype(np.int64))
        if self._group_values is None:
            raise ArgumentError("the plan was built without group_index; build another plan to use it")
        if values != self._group_values:
            # Revision 1 reads the counts at phase 1: new counts need a new executor. The plan
            # switches to it only once it exists, so a failure leaves the old one in use.
            executor = self._build_executor(values)
            if executor.workspace_size > self._workspace_size:
                executor.close()
                raise ArgumentError("the new group counts need a larger workspace; build another plan")
            old, self._executor, self._group_values = self._executor, executor, values
            self._set_launch_args()
            old.close()

    def close(self) -> None:
        """Destroys the executor and the plan's tensors, and frees outputs the plan allocated."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._hot_call = None
            try:
                # Queued launches still use the executor and the outputs; a closed stream has
                # already completed them.
                if self._executor is not None and not self.stream.closed:
                    self.stream.synchronize()
            finally:
                if self._executor is not None:
                    self._executor.close()
                for tensor in self._tensors.values():
                    tensor.close()
                for array in self._owned_outputs:
                    array.close()
                if self._workspace is not None:
                    self._workspace.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return
        try:
            self.close()   # everything is released either way
        except Exception:  # the error already propagating is the one that matters
            pass
