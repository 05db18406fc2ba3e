"""What the generic two-phase aclnn layer knows of an operator: its description (the C parameter
list of each ABI revision, in order, with each parameter's kind; its validation; its phases), the
``Operator`` that turns a description into calls, and the ``Executor`` phase 1 returns.

Phase 1 (``<op>GetWorkspaceSize``) validates and returns an executor and a workspace size; phase 2
(``<op>``) queues the work on a stream.
"""

from __future__ import annotations

import ctypes
import re
from operator import itemgetter
import struct
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, TypeVar, cast

import numpy as np

from . import _ffi
from ._checks import plain_array
from ._device import (DeviceArray, DeviceBuffer, Stream, closed_array_error, default_stream, is_closed, lives_of,
                      open_address, order_launch, record_launch)
from .errors import ArgumentError
from .runtime import Owned, Use, current_device, refuse_inside_own_call, runtime_api, state
from .tensor import AclIntArray, AclTensor, TensorView

# Kinds of C parameter: handles (a tensor the call reads, one it writes, host int64 values as an
# aclIntArray read at phase 1) and scalars.
INPUT, OUTPUT, HOST_INTS = "input", "output", "host ints"
INT64, BOOL, DOUBLE = "int64", "bool", "double"
_HANDLE_KINDS = (INPUT, OUTPUT, HOST_INTS)
_SCALAR_TYPES = {INT64: ctypes.c_int64, BOOL: ctypes.c_bool, DOUBLE: ctypes.c_double}
_SCALAR_FORMATS = {INT64: "q", BOOL: "q", DOUBLE: "d"}   # each in an 8-byte slot (helper.h)


class Param(NamedTuple):
    """One C parameter of phase 1 (before ``workspaceSize`` and ``executor``)."""

    name: str     # the Python argument
    c_name: str   # as the operator's prototype (and CANN's messages) name it
    kind: str


class Revision(NamedTuple):
    """One published ABI of an operator."""

    abi: int
    params: Tuple[Param, ...]   # phase 1's parameters, in C order
    rules: object               # handed to the operator's validation


def _no_host_values(name: str, value: Any) -> np.ndarray:
    raise TypeError(f"{name} takes no host values")


def _no_guard(problem: Any, arguments: Mapping[str, Any], revision: Revision) -> bool:
    return False


class OperatorDescription(NamedTuple):
    """An aclnn operator, for the generic layer.

    ``validate(arguments, revision, device)`` checks a call's arrays and scalars (device: device
    arrays, else NumPy arrays) and returns a problem whose ``outputs`` maps each output the call
    computes to its (shape, dtype) (and may give ``views``, see views_of, and ``preset``, see
    preset_outputs); it raises ArgumentError naming the argument and the rule. Its
    result is reused for arguments of the same layout (types, shapes, dtypes, strides, scalar
    values). ``guard(problem, arguments, revision)`` checks what depends on the arrays' contents
    (a release known to hang on some values): it runs on every call, and says whether what it
    checked can change without the arguments changing (contents in device memory): then a plan
    runs it before each of its launches too. ``scalars(problem, revision)``
    gives the scalar parameters' C values, in order. ``host_values(name, value)`` turns a
    host-ints argument into a 1-D int64 array.
    """

    name: str
    phase1: str
    phase2: str
    thunk: str   # the helper's phase-1 thunk of this operator (binding/<operator>.c)
    revisions: Mapping[int, Revision]
    revision: Callable[[], int]
    validate: Callable[[Mapping[str, Any], Revision, bool], Any]
    scalars: Callable[[Any, Revision], Tuple[Any, ...]]
    host_values: Callable[[str, Any], np.ndarray] = _no_host_values   # (operators without host-ints parameters)
    guard: Callable[[Any, Mapping[str, Any], Revision], bool] = _no_guard   # (operators no release hangs on)


def picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], Tuple[Any, ...]]:
    """A function that gives the values at these positions, as a tuple."""
    if len(positions) > 1:
        return itemgetter(*positions)
    if positions:
        at = positions[0]
        return lambda values: (values[at],)
    return lambda values: ()


class Signature:
    """The lookups a revision's calls need, computed once."""

    def __init__(self, operator: "Operator", revision: Revision) -> None:
        params = revision.params
        self.revision = revision
        self.abi = revision.abi
        self.handles = tuple(p for p in params if p.kind in _HANDLE_KINDS)
        self.scalar_params = tuple(p for p in params if p.kind not in _HANDLE_KINDS)
        self.handle_names = tuple(p.name for p in self.handles)
        self.input_names = tuple(p.name for p in self.handles if p.kind != OUTPUT)
        self.output_names = tuple(p.name for p in self.handles if p.kind == OUTPUT)
        positions = [operator.argument_names.index(name) for name in self.output_names]
        # The outputs among a call's argument values (in argument order), as a tuple.
        self.outputs_of = picker(positions)
        self.host_names = tuple(p.name for p in self.handles if p.kind == HOST_INTS)
        self.tensor_names = tuple(p.name for p in self.handles if p.kind != HOST_INTS)
        # (the scalars as the helper's thunks read them: each in an 8-byte slot)
        self.scalar_struct = struct.Struct("<" + "".join(_SCALAR_FORMATS[p.kind] for p in self.scalar_params))
        self.argument_names = operator.argument_names
        # aclSet{Input,Output}TensorAddr index: the position among the inputs, or the outputs
        self.address_index = {name: (self.output_names if name in self.output_names else self.input_names).index(name)
                              for name in self.tensor_names}

    def phase1_arguments(self, handles: Mapping[str, Any], scalars: Sequence[Any]) -> List[Any]:
        """Phase 1's arguments in C order (the handles as addresses, the scalars as C values)."""
        values = iter(scalars)
        out: List[Any] = []
        for param in self.revision.params:
            if param.kind in _HANDLE_KINDS:
                handle = handles.get(param.name)
                out.append(None if handle is None else getattr(handle, "address", handle))
            else:
                out.append(_SCALAR_TYPES[param.kind](next(values)))
        return out


_KEY_SCALARS = (float, int, bool, str)
_PROBLEMS_KEPT = 256


def layout_key(abi: int, values: Sequence[Any], names: Optional[Sequence[str]] = None) -> Optional[Tuple[Any, ...]]:
    """What a call's validation depends on, as a tuple that is cheap to hash: types, dtypes,
    shapes, strides and scalar values, in argument order; None when an argument is of a kind
    whose checks look at more (a sequence, say): then nothing is reused. With `names` (host
    calls), a NumPy array that is not a plain ndarray (a subclass, or a proxy) is made the plain
    ndarray over the same memory first, in `values` (read through its own view(): in native byte
    order, a converted copy); without, such an array is not reused either."""
    key: List[Any] = [abi]
    reusable = True
    for index, value in enumerate(values):
        kind = type(value)
        if kind is np.ndarray:
            key.append((value.dtype, value.shape, value.strides))
        elif kind is DeviceArray:
            key.append(value._layout)
        elif value is None:
            key.append(None)
        elif kind in _KEY_SCALARS:
            key.append((kind, value))
        elif names is not None and isinstance(value, np.ndarray):
            value = cast(List[Any], values)[index] = plain_array(value, names[index])
            key.append((value.dtype, value.shape, value.strides))
        else:
            reusable = False
    return tuple(key) if reusable else None


_T = TypeVar("_T")


def remembered(table: Dict[Any, _T], key: Optional[Tuple[Any, ...]], limit: int, make: Callable[[], _T]) -> _T:
    """table[key], made by `make` the first time (not kept for a key of None); the table is
    emptied when it holds `limit` entries."""
    found = table.get(key) if key is not None else None
    if found is None:
        found = make()
        if key is not None:
            with state.lock:
                if len(table) >= limit:
                    table.clear()
                table[key] = found
    return found


class Operator:
    """A described operator with the lookups every call needs, computed once."""

    def __init__(self, description: OperatorDescription):
        self.description = description
        names: List[str] = []
        c_names: Dict[str, str] = {}
        for revision in description.revisions.values():
            for param in revision.params:
                if param.name not in names:
                    names.append(param.name)
                c_names[param.c_name] = param.name
        self.argument_names = tuple(names)
        self.values_of = itemgetter(*names)   # (a call's values from a dict that has every name)
        self._signatures = {abi: Signature(self, revision) for abi, revision in description.revisions.items()}
        self._problems: Dict[Tuple[Any, ...], Any] = {}
        self.kept: List[Any] = []   # device-level calls' idle executors, the least recently used first
        self.generation = 0   # moves at release_cached()
        self.one_shots: Dict[Tuple[Any, ...], Any] = {}   # one-shot calls' layouts
        self.device_layouts: Dict[Tuple[Any, ...], Any] = {}   # device-level calls' layouts
        self._api: Optional[SimpleNamespace] = None
        self.one_shot_table: Tuple[_ffi.OneShotApi, Any]   # the helper's table of the API bound, and a byref of it
        self._c_names = c_names
        self._c_name_pattern = re.compile(r"\b(" + "|".join(map(re.escape, c_names)) + r")\b")

    def signature(self) -> Signature:
        """The revision calls use now."""
        return self._signatures[self.description.revision()]

    def declarations(self) -> Tuple[_ffi.Declaration, ...]:
        """The operator's C functions, as _ffi rows (phase 1 with the prototype of the newest
        revision: every revision passes one pointer per handle)."""
        d = self.description
        params = d.revisions[max(d.revisions)].params
        return _ffi.operator_declarations(d.phase1, d.phase2, d.thunk, tuple(
            ctypes.c_void_p if p.kind in _HANDLE_KINDS else _SCALAR_TYPES[p.kind] for p in params))

    def raise_launch_failure(self, result: int) -> None:
        """Raises for a failed acl_swiglu_launch of this operator's executor."""
        _ffi.raise_launch_failure(result, self.description.phase2, self.api().get_message, self.describe_arguments)

    def raise_one_shot_failure(self, status: int, step: int) -> None:
        """Raises for a failed acl_swiglu_one_shot of this operator (`step`: the call that failed)."""
        d = self.description
        _ffi.raise_one_shot_failure(status, step, d.phase1, d.phase2, self.describe_arguments)

    def api(self) -> SimpleNamespace:
        """The C API with this operator's functions bound (on this thread's device)."""
        api = runtime_api()
        if self._api is not api:
            d = self.description
            bound = _ffi.bind_operator(self.declarations(), d.phase1)
            table = _ffi.one_shot_api(bound, d.thunk, d.phase1, d.phase2)
            self.one_shot_table = (table, ctypes.byref(table))   # (set first: a thread that sees _api finds it)
            self._api = bound
        return api

    def problem(self, signature: Signature, arguments: Mapping[str, Any], values: Sequence[Any],
                device: bool) -> Any:
        """The validated problem of these arguments (reused for the same layout)."""
        return remembered(self._problems, layout_key(signature.abi * 2 + device, values), _PROBLEMS_KEPT,
                          lambda: self.description.validate(arguments, signature.revision, device))

    def describe_arguments(self, message: str) -> str:
        """'gradXOut is the grad_x argument, ...' for the C parameters a CANN message names."""
        seen = dict.fromkeys(self._c_name_pattern.findall(message))
        return ", ".join(f"{name} is the {self._c_names[name]} argument" for name in seen)

    def check_status(self, api: SimpleNamespace, status: int, symbol: str) -> None:
        """Raises for a failed operator call, saying which Python arguments its message means."""
        if status != 0:
            _ffi.raise_status(status, symbol, api.get_message, self.describe_arguments)


def stream_argument(stream: object) -> Stream:
    """The stream to use: the default one for None; a TypeError or HandleClosedError otherwise."""
    if stream is None:
        return default_stream()
    if not isinstance(stream, Stream):
        raise TypeError(f"stream must be an acl_swiglu.Stream or None, got {type(stream).__name__} (wrap a "
                        "foreign aclrtStream with acl_swiglu.Stream.from_handle)")
    stream.check_open("stream")
    return stream


def check_open(arrays: Mapping[str, Optional[DeviceArray]]) -> None:
    for name, array in arrays.items():
        if array is not None and is_closed(array):
            raise closed_array_error(name)


def device_arrays(signature: Signature, arguments: Mapping[str, Any]) -> Dict[str, DeviceArray]:
    """The device-array arguments given (tensor parameters only), by name."""
    return {name: arguments[name] for name in signature.tensor_names if arguments.get(name) is not None}


def host_lists(operator: Operator, signature: Signature, arguments: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """The host-ints arguments given, as int64 arrays."""
    describe = operator.description.host_values
    return {name: describe(name, arguments[name]) for name in signature.host_names if arguments.get(name) is not None}


def views_of(problem: Any) -> Mapping[str, TensorView]:
    """How the operator sees each array whose NumPy dtype is not its aclDataType (FP4 codes packed
    in bytes, say): the problem's ``views``, when its validation gives them."""
    views: Mapping[str, TensorView] = getattr(problem, "views", None) or {}
    return views


def preset_outputs(problem: Any) -> Tuple[str, ...]:
    """The outputs the operator may leave partly unwritten (rows past a truncation, say): the ones
    the layer allocates start zeroed. The problem's ``preset``, when its validation gives it."""
    preset: Tuple[str, ...] = getattr(problem, "preset", None) or ()
    return preset


class Binding(Owned):
    """An executor phase 1 made over tensor handles of its own, one per array parameter (int
    arrays of host values go right after phase 1), destroyed before them. ``_rebind`` points a
    repeatable one's tensors at arrays of the same layouts; ``_launch_call(_launch_argument, sync)``
    runs phase 2 on the stream and workspace ``_launch_args`` name. A plan's binding is used under
    the plan's lock, a device-level call's by the call that took it out of its operator's pool, an
    Executor under its launch lock."""

    _kind = "plan executor"

    def __init__(self, operator: Operator, signature: Signature, arrays: Mapping[str, DeviceArray],
                 host_values: Mapping[str, np.ndarray], scalars: Sequence[Any], views: Mapping[str, TensorView],
                 repeatable: bool = True) -> None:
        super().__init__()
        self._operator = operator
        self._workspace_size = 0
        tensors: Dict[str, AclTensor] = {}
        self._tensors = tensors
        try:
            api = operator.api()
            # The handle lives in the launch's argument, where a launch that hands it to CANN
            # clears it (and a NULL handle is never destroyed).
            launch_args = self._launch_args = _ffi.HelperLaunch()
            self._launch_argument = ctypes.byref(launch_args)
            handle = _ffi.aclOpExecutor_p.from_buffer(launch_args, _ffi.HelperLaunch.executor.offset)
            life = self._prepare(api.raw.aclDestroyAclOpExecutor, handle, current_device())
            for name, array in arrays.items():
                tensors[name] = AclTensor(array, views.get(name), after=life)   # (freed after the executor)
            lists: Dict[str, AclIntArray] = {}
            try:
                for name, values in host_values.items():
                    lists[name] = AclIntArray(values)
                size = ctypes.c_uint64()
                status = getattr(api.hot, operator.description.phase1)(*signature.phase1_arguments(
                    {**tensors, **lists}, scalars), ctypes.byref(size), ctypes.byref(handle))
            finally:
                for host in lists.values():   # (read by phase 1: freed right after it)
                    host.close()
            operator.check_status(api, status, operator.description.phase1)
            self._workspace_size = int(size.value)
            if repeatable:
                self._make_repeatable(api)
            self._host_values = {name: tuple(int(v) for v in values) for name, values in host_values.items()}
            # (the addresses the tensors were made with)
            self._addresses: Dict[str, Optional[int]] = {name: array._address for name, array in arrays.items()}
            executor = ctypes.c_void_p(ctypes.cast(handle, ctypes.c_void_p).value)
            self._setters = {}
            for name, tensor in tensors.items():
                symbol = "aclSetOutputTensorAddr" if name in signature.output_names else "aclSetInputTensorAddr"
                self._setters[name] = (getattr(api.hot, symbol), executor,
                                      ctypes.c_size_t(signature.address_index[name]), tensor.address, symbol)
            d = operator.description
            launch_args.phase2 = _ffi.c_address(api, d.phase2, d.phase1)
            launch_args.synchronize = _ffi.c_address(api, "aclrtSynchronizeStream")
            launch_args.workspace_size = self._workspace_size
            self._launch_call = api.hot.acl_swiglu_launch
        except BaseException:
            self.close()   # (the executor, if phase 1 made one, then its tensors)
            raise

    def _make_repeatable(self, api: SimpleNamespace) -> None:
        """aclSetAclOpExecutorRepeatable through the helper, which records it in the launch's
        argument in the same call: a launch hands the executor to CANN unless that is set."""
        status = api.hot.acl_swiglu_make_repeatable(
            self._launch_argument, ctypes.c_void_p(_ffi.c_address(api, "aclSetAclOpExecutorRepeatable")))
        if status:
            self._operator.check_status(api, status, "aclSetAclOpExecutorRepeatable")

    def close(self) -> None:
        """Closes the executor and its tensors: freed once nothing uses them, the executor first.
        Closing again finishes a close an exception cut short."""
        super().close()
        for tensor in self._tensors.values():
            tensor.close()

    @property
    def workspace_size(self) -> int:
        """Bytes of workspace phase 2 needs (what phase 1 asked for)."""
        return self._workspace_size

    def _rebind(self, arrays: Mapping[str, DeviceArray]) -> None:
        """Points the tensors at these arrays' addresses: all of them or, when a setter fails,
        none (the previous addresses restored)."""
        changed: List[Tuple[str, Optional[int]]] = []
        try:
            for name, array in arrays.items():
                address = open_address(array, name)
                previous = self._addresses[name]
                if address != previous:
                    self._addresses[name] = None   # (unknown until the setter returns)
                    changed.append((name, previous))
                    self._set(name, address)
                    self._addresses[name] = address
        except BaseException:
            for name, previous in reversed(changed):
                if previous is not None and self._addresses[name] != previous:
                    try:
                        self._set(name, previous)
                        self._addresses[name] = previous
                    except Exception:   # the first failure is the one to report; unknown stays unknown
                        pass
            raise

    def _set(self, name: str, address: int) -> None:
        setter, executor, index, tensor, symbol = self._setters[name]
        status = setter(executor, index, tensor, ctypes.c_void_p(address or None))
        if status:
            self._operator.check_status(self._operator.api(), status, symbol)


class Executor(Binding):
    """The aclOpExecutor phase 1 returned, with the arrays it was made for and its own tensors.

    Single-use unless made repeatable: ``launch`` consumes a single-use one (CANN frees it), a
    repeatable one lives until close(). The executor holds its arrays, so they stay allocated
    while it lives; a closed one makes ``launch`` fail.
    """

    _kind = "Executor"

    def __init__(self, operator: Operator, signature: Signature, arrays: Dict[str, DeviceArray],
                 host_values: Mapping[str, np.ndarray], scalars: Sequence[Any],
                 views: Mapping[str, TensorView]) -> None:
        self._launches = 0
        self._launching: Any = threading.RLock()   # (_launch_args is one per executor; _is_owned() tells a re-entry)
        self._arrays = dict(arrays)
        self._inputs = [a for name, a in self._arrays.items() if name not in signature.output_names]
        self._outputs = [a for name, a in self._arrays.items() if name in signature.output_names]
        self._hold = Use(lives_of(self._arrays.values()))   # the arrays, until closed, consumed or collected
        weakref.finalize(self, setattr, self._hold, "active", False)
        try:
            if not self._hold.take():
                check_open(self._arrays)
            super().__init__(operator, signature, arrays, host_values, scalars, views, repeatable=False)
        except BaseException:
            self._hold.let_go()
            raise

    @property
    def repeatable(self) -> bool:
        """True once make_repeatable() was called: launches do not consume it."""
        return bool(self._launch_args.repeatable)

    @property
    def launches(self) -> int:
        """How many times phase 2 was called with it."""
        return self._launches

    def make_repeatable(self) -> None:
        """aclSetAclOpExecutorRepeatable: keep the executor for many launches."""
        api = self._operator.api()   # (first: in a forked child it refuses, before any lock is taken)
        refuse_inside_own_call(self._launching, "this Executor", "used", "launches")
        use = Use((self._life,))   # (no close() frees it meanwhile)
        try:
            with self._launching:
                if not use.take():
                    self.check_open(_CONSUMED)
                self._finish_hand_over()
                self._make_repeatable(api)
        finally:
            use.let_go()

    def launch(self, stream: Optional[Stream] = None, workspace: Optional[DeviceBuffer] = None) -> None:
        """Phase 2 on `stream` (default stream if None). The work runs asynchronously: wait
        with stream.synchronize() or read an output with to_numpy(), which waits for its writer.
        Launches of one executor from several threads take turns."""
        self._operator.api()   # (a thread's first call binds its device; in a forked child it refuses)
        stream = stream_argument(stream)
        if workspace is not None and not isinstance(workspace, DeviceBuffer):
            raise TypeError(f"workspace must be an acl_swiglu.DeviceBuffer or None, got {type(workspace).__name__}")
        refuse_inside_own_call(self._launching, "this Executor", "used", "launches")
        use = Use((self._life, stream._life, *lives_of(self._arrays.values())), stream._life)
        try:
            with self._launching:
                self._launch(stream, workspace, use)
        finally:
            use.let_go()

    def _launch(self, stream: Stream, workspace: Optional[DeviceBuffer], use: Use) -> None:
        epoch = state.epoch
        if not use.take():
            self.check_open("this repeatable Executor" if self.repeatable else _CONSUMED)
            stream.check_open("stream")
            check_open(self._arrays)
        self._finish_hand_over()
        size = self.workspace_size
        if workspace is not None:
            if not use.add(workspace._life):
                workspace.check_open("workspace")
            if size and workspace._nbytes < size:
                raise ArgumentError(f"workspace has {workspace._nbytes} bytes; phase 1 asked for {size}")
            address: Optional[int] = workspace._life.handle.value if size else None   # (held)
        else:
            address = stream.take_workspace(size, use) if size else None
        order_launch(self._inputs, self._outputs, stream._life)
        self._launch_args.workspace, self._launch_args.stream = address, stream._address.value
        try:
            result = self._launch_call(self._launch_argument, 0)
        finally:
            if not self._launch_args.executor:
                self._handed_over()   # (CANN has it, failed or not: never destroy it ourselves)
        self._launches += 1
        if result:
            self._operator.raise_launch_failure(result)
        record_launch(self._inputs, self._outputs, stream._life)
        if state.epoch != epoch:
            check_open(self._arrays)   # closed by another thread during the launch: it must not succeed

    def _finish_hand_over(self) -> None:
        """Held (so not being destroyed), a NULL handle is one a launch handed to CANN: finishes
        the tidying an exception cut short, and refuses."""
        if not self._launch_args.executor:
            self._handed_over()
            self.check_open(_CONSUMED)

    def _handed_over(self) -> None:
        self._disown()   # (CANN's now: the close below frees only its tensors, which a queued launch no longer needs)
        self.close()

    def close(self) -> None:
        """Destroys the executor (then its tensors) once nothing uses it, and lets go of its arrays."""
        self._hold.let_go()
        super().close()


_CONSUMED = "this Executor (a single-use executor is consumed by its launch, or by close())"
