"""A reusable plan of any described aclnn operator: one repeatable executor for fixed layouts,
addresses rebound per call, phase 2 (and the stream synchronisation) from a small C helper, which
also makes a call with nothing to rebind whole.

Lifetimes: the plan pins the arrays it is bound to, so a closed one stays allocated until the
plan lets go of it (a rebinding, or close()) and the plan's stream has passed the work; any
call that overlaps a close() fails. Everything the plan owns is freed after its stream has
passed the work queued with it, also when the plan is garbage-collected.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from contextlib import ExitStack
from threading import get_ident as _get_ident
from types import TracebackType
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type, TypeVar

import numpy as np

from . import _ffi
from ._aclnn import Executor, Operator, check_open, note_write, start_reading, stop_reading, stream_argument
from ._lean import status_of
from ._device import DeviceArray, DeviceBuffer, Stream
from ._scratch import helper_library
from .errors import ArgumentError, HandleClosedError
from .runtime import Life, at_fork_in_child, close_epoch, in_forked_child, pin, repin, runtime_api, unpin, used_on
from .tensor import AclIntArray, AclTensor


class _HotPlan(ctypes.Structure):
    """A plan's state shared with libaclswiglu_hotpath.so (its hot_plan struct): what to launch,
    and what a call with nothing to rebind checks there before it launches."""

    _fields_ = [("launch", ctypes.c_void_p), ("synchronize", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_size", ctypes.c_uint64), ("executor", ctypes.c_void_p), ("stream", ctypes.c_void_p),
                ("close_epoch", ctypes.c_void_p), ("checked_at", ctypes.c_int64), ("thread", ctypes.c_uint64),
                ("generation", ctypes.c_int32), ("owner", ctypes.c_uint64)]


# What a call's result says in its upper 32 bits (the lower 32: a failed call's status).
_LAUNCH_FAILED, _SYNC_FAILED, _BUSY, _CHECK, _OVERLAP = 1, 2, 3, 4, 5
_MUST_CHECK = _CHECK << 32


class _HotPath(NamedTuple):
    """The C helper's plan functions (ctypes functions taking a pointer to a _HotPlan)."""

    calls: Tuple[Any, Any]   # (launch, launch + synchronize)(plan, generation): one crossing
    claim: Any
    release: Any
    launch_owned: Any        # (plan, synchronize): for the call that owns the plan
    thread: Any              # () -> the calling thread's number (never reused, unlike its identity)


_hotpath_function: List[Optional[_HotPath]] = []


def _hotpath() -> Optional[_HotPath]:
    """The plan functions of the package's small C helper, or None (then plans make their ACL
    calls from Python, each call under the plan's lock)."""
    if not _hotpath_function:
        functions: Optional[_HotPath] = None
        library = helper_library()
        if library is not None:
            try:
                calls = (library.acl_swiglu_hot_launch, library.acl_swiglu_hot_launch_synchronize)
                for function in calls:
                    # No prototype, as for every hot call: (a byref, an int that fits a C int)
                    # cost half as much to pass without one.
                    function.restype = ctypes.c_int64
                claim, release = library.acl_swiglu_hot_claim, library.acl_swiglu_hot_release
                for function in (claim, release):
                    function.argtypes = (ctypes.c_void_p,)
                    function.restype = None
                launch_owned = library.acl_swiglu_hot_launch_owned
                launch_owned.argtypes = (ctypes.c_void_p, ctypes.c_int32)
                launch_owned.restype = ctypes.c_int64
                thread = library.acl_swiglu_hot_thread
                thread.argtypes = ()
                thread.restype = ctypes.c_uint64
                functions = _HotPath(calls, claim, release, launch_owned, thread)
            except AttributeError:
                functions = None
        _hotpath_function.append(functions)
    return _hotpath_function[0]


def _must_check(_plan: object, _generation: int) -> int:   # the one-crossing call, without the helper
    return _MUST_CHECK


def _nothing(_plan: object) -> None:   # claim and release, without the helper (the lock is enough)
    return None


def _flag(value: Any) -> bool:
    """synchronize= as a bool: True, False, a NumPy bool, or the int 0 or 1."""
    if isinstance(value, (bool, np.bool_)) or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise TypeError(f"synchronize must be True or False, got {value!r}")


def _no_thread() -> int:   # the thread's number, without the helper (no call is made in C)
    return 0


_plans: "weakref.WeakSet[Plan]" = weakref.WeakSet()
_Self = TypeVar("_Self", bound="Plan")


def _reset_after_fork() -> None:
    for plan in list(_plans):
        plan._lock = threading.Lock()   # a parent thread may have been inside the plan
        plan._owner = None
        plan._hot.owner = 0
        plan._hot.thread = 0   # no call is one crossing in the child: each goes to runtime_api(), which refuses


at_fork_in_child(_reset_after_fork)


def _let_go(held: Dict[str, Tuple[Life, ...]], stream_life: Life) -> None:
    """Unpins everything a plan held (at close(), or when it is garbage-collected)."""
    unpin([life for lives in held.values() for life in lives], stream_life)
    held.clear()


class Plan:
    """A repeatable executor of `operator` for fixed shapes, dtypes and options, for hot loops.

    Built once from device arrays (their layouts are the plan's; their addresses the first
    binding). Each call rebinds only the addresses that changed (aclSetInputTensorAddr /
    aclSetOutputTensorAddr on the plan's own tensor handles) and launches phase 2 on the plan's
    stream. Calls are serialised (a call with nothing to rebind owns the plan in the C helper;
    any other call takes the plan's lock and owns it there too), so one plan may be shared
    between threads; a call made from inside another call of the same plan (a gc callback, a
    finalizer) is refused.
    """

    _operator: Operator   # set by each operator's subclass
    # The calls a plan makes: the C helper's, or the same from Python (_use_python_calls).
    _calls: Tuple[Any, Any]   # (launch, launch + synchronize) with nothing to rebind
    _claim: Any
    _release: Any
    _launch_owned: Any
    _this_thread: Any

    def __init__(self, arguments: Dict[str, Any], stream: Optional[Stream]) -> None:
        operator = self._operator
        revision = self._revision = operator.revision()
        problem = self._problem = operator.validate_device(arguments, revision)
        check_open(operator.device_arrays(arguments, revision))
        self.stream = stream_argument(stream)
        self._lock = threading.Lock()
        self._owner: Optional[int] = None
        # The state a call with nothing to rebind checks in C. checked_at is the close epoch the
        # bindings were last checked at (-1: check before the next launch).
        self._hot = _HotPlan(close_epoch=ctypes.addressof(close_epoch), checked_at=-1)
        self._call_arguments = ctypes.byref(self._hot)
        self._use_python_calls()   # (until the launch is set up)
        self._bound_outputs: Tuple[int, Tuple[Optional[DeviceArray], ...], Tuple[DeviceArray, ...]] = (0, (), ())
        self._closed = False
        self._owned_outputs: List[DeviceArray] = []
        self._tensors: Dict[str, AclTensor] = {}
        self._executor: Optional[Executor] = None
        self._workspace: Optional[DeviceBuffer] = None
        self._hot_call: Optional[_HotPath] = None
        self._foreign_writes = False   # set when another stream writes one of the inputs
        self._arrays: Dict[str, DeviceArray] = {}
        # What the plan holds pinned, by slot (and "stream"); shared with the finalizer.
        self._held: Dict[str, Tuple[Life, ...]] = {}
        self._unpin = weakref.finalize(self, _let_go, self._held, self.stream._life)
        _plans.add(self)
        try:
            pin([self.stream._life])
            self._held["stream"] = (self.stream._life,)
            for name, (shape, dtype) in problem.outputs.items():
                if arguments.get(name) is None:
                    arguments[name] = DeviceArray.empty(shape, dtype)
                    self._owned_outputs.append(arguments[name])
            self._arrays = operator.device_arrays(arguments, revision)
            self._slots: Dict[str, Optional[DeviceArray]] = {name: None for name in operator.slot_names}
            self._slots.update(self._arrays)
            for name, array in self._arrays.items():
                self._held[name] = array._lives()
                pin(self._held[name])
            self._layouts = {name: a.layout() for name, a in self._arrays.items()}
            self._bound = {name: a.ptr for name, a in self._arrays.items()}
            # The plan's own handles: rebinding writes into them, so they are not shared.
            self._tensors = {name: AclTensor(a) for name, a in self._arrays.items()}
            self._setters = self._address_setters()
            self._host_values = {name: operator.description.host_values(name, arguments[name])
                                 for name in revision.host_inputs if arguments.get(name) is not None}
            self._executor = self._build_executor(self._host_values)
            # The plan's own workspace: no pool lock on the hot path, never swapped under it.
            self._workspace_size = self._executor.workspace_size
            self._workspace_ptr: Optional[int] = None
            if self._workspace_size:
                self._workspace = DeviceBuffer(self._workspace_size)
                self._workspace_ptr = self._workspace.ptr
            owned = list(self._tensors.values()) + [a.buffer for a in self._owned_outputs if a.buffer is not None]
            if self._workspace is not None:
                owned.append(self._workspace)
            # What the plan owns is used by its launches: freed only after the stream passed them.
            used_on([o._life for o in owned], self.stream._life)
            hot = runtime_api().hot
            self._launch = getattr(hot, operator.description.phase2)
            self._synchronize = hot.aclrtSynchronizeStream
            self._set_launch_args()
            for name, array in self._arrays.items():
                if name not in operator.output_names:
                    start_reading(array, self)
            self._set_outputs()
            self._foreign_writes = True   # the inputs may have writes queued elsewhere
            self._hot.checked_at = -1
        except BaseException:
            self.close()
            raise

    # -- construction --

    def _address_setters(self) -> Dict[str, Tuple[Any, ctypes.c_size_t, ctypes.c_void_p, str]]:
        """For each bound slot: its setter, slot index, tensor and API name, as ctypes wants them."""
        hot = runtime_api().hot
        operator = self._operator
        setters: Dict[str, Tuple[Any, ctypes.c_size_t, ctypes.c_void_p, str]] = {}
        for name, tensor in self._tensors.items():
            output = name in operator.output_names
            index = (operator.output_names if output else operator.input_names).index(name)
            api_name = "aclSetOutputTensorAddr" if output else "aclSetInputTensorAddr"
            setters[name] = (getattr(hot, api_name), ctypes.c_size_t(index),
                             ctypes.cast(tensor._as_parameter_, ctypes.c_void_p), api_name)
        return setters

    def _build_executor(self, host_values: Dict[str, Tuple[int, ...]]) -> Executor:
        """A repeatable executor over the plan's tensors (and these host values)."""
        operator = self._operator
        with ExitStack() as stack:
            handles = [stack.enter_context(AclIntArray(host_values[name])) if name in host_values
                       else self._tensors.get(name) for name in operator.slot_names]
            handle, size = operator.phase1(runtime_api(), self._revision, self._problem, handles)
        executor = Executor(operator, handle, size, list(self._tensors.values()), {})
        try:
            executor.make_repeatable()
        except BaseException:
            executor.close()
            raise
        used_on([executor._life], self.stream._life)
        return executor

    def _set_launch_args(self) -> None:
        """Points the plan's launches at its executor (again after a new one replaced it)."""
        executor = self._executor
        assert executor is not None   # built before the launch arguments
        hot = self._hot
        hot.launch = ctypes.cast(self._launch, ctypes.c_void_p).value
        hot.synchronize = ctypes.cast(self._synchronize, ctypes.c_void_p).value
        hot.workspace, hot.workspace_size = self._workspace_ptr, self._workspace_size
        hot.executor = ctypes.cast(executor._as_parameter_, ctypes.c_void_p).value
        self._executor_argument = ctypes.c_void_p(hot.executor)   # (for the address setters)
        hot.stream = self.stream._address.value
        functions = _hotpath()
        if functions is not None:
            self._hot_call = functions
            self._calls = functions.calls
            self._claim, self._release, self._launch_owned = functions.claim, functions.release, functions.launch_owned
            self._this_thread = functions.thread
        else:
            self._use_python_calls()

    def _use_python_calls(self) -> None:
        """Every call from Python, its ACL calls through ctypes (without the C helper)."""
        self._calls = (_must_check, _must_check)
        self._claim = self._release = _nothing
        self._launch_owned = self._launch_owned_from_python
        self._this_thread = _no_thread

    def _set_outputs(self) -> None:
        """The outputs calls return, under a new generation: a call that saw the old ones is
        refused in C and made again from Python."""
        slots = self._slots
        outputs = tuple([slots[name] for name in self._operator.output_names])
        hot = self._hot
        hot.generation = (hot.generation + 1) & 0x7FFFFFFF   # (a C int32_t)
        self._bound_outputs = (hot.generation, outputs, tuple([a for a in outputs if a is not None]))

    @property
    def workspace_size(self) -> int:
        """Bytes of workspace the plan's executor needs (0 once the plan is closed, or when built
        without an executor)."""
        return self._executor.workspace_size if self._executor is not None else 0

    # -- calls --

    def __call__(self, *arrays: Any, synchronize: bool = False,
                 **named: Any) -> Tuple[Optional[DeviceArray], ...]:
        """plan(<inputs>..., *, <outputs>=..., synchronize=False): launches phase 2 with the given
        arrays rebound (others keep their last binding) and returns the bound outputs. Each value
        is a DeviceArray, or host values for a host-values input (revision 1's group_index). The work
        is queued on the plan's stream; with synchronize=True the call also waits for it (one
        call instead of two on the hot path)."""
        if synchronize is not True and synchronize is not False:
            synchronize = _flag(synchronize)
        if arrays or named:
            return self._call(arrays, named, synchronize, _MUST_CHECK)
        # Nothing to rebind: one C call checks that this thread may skip the Python checks (its
        # last call here passed them, nothing was closed since, the outputs are the ones read
        # here) and launches, owning the plan meanwhile; else Python makes the call.
        generation, outputs, written = self._bound_outputs
        result = self._calls[synchronize](self._call_arguments, generation)
        if result:
            return self._call(arrays, named, synchronize, result, outputs, written)
        if not synchronize:
            self._note_queued(written)
        return outputs

    def _call(self, arrays: Tuple[Any, ...], named: Dict[str, Any], synchronize: bool, result: int,
              outputs: Tuple[Optional[DeviceArray], ...] = (), written: Tuple[DeviceArray, ...] = ()
              ) -> Tuple[Optional[DeviceArray], ...]:
        """A plan call from Python: under the plan's lock, owning it in C too."""
        kind = result >> 32
        if kind == _LAUNCH_FAILED or kind == _SYNC_FAILED:
            self._raise_launch_failure(result, kind)
        runtime_api()   # (binds this thread to a device, on its first call; refuses in a forked child)
        ident = _get_ident()
        lock = self._lock
        if not lock.acquire(False):
            self._acquire_contended(ident)
        self._owner = ident
        try:
            if kind == _OVERLAP:
                # Launched from C while something was closed: the call fails if it was one of
                # the plan's (its memory is pinned, so nothing was used after a free).
                self._check_bindings()
            else:
                outputs, written = self._call_owned(arrays, named, synchronize, ident)
            if not synchronize:
                self._note_queued(written)
            return outputs
        finally:
            self._owner = None
            lock.release()

    def _call_owned(self, arrays: Tuple[Any, ...], named: Dict[str, Any], synchronize: bool,
                    ident: int) -> Tuple[Tuple[Optional[DeviceArray], ...], Tuple[DeviceArray, ...]]:
        """Rebinds, checks and launches, owning the plan in C: a call from C on another thread
        waits (it finds the plan owned and comes here, to the lock)."""
        hot, arguments = self._hot, self._call_arguments
        try:
            self._claim(arguments)
            if arrays or named:
                self._rebind_all(arrays, named)
            epoch = close_epoch[0]
            if hot.checked_at != epoch:
                # Something was closed since the last check, or an input was written on another
                # stream (a plan's own close() clears checked_at, so a closed plan gets here too).
                self._prepare()
            result = self._launch_owned(arguments, synchronize)
            if result:
                self._raise_launch_failure(result, result >> 32)
            if close_epoch[0] != epoch:
                self._check_bindings()   # something was closed during the launch: this call fails
            hot.thread = self._this_thread()   # this thread's next call can be one crossing
            return self._bound_outputs[1:]
        finally:
            self._release(arguments)

    def _note_queued(self, written: Tuple[DeviceArray, ...]) -> None:
        """The outputs of a launch that was not waited for: a reader waits for the plan's stream."""
        stream = self.stream
        for array in written:
            array.pending = stream
            if array._readers is not None:
                note_write(array, stream)

    def _acquire_contended(self, ident: int) -> None:
        if self._owner == ident:
            raise RuntimeError(f"this {type(self).__name__} was called from code run inside one of its own calls "
                               "(a gc callback or finalizer); call it after that call returns")
        self._lock.acquire()

    def _prepare(self) -> None:
        """Before a launch that the fast check did not clear: the bindings must be open, and
        inputs written on another stream are waited for. (checked_at is set first: a close or a
        foreign write from here on makes the next call come here again.)"""
        self._hot.checked_at = close_epoch[0]
        self._check_bindings()
        if self._foreign_writes:
            self._wait_for_foreign_writes()

    def _check_bindings(self) -> None:
        """The plan, every bound array, and the stream must still be open."""
        if self._closed:
            self._hot.checked_at = -1
            raise HandleClosedError(f"this {type(self).__name__} was closed")
        try:
            check_open(self._arrays)
            self.stream.check_open("stream")
        except BaseException:
            self._hot.checked_at = -1
            raise

    def _wait_for_foreign_writes(self) -> None:
        """An input was written on another stream since the last call: wait for that write."""
        self._foreign_writes = False
        stream = self.stream
        outputs = self._operator.output_names
        for name, array in self._arrays.items():
            if name not in outputs and array.pending is not None and array.pending is not stream:
                array.wait_for_writer()

    def _launch_owned_from_python(self, _: object, synchronize: bool) -> int:
        """Phase 2 (and the synchronisation) as ctypes calls, without the C helper; returns
        what the helper's call would."""
        status: int = self._launch(ctypes.c_void_p(self._workspace_ptr), ctypes.c_uint64(self._workspace_size),
                                   self._executor_argument, self.stream._address)
        if status:
            return (_LAUNCH_FAILED << 32) | (status & 0xFFFFFFFF)
        if synchronize:
            status = self._synchronize(self.stream._address)
            if status:
                return (_SYNC_FAILED << 32) | (status & 0xFFFFFFFF)
        return 0

    def _rebind_all(self, arrays: Tuple[Any, ...], named: Dict[str, Any]) -> None:
        # (each value is a DeviceArray, or host values for a host input; checked below)
        operator = self._operator
        order = operator.input_names
        if len(arrays) > len(order):
            raise TypeError(f"a plan takes at most {len(order)} positional arrays ({', '.join(order)}), "
                            f"got {len(arrays)}")
        slots = self._slots
        for name in named:
            if name not in slots:
                raise TypeError(f"a plan takes no argument {name!r}; it takes {', '.join(operator.slot_names)} and "
                                "synchronize")
            if name in order[:len(arrays)]:
                raise TypeError(f"{name} given twice")
        if self._closed:
            raise HandleClosedError(f"this {type(self).__name__} was closed")
        host_inputs = self._revision.host_inputs
        host_values: Dict[str, Any] = {}
        held: List[Life]
        released: List[Life]
        held, released = [], []
        outputs_changed = False
        try:
            for name, array in (*zip(order, arrays), *named.items()):
                if array is None:
                    continue
                if name in host_inputs:
                    host_values[name] = array   # read at phase 1: after every address is rebound
                elif array is not slots[name]:
                    self._rebind(name, array, held, released)
                    outputs_changed = outputs_changed or name in operator.output_names
        finally:
            # The plan holds the new arrays and lets go of the old ones (freed now if they were
            # closed, once the stream has passed the launches that used them).
            if held or released:
                repin(held, released, self.stream._life)
            if outputs_changed:
                self._set_outputs()
        if host_values:
            self._regroup(host_values)

    def _raise_launch_failure(self, result: int, kind: int) -> None:
        status = status_of(result)
        api = runtime_api()
        if kind == _LAUNCH_FAILED:
            self._operator.check_status(api, status, self._operator.description.phase2)
        _ffi.raise_status(status, "aclrtSynchronizeStream", api.get_message)

    def _rebind(self, name: str, array: DeviceArray, held: List[Life], released: List[Life]) -> None:
        layout = self._layouts.get(name)
        if layout is None:
            raise ArgumentError(f"the plan was built without {name}; build another plan to use it")
        if not isinstance(array, DeviceArray):
            raise TypeError(f"{name} must be a DeviceArray, got {type(array).__name__}")
        if array.closed:
            raise HandleClosedError(f"{name} is a closed DeviceArray")
        if array._layout != layout:
            raise ArgumentError(f"{name} has layout (shape, dtype, strides, offset) {array.layout()}; the plan was "
                                f"built for {layout}")
        ptr = array.ptr
        if ptr != self._bound[name]:
            set_address, index, tensor, api_name = self._setters[name]
            status = set_address(self._executor_argument, index, tensor, ctypes.c_void_p(ptr))
            if status:
                self._operator.check_status(runtime_api(), status, api_name)
            self._bound[name] = ptr
        lives = array._lives()
        held.extend(lives)
        released.extend(self._held[name])
        self._held[name] = lives
        self._arrays[name] = self._slots[name] = array
        if name not in self._operator.output_names:
            start_reading(array, self)
            if array.pending is not None and array.pending is not self.stream:
                self._foreign_writes = True   # written on another stream: wait before the launch
                self._hot.checked_at = -1

    def _regroup(self, host_values: Dict[str, Any]) -> None:
        describe = self._operator.description.host_values
        values: Dict[str, Tuple[int, ...]] = {}
        for name, value in host_values.items():
            if name not in self._host_values:
                raise ArgumentError(f"the plan was built without {name}; build another plan to use it")
            values[name] = describe(name, value)
        if any(values[name] != self._host_values[name] for name in values):
            # Host values are read at phase 1: new ones need a new executor. The plan switches
            # to it only once it exists, so a failure leaves the old one in use.
            merged = dict(self._host_values, **values)
            executor = self._build_executor(merged)
            if executor.workspace_size > self._workspace_size:
                executor.close()
                raise ArgumentError(f"the new {', '.join(values)} need a larger workspace; build another plan")
            old, self._executor, self._host_values = self._executor, executor, merged
            assert old is not None   # built with the plan
            self._set_launch_args()
            old.close()   # freed once the stream has passed the launches queued with it

    # -- end --

    def close(self) -> None:
        """Destroys the executor and the plan's tensors, frees outputs the plan allocated (after
        the work queued with them is done), and lets go of the arrays it was bound to."""
        hot = self._hot
        if in_forked_child():
            self._closed = True   # the parent's device state is not this process's to free
            hot.checked_at = -1
            return
        ident = _get_ident()
        if not self._lock.acquire(False):
            self._acquire_contended(ident)
        self._owner = ident   # (a call from a gc callback during the close is refused, not a deadlock)
        try:
            if self._closed:
                return
            try:
                self._claim(self._call_arguments)   # a call in C on another thread ends first
                self._closed = True
                hot.checked_at = -1   # the next call checks, and fails
                hot.thread = 0
            finally:
                self._release(self._call_arguments)
            self._hot_call = None
            stream = self.stream
            try:
                if self._executor is not None and not stream.closed:
                    stream.synchronize()   # report a failure of queued work here
            finally:
                if self._executor is not None:
                    self._executor.close()
                for tensor in self._tensors.values():
                    tensor.close()
                for array in self._owned_outputs:
                    array.close()
                if self._workspace is not None:
                    self._workspace.close()
                for array in self._arrays.values():
                    stop_reading(array, self)
                if self._unpin.detach() is not None:
                    _let_go(self._held, stream._life)
        finally:
            self._owner = None
            self._lock.release()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if exc_type is None:
            self.close()
            return
        try:
            self.close()   # everything is released either way
        except Exception:  # the error already propagating is the one that matters
            pass
