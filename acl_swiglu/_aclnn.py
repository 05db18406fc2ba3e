"""The generic two-phase aclnn layer: an operator is an ``OperatorDescription`` and this module
calls it. Phase 1 (``<op>GetWorkspaceSize``) validates and returns an executor and a workspace
size; phase 2 (``<op>``) queues the work on a stream.

Drivers: ``one_shot`` (NumPy in, NumPy out, everything freed before it returns),
``device_call`` (device arrays, queued on a stream), ``workspace_size`` (phase 1 only: an
``Executor`` whose ``launch`` is phase 2); the reusable plan is in _plan.py. Every launch records
on its outputs the stream that writes them, waits for inputs written on another stream, and
keeps what it uses alive until that stream has passed the work.
"""

from __future__ import annotations

import ctypes
import math
import re
import threading
import weakref
from contextlib import ExitStack
from operator import is_, itemgetter
from types import SimpleNamespace
from typing import (TYPE_CHECKING, Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, NamedTuple, Optional,
                    Sequence, Tuple)

import numpy as np

from . import _ffi
from ._device import DeviceArray, DeviceBuffer, Stream, default_stream
from ._lean import NO_WORKSPACE, PHASE1_FAILED, ArenaPhase1, LeanCall, arena_phase1, lean_call, status_of
from ._scratch import (HOST_DATA_OFFSET, STEP_LAUNCH, STEP_PHASE1, ArenaCall, ArenaHelper, ArenaLayout, CallScratch,
                       arena_helper, arena_layout, host_address)
from .errors import ArgumentError, HandleClosedError, HostMemoryError
from .runtime import (CallGroup, Life, Owned, Visit, at_fork_in_child, close_epoch, enter, free_collected,
                      in_forked_child, leave, pin, runtime_api, unpin, used_on, visit)
from .tensor import AclIntArray, tensor_for

if TYPE_CHECKING:   # (for annotations only: it imports this module)
    from ._plan import Plan


class Slot(NamedTuple):
    """A tensor parameter: its Python argument name and its C parameter name."""

    name: str
    c_name: str


class Revision(NamedTuple):
    """One ABI revision of an operator: how Python arguments become C arguments."""

    abi: int
    host_inputs: FrozenSet[str]   # input slots passed as host int64 values (an aclIntArray read at phase 1)
    scalars: Callable[[Any], Tuple[Any, ...]]   # problem -> the scalar C arguments (ctypes values) in C order
    rules: object            # handed to the operator's validation (rank and shape rules)


class OperatorDescription(NamedTuple):
    """What the generic layer needs to know about an aclnn operator.

    The phase-1 C call takes the inputs in order, then the scalars, then the outputs, then
    ``uint64_t *workspaceSize`` and ``aclOpExecutor **``; aclSet{Input,Output}TensorAddr index
    the slots by their position here. ``validate(arguments, revision, array_types, array_text,
    host_inputs, check_outputs)`` returns a problem with ``outputs`` ({name: (shape, dtype)} of
    the outputs the call computes) and raises ArgumentError naming the argument.
    ``host_values(name, value)`` turns a host-values argument into a tuple of ints.
    """

    name: str
    phase1: str
    phase2: str
    inputs: Tuple[Slot, ...]
    outputs: Tuple[Slot, ...]
    scalars: Tuple[Slot, ...]
    phase1_argtypes: Tuple[Any, ...]   # ctypes types
    validate: Callable[..., Any]
    host_values: Callable[[str, Any], Tuple[int, ...]]
    revisions: Mapping[int, Revision]
    revision: Callable[[], int]
    # The C helper's phase-1 thunk of this operator (binding/lean.h), for repeated device-level
    # calls made from C; None: they make both phases through ctypes.
    phase1_thunk: Optional[str] = None

    def declarations(self) -> Tuple[_ffi.Declaration, _ffi.Declaration]:
        """The operator's two C functions, as _ffi rows."""
        return (_ffi.Declaration("operator", self.phase1, _ffi.aclnnStatus, self.phase1_argtypes, _ffi.STATUS,
                                 fast=True),
                _ffi.Declaration("operator", self.phase2, _ffi.aclnnStatus,
                                 (ctypes.c_void_p, ctypes.c_uint64, _ffi.aclOpExecutor_p, _ffi.aclrtStream_p),
                                 _ffi.STATUS, fast=True))


def register(description: OperatorDescription) -> "Operator":
    _ffi.declare(description.declarations())
    return Operator(description)


class Operator:
    """A described operator with the lookups every call needs, computed once."""

    def __init__(self, description: OperatorDescription):
        self.description = description
        self.input_names = tuple(slot.name for slot in description.inputs)
        self.output_names = tuple(slot.name for slot in description.outputs)
        self.slot_names = self.input_names + self.output_names
        self.input_count = len(self.input_names)
        self.scalar_names = tuple(slot.name for slot in description.scalars)
        self.argument_names = self.slot_names + self.scalar_names
        self.slot_count = len(self.slot_names)
        self.device_recipes: Dict[Tuple[Any, ...], _DeviceRecipe] = {}   # by _layout_key
        self.one_shot_layouts: Dict[Tuple[Any, ...], _OneShotLayout] = {}
        self.last_call: Optional[_LastCall] = None   # the last lean device-level call
        self._revisions, self._revision_number = description.revisions, description.revision
        c_names = {slot.c_name: slot.name for slot in description.inputs + description.outputs + description.scalars}
        self._c_names = c_names
        self._c_name_pattern = re.compile(r"\b(" + "|".join(map(re.escape, c_names)) + r")\b")

    def revision(self) -> Revision:
        return self._revisions[self._revision_number()]

    def describe_arguments(self, message: str) -> str:
        """'gradXOut is the grad_x argument, ...' for the C parameters a CANN message names."""
        seen = dict.fromkeys(self._c_name_pattern.findall(message))
        return ", ".join(f"{name} is the {self._c_names[name]} argument" for name in seen)

    def check_status(self, api: SimpleNamespace, status: int, symbol: str) -> None:
        """Raises for a failed operator call, saying which Python arguments its message means."""
        if status != 0:
            _ffi.raise_status(status, symbol, api.get_message, self.describe_arguments)

    def validate_device(self, arguments: Dict[str, Any], revision: Revision) -> Any:
        return self.description.validate(arguments, revision, (DeviceArray,), "a DeviceArray", revision.host_inputs,
                                         True)

    def device_arrays(self, arguments: Mapping[str, Any], revision: Revision) -> Dict[str, DeviceArray]:
        """The device-array arguments (given ones only), by slot name."""
        return {name: arguments[name] for name in self.slot_names
                if arguments.get(name) is not None and name not in revision.host_inputs}

    def phase1(self, api: SimpleNamespace, revision: Revision, problem: Any,
               handles: Sequence[Any]) -> Tuple[ctypes.c_void_p, int]:
        """Phase 1 on native handles, one per slot in order (an AclTensor / AclIntArray, a raw
        handle, or None): (executor, workspace size). The call goes through the unprototyped
        function with ready ctypes arguments: no per-argument conversions."""
        size = ctypes.c_uint64()
        executor = ctypes.c_void_p()
        handles = [getattr(h, "address", h) for h in handles]
        count = len(self.input_names)
        status = getattr(api.hot, self.description.phase1)(
            *handles[:count], *revision.scalars(problem), *handles[count:], ctypes.byref(size), ctypes.byref(executor))
        if status:
            self.check_status(api, status, self.description.phase1)
        return executor, size.value


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
        if array is not None and array.closed:
            raise HandleClosedError(f"{name} is a closed DeviceArray; its device memory was freed")


def wait_for_other_writers(arrays: Iterable[DeviceArray], stream: Stream) -> None:
    """A launch on `stream` reads these: wait for writes queued on any other stream."""
    for array in arrays:
        pending = array.pending
        if pending is not None and pending is not stream:
            array.wait_for_writer()


def mark_written(outputs: Iterable[Optional[DeviceArray]], stream: Stream) -> None:
    """Records the stream whose queued work writes these arrays (their readers wait for it)."""
    for array in outputs:
        if array is not None:
            array.pending = stream
            if array._readers is not None:
                note_write(array, stream)


def note_write(array: DeviceArray, stream: Stream) -> None:
    """Tells the plans reading `array` on another stream to wait for this write."""
    # (callers check that array._readers is set: narrowing it here would cost every launch a test)
    for reader in list(array._readers.values()):   # type: ignore[union-attr]
        plan = reader()
        if plan is not None and plan.stream is not stream:
            plan._foreign_writes = True
            plan._hot.checked_at = -1   # (after the flag: the plan's next call sees both)


def start_reading(array: DeviceArray, plan: Plan) -> None:
    """Registers `plan` as a reader of `array` (kept after a rebinding: a stale reader only
    costs it one extra check)."""
    readers = array._readers
    if readers is None:
        readers = array._readers = {}
    reader = readers.get(id(plan))   # (an id is only unique among live objects: check the plan)
    if reader is None or reader() is not plan:
        readers[id(plan)] = weakref.ref(plan)


def stop_reading(array: DeviceArray, plan: Plan) -> None:
    if array._readers is not None:
        array._readers.pop(id(plan), None)


def lives_of(arrays: Iterable[DeviceArray]) -> List[Life]:
    lives: List[Life] = []
    for array in arrays:
        lives.extend(array._lives())
    return lives


class Executor(Owned):
    """The aclOpExecutor phase 1 returned, with the arrays it was made for.

    Single-use unless made repeatable: ``launch`` consumes a single-use one (CANN frees it),
    a repeatable one lives until close(). The arrays stay allocated while the executor holds
    them; a closed one makes ``launch`` fail.
    """

    _kind = "Executor"

    def __init__(self, operator: Operator, handle: Any, workspace_size: int, tensors: Sequence[object],
                 arrays: Dict[str, DeviceArray]) -> None:
        super().__init__()
        self.workspace_size = int(workspace_size)
        self.repeatable = False
        self.launches = 0
        self._operator = operator
        self._tensors = list(tensors)   # must outlive the executor
        self._arrays = dict(arrays)
        self._pinned = lives_of(self._arrays.values())
        pin(self._pinned)
        self._unpin = weakref.finalize(self, unpin, self._pinned)
        handle = ctypes.cast(handle, _ffi.aclOpExecutor_p)
        raw_destroy: Callable[[Any], int] = runtime_api().raw.aclDestroyAclOpExecutor

        def release(handle: Any = handle) -> int:
            return raw_destroy(handle)

        self._own(handle, release)

    def make_repeatable(self) -> None:
        """aclSetAclOpExecutorRepeatable: keep the executor for many launches."""
        self.check_open()
        runtime_api().aclSetAclOpExecutorRepeatable(self)
        self.repeatable = True

    def launch(self, stream: Optional[Stream] = None, workspace: Optional[DeviceBuffer] = None) -> None:
        """Phase 2 on `stream` (default stream if None). The work runs asynchronously: wait
        with stream.synchronize() or read an output with to_numpy(), which waits for its writer."""
        stream = stream_argument(stream)
        own = [self._life, stream._life]
        pin(own)   # a close() from another thread now waits for the end of this launch
        try:
            stream.check_open("stream")   # (closed before the pin)
            self._launch_pinned(stream, workspace)
        finally:
            unpin(own, stream._life)

    def _launch_pinned(self, stream: Stream, workspace: Optional[DeviceBuffer]) -> None:
        self.check_open("this repeatable Executor" if self.repeatable else
                        "this Executor (a single-use executor is consumed by its launch, or by close())")
        handle = self._as_parameter_
        epoch = close_epoch[0]
        check_open(self._arrays)
        outputs = [self._arrays[name] for name in self._operator.output_names if name in self._arrays]
        inputs = [a for name, a in self._arrays.items() if name not in self._operator.output_names]
        wait_for_other_writers(inputs, stream)
        if workspace is not None:
            if not isinstance(workspace, DeviceBuffer):
                raise TypeError(f"workspace must be an acl_swiglu.DeviceBuffer or None, got {type(workspace).__name__}")
            workspace.check_open("workspace")
            if self.workspace_size and workspace.nbytes < self.workspace_size:
                raise ArgumentError(f"workspace has {workspace.nbytes} bytes; phase 1 asked for {self.workspace_size}")
            used_on((workspace._life,), stream._life)
            self._launch_now(handle, workspace.ptr if self.workspace_size else None, stream)
        else:
            stream.run_with_workspace(self.workspace_size, lambda ptr: self._launch_now(handle, ptr, stream))
        mark_written(outputs, stream)
        used_on(self._pinned, stream._life)
        if not self.repeatable:
            self._unpin.detach()
            unpin(self._pinned, stream._life)
            self._pinned.clear()
        if close_epoch[0] != epoch:
            if self.repeatable:   # (a single-use one was consumed by the launch itself)
                self.check_open("this Executor")   # closed during the launch: the call must not succeed
            check_open(self._arrays)

    def _launch_now(self, handle: Any, workspace_ptr: Optional[int], stream: Stream) -> None:
        api = runtime_api()
        phase2 = self._operator.description.phase2
        status = getattr(api.hot, phase2)(ctypes.c_void_p(workspace_ptr), ctypes.c_uint64(self.workspace_size),
                                          handle, stream._address)
        self.launches += 1
        if not self.repeatable:
            # CANN consumed it, failed or not: never destroy it ourselves.
            self._disown()
        self._operator.check_status(api, status, phase2)

    def close(self) -> None:
        super().close()
        if self._unpin.detach() is not None:
            unpin(self._pinned)


def _host_input(operator: Operator, name: str, value: Any, stack: ExitStack) -> AclIntArray:
    """A host-values argument as an aclIntArray (read at phase 1: it can go right after)."""
    return stack.enter_context(AclIntArray(operator.description.host_values(name, value)))


def workspace_size(operator: Operator, arguments: Dict[str, Any]) -> Executor:
    """Phase 1 on device arrays: the Executor (``.workspace_size`` bytes of workspace needed)."""
    revision = operator.revision()
    problem = operator.validate_device(arguments, revision)
    for name in problem.outputs:
        if arguments.get(name) is None:
            raise ArgumentError(f"{name} is required: phase 1 needs every output tensor the call computes")
    arrays = operator.device_arrays(arguments, revision)
    check_open(arrays)
    api = runtime_api()
    with ExitStack() as stack:
        handles = [_host_input(operator, name, arguments[name], stack)
                   if name in revision.host_inputs and arguments.get(name) is not None else tensor_for(arguments.get(name))
                   for name in operator.slot_names]
        executor, size = operator.phase1(api, revision, problem, handles)
    tensors = [arrays[name]._tensor for name in arrays]
    return Executor(operator, executor, size, tensors, arrays)


def destroy_unlaunched(api: SimpleNamespace, executor: ctypes.c_void_p) -> None:
    """Destroys a single-use executor that never reached phase 2, while another error is raised
    (a failure here must not show up in the next error of this thread)."""
    if api.raw.aclDestroyAclOpExecutor(ctypes.cast(executor, _ffi.aclOpExecutor_p)):
        _ffi.drop_message(api.get_message)


def launch_single_use(operator: Operator, api: SimpleNamespace, executor: ctypes.c_void_p, size: int, stream: Stream) -> None:
    """Phase 2 of a single-use executor (consumed either way) with the stream's workspace."""
    launch: Callable[..., int] = getattr(api.hot, operator.description.phase2)
    size_argument, stream_address = ctypes.c_uint64(size), stream._address
    launched: List[bool] = []

    def run(ptr: Optional[int]) -> int:
        launched.append(True)
        return launch(ctypes.c_void_p(ptr), size_argument, executor, stream_address)

    try:
        status = stream.run_with_workspace(size, run)
    except BaseException:
        if not launched:   # the workspace could not be had: the executor was never handed over
            destroy_unlaunched(api, executor)
        raise
    operator.check_status(api, status, operator.description.phase2)


def device_call(operator: Operator, values: Sequence[Any], stream: Optional[Stream]) -> List[Optional[DeviceArray]]:
    """Both phases on device arrays, queued on `stream`; the outputs, in the operator's order
    (made when not given; None for one the call does not compute). Does not wait. `values` are
    the arguments in the order of ``operator.argument_names`` (the slots, then the scalars).

    The common case has a lean path: every array an open DeviceArray whose tensor exists, every
    output given, a layout validated before. It makes one pass over the arguments and takes one
    lock each way; anything else goes through the general path, which does the same and more."""
    revision = operator.revision()
    if stream is None:
        stream = default_stream()
    elif type(stream) is not Stream or stream._handle is None:
        stream = stream_argument(stream)
    epoch = close_epoch[0]   # (before the open checks: a close from here on shows in it)
    inputs = operator.input_count
    last = operator.last_call
    if last is not None and last.epoch == epoch and last.abi == revision.abi and last.stream is stream._life and \
            stream._workspace is last.workspace:
        # The same arguments as the last lean call, and nothing closed since: still open, same
        # tensors, same layouts. Only a write on another stream can have happened meanwhile.
        # (Bindings compare equal only as the same objects: the memo's came from DeviceArrays.)
        try:
            same = [array._bound for array in last.arrays(values)] == last.array_bounds
        except AttributeError:
            same = False   # not a DeviceArray where the last call had one
        if same and last.same_others(values):
            given = last.inputs(values)
            if [array.pending for array in given] != last.idle:
                for array in given:
                    pending = array.pending
                    if pending is not None and pending is not stream:
                        array.wait_for_writer()   # written on another stream
            return _launch_grouped(operator, values, stream, last)
    bounds: List[Any] = []
    lives: List[Life] = []
    add_bound, add_life = bounds.append, lives.append
    recipe = None
    for index, array in enumerate(values):
        kind = type(array)
        if kind is DeviceArray:
            bound = array._bound   # (address, life, layout id) of its tensor
            if bound is None or bound[1].closed:
                break
            add_bound(bound)
            add_life(bound[1])
            if index < inputs:
                pending = array.pending
                if pending is not None and pending is not stream:
                    array.wait_for_writer()   # written on another stream
        elif array is None or kind is float or kind is int or kind is bool:
            add_bound(array)   # an absent argument, or a scalar
        else:
            break
    else:
        key = _layout_key(revision, values)   # (never None here: every argument is of a cached kind)
        recipe = None if key is None else operator.device_recipes.get(key)
    if recipe is None or not recipe.complete:
        return _general_device_call(operator, revision, dict(zip(operator.argument_names, values)), stream)
    slots = operator.slot_count
    handles = [None if b is None else b[0] for b in bounds[:slots]]
    arguments = (*handles[:inputs], *recipe.scalars, *handles[inputs:])
    given_inputs = _picker([index for index in range(inputs) if values[index] is not None])
    array_positions = [index for index, value in enumerate(values) if type(value) is DeviceArray]
    other_positions = [index for index, value in enumerate(values) if type(value) is not DeviceArray]
    # (the call below pins each of these and records the stream on them: a repeat can hold
    # them as one group)
    workspace = stream._workspace
    used = [*lives, stream._life] if workspace is None else [*lives, stream._life, workspace._life]
    operator.last_call = _LastCall(
        epoch, revision.abi, stream._life, _picker(array_positions), [bounds[i] for i in array_positions],
        _same_objects(other_positions, values), arguments, tuple(handles),
        CallGroup(used), workspace, recipe, given_inputs, [None] * len(given_inputs(values)),
        _results_picker(recipe.outputs), [])
    return _launch_bound(operator, values, stream, epoch, recipe, arguments, lives)


def _same_objects(positions: Sequence[int], values: Sequence[Any]) -> Callable[[Sequence[Any]], bool]:
    """arguments -> whether arguments[p] is values[p] for each of `positions` (scalars compare as
    the same objects: a value equal in another type, such as True for 1.0, is not the same call)."""
    if len(positions) == 1:
        index, value = positions[0], values[positions[0]]
        return lambda arguments: arguments[index] is value
    picker, kept = _picker(positions), tuple(values[p] for p in positions)
    return lambda arguments: all(map(is_, picker(arguments), kept))


def _results_picker(positions: Sequence[int]) -> Callable[[Sequence[Any]], List[Any]]:
    """values -> [values[p] for p in positions], with None where p < 0."""
    if len(positions) > 1 and min(positions) >= 0:
        getter = itemgetter(*positions)
        return lambda values: list(getter(values))
    return lambda values: [None if position < 0 else values[position] for position in positions]


def _picker(indexes: Sequence[int]) -> Callable[[Sequence[Any]], Tuple[Any, ...]]:
    """values -> the tuple of values[i] for i in indexes (itemgetter, always a tuple)."""
    if len(indexes) > 1:
        return itemgetter(*indexes)
    if indexes:
        index = indexes[0]
        return lambda values: (values[index],)
    return lambda values: ()


class _LastCall(NamedTuple):
    """An operator's last lean device-level call: a call with the same arguments (the same
    objects: the arrays by their tensor bindings) on the same stream, nothing closed since, goes
    straight to its launch."""

    epoch: int
    abi: int
    stream: Life
    arrays: Callable[[Sequence[Any]], Tuple[Any, ...]]   # the DeviceArray arguments, from the arguments
    array_bounds: List[Any]     # their _bound
    same_others: Callable[[Sequence[Any]], bool]   # the other arguments (absent, or scalars) the same objects?
    arguments: Tuple[Any, ...]  # phase 1's arguments before &workspaceSize and &executor
    handles: Tuple[Any, ...]    # its tensor arguments alone, inputs then outputs
    group: CallGroup            # what a repeat holds: the arrays, the stream and its workspace
    workspace: Optional[DeviceBuffer]   # the stream's pooled workspace at the time
    recipe: "_DeviceRecipe"
    inputs: Callable[[Sequence[Any]], Tuple[Any, ...]]   # the input arrays given, from the arguments
    idle: List[None]            # their pending writers when none is queued: [None] * how many
    results: Callable[[Sequence[Any]], List[Optional[DeviceArray]]]   # the call's outputs, from the arguments
    native: List[Optional[LeanCall]]   # the repeat made from C, once a repeat built it (None: not possible)


def _launch_bound(operator: Operator, values: Sequence[Any], stream: Stream, epoch: int, recipe: "_DeviceRecipe",
                  arguments: Tuple[Any, ...], lives: List[Life]) -> List[Optional[DeviceArray]]:
    """Both phases of a lean device-level call on checked arguments; `lives` are pinned for the
    call's length, with the stream's pooled workspace."""
    workspace = stream._workspace
    if workspace is not None:
        lives.append(workspace._life)
    lives.append(stream._life)
    pin(lives)   # a close() from another thread now waits for the end of this call
    try:
        if close_epoch[0] != epoch:
            _check_call_open(dict(zip(operator.slot_names, values)), stream)
        results = _both_phases(operator, values, stream, recipe, arguments, workspace)
    finally:
        unpin(lives, stream._life)
    if close_epoch[0] != epoch:
        # closed by another thread during the call: it must not succeed
        _check_call_open(dict(zip(operator.slot_names, values)), stream)
    return results


def _launch_grouped(operator: Operator, values: Sequence[Any], stream: Stream,
                    last: _LastCall) -> List[Optional[DeviceArray]]:
    """A repeat of the last lean call: what it uses is held as one group for its length, and
    both phases are one call into the C helper when it can make them."""
    epoch = last.epoch
    stay: Visit = [last.group]   # (runtime.visit, inlined)
    try:
        enter(stay)   # a close() from another thread now waits for the end of this call
        api = runtime_api()
        native = last.native
        if not native:
            native.append(_lean_call_of(operator, api, last, stream))
        lean = native[0]
        hot = api.hot
        if close_epoch[0] != epoch or lean is None or (hot.rebound != lean.seen[0] and not lean.stands(hot)):
            if close_epoch[0] != epoch:
                # closed between the caller's check and the enter: it may be freed already
                _check_call_open(dict(zip(operator.slot_names, values)), stream)
            results = _both_phases(operator, values, stream, last.recipe, last.arguments, last.workspace)
        else:
            result = lean.call(lean.argument)
            if result:
                kind, status = result >> 32, status_of(result)
                if kind != NO_WORKSPACE:
                    description = operator.description
                    operator.check_status(api, status,
                                          description.phase1 if kind == PHASE1_FAILED else description.phase2)
                # Phase 1 wants more than the pool holds: nothing was launched.
                if status:
                    _ffi.drop_message(api.get_message)   # the destroy of the unused executor failed
                results = _both_phases(operator, values, stream, last.recipe, last.arguments, last.workspace)
            else:
                results = last.results(values)
                mark_written(results, stream)
    finally:
        leave(stay)
    if close_epoch[0] != epoch:
        _check_call_open(dict(zip(operator.slot_names, values)), stream)
    return results


def _lean_call_of(operator: Operator, api: SimpleNamespace, last: _LastCall, stream: Stream) -> Optional[LeanCall]:
    workspace = last.workspace
    address, capacity = None, 0
    if workspace is not None:
        handle = workspace._handle
        if handle is None:
            return None   # (the pool's buffer was closed meanwhile: the memo is stale anyway, its epoch moved)
        address, capacity = handle.value, workspace.nbytes
    description = operator.description
    return lean_call(api, description.phase1, description.phase2, description.phase1_thunk, last.handles,
                     last.recipe.scalars, address, capacity, stream._address)


def _both_phases(operator: Operator, values: Sequence[Any], stream: Stream, recipe: "_DeviceRecipe",
                 arguments: Tuple[Any, ...], workspace: Optional[DeviceBuffer]) -> List[Optional[DeviceArray]]:
    """Phase 1 and phase 2 of a lean call whose handles (and `workspace`, the stream's pooled
    one, if any) are held; the outputs, marked as written on the stream."""
    api = runtime_api()
    size = ctypes.c_uint64()
    executor = ctypes.c_void_p()
    status = getattr(api.hot, operator.description.phase1)(*arguments, ctypes.byref(size), ctypes.byref(executor))
    if status:
        operator.check_status(api, status, operator.description.phase1)
    nbytes = size.value
    # (held and open: the memory stays until the stream is past this work, even if the pool
    # replaces it meanwhile)
    address = None
    if nbytes and workspace is not None and workspace.nbytes >= nbytes:
        address = workspace._handle
        if workspace._life.closed:
            address = None
    if nbytes and address is None:
        launch_single_use(operator, api, executor, nbytes, stream)
    else:
        status = getattr(api.hot, operator.description.phase2)(
            address if nbytes else None, ctypes.c_uint64(nbytes), executor, stream._address)
        if status:
            operator.check_status(api, status, operator.description.phase2)
    results = [None if position < 0 else values[position] for position in recipe.outputs]
    mark_written(results, stream)
    return results


def _check_call_open(arrays: Mapping[str, Optional[DeviceArray]], stream: Stream) -> None:
    """A call's arrays and stream must still be open (after a close somewhere since it began)."""
    check_open(arrays)
    stream.check_open("stream")


def _general_device_call(operator: Operator, revision: Revision, arguments: Dict[str, Any],
                         stream: Stream) -> List[Optional[DeviceArray]]:
    problem = _device_recipe(operator, revision, arguments).problem
    epoch = close_epoch[0]
    arrays = operator.device_arrays(arguments, revision)
    check_open(arrays)   # before anything is made
    made: Dict[str, DeviceArray]
    host_arrays: List[AclIntArray]
    handles: List[Optional[Owned]]
    pinned: List[Life]
    held: List[Life]
    made, host_arrays, handles, pinned, held = {}, [], [], [], []
    outputs = operator.output_names
    computed = problem.outputs
    try:
        for name, (shape, dtype) in computed.items():
            if name not in arrays:   # fresh: nobody else can close them
                made[name] = arrays[name] = DeviceArray.empty(shape, dtype)
        for name in operator.slot_names:
            array = arrays.get(name)
            if array is not None:
                tensor = tensor_for(array)
                # (the memory also holds back the close of the array's tensor handle)
                pinned.append(tensor._life if array.buffer is None else array.buffer._life)
                handles.append(tensor)
                if name not in outputs and array.pending is not None and array.pending is not stream:
                    array.wait_for_writer()   # written on another stream
            elif name in revision.host_inputs and arguments.get(name) is not None:
                host = AclIntArray(operator.description.host_values(name, arguments[name]))
                host_arrays.append(host)   # read by phase 1: freed right after it
                handles.append(host)
            else:
                handles.append(None)
        # Pinned: a close() from another thread from here on leaves the handles to the end of
        # this call; one since the start makes the call fail (the epoch checks).
        pinned.append(stream._life)
        pin(pinned)
        held = pinned
        if close_epoch[0] != epoch:
            _check_call_open(arrays, stream)
        api = runtime_api()
        executor, size = operator.phase1(api, revision, problem, handles)
        for host in host_arrays:
            host.close()
        launch_single_use(operator, api, executor, size, stream)
    except BaseException:
        for host in host_arrays:
            host.close()
        unpin(held, stream._life)
        for array in made.values():
            array.close()
        raise
    results = [arrays[name] if name in computed else None for name in outputs]
    mark_written(results, stream)
    unpin(pinned, stream._life)
    if close_epoch[0] != epoch:
        _check_call_open(arrays, stream)   # closed by another thread during the call: it must not succeed
    return results


# ---- one-shot NumPy call ----

_thread_state = threading.local()
_thread_streams_lock = threading.Lock()
_thread_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()


def _reset_after_fork() -> None:
    global _thread_streams_lock, _thread_state
    _thread_streams_lock = threading.Lock()   # another thread may have held it at the fork
    _thread_state = threading.local()
    _thread_streams.clear()


at_fork_in_child(_reset_after_fork)


def thread_stream() -> Stream:
    """A private stream per thread for one-shot calls, so threads do not wait on each other.
    It (and its workspace) goes when the thread ends."""
    free_collected()   # e.g. the streams of threads that ended
    stream = getattr(_thread_state, "stream", None)
    if stream is None or stream.closed:
        stream = _new_thread_stream(None)
    return stream


def _new_thread_stream(visits: Optional[List[Visit]]) -> Stream:
    """Makes this thread's stream; given `visits`, enters its group (recorded there for the
    caller to leave) before another thread can see it: release_cached() closes the streams it
    can see."""
    stream = _thread_state.stream = Stream()
    group = _thread_state.group = CallGroup((stream._life,))   # what a one-shot call holds
    if visits is not None:
        stay = visit(group)
        visits.append(stay)
        enter(stay)
    with _thread_streams_lock:
        _thread_streams.add(stream)
    return stream


def release_cached() -> None:
    """Destroys the per-thread streams of one-shot calls and frees every cached workspace
    (they are made again on demand). Call it when no call is in flight, e.g. between tests."""
    if in_forked_child():
        return   # the parent's device resources are not this process's to free
    free_collected()
    with _thread_streams_lock:
        streams = list(_thread_streams)
        _thread_streams.clear()
    for stream in streams:
        stream.close()
    default_stream().release_workspace()


def _native(array: Any) -> Any:
    """A NumPy array in native byte order (a converted copy when it is not)."""
    if isinstance(array, np.ndarray) and not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    return array


def _layout_key(revision: Revision, values: Sequence[Any]) -> Optional[Tuple[Any, ...]]:
    """Everything an operator's validation (and a one-shot's arena layout) depends on: types,
    dtypes, shapes, strides, scalar values, in argument order; None when an argument is of a
    kind whose checks look at more (host values, sequences, subclasses), so they are not cached.
    (Each operator has its own caches: the operator is not part of the key.)"""
    key: List[Any] = [revision.abi]
    for value in values:
        kind = type(value)
        if value is None:
            key.append(None)
        elif kind is DeviceArray:
            key.append(value._layout_id)
        elif kind is np.ndarray:
            key.append((value.dtype, value.shape, value.strides))
        elif kind is float or kind is int or kind is bool:
            key.append((kind, value))
        else:
            return None
    return tuple(key)


def _remember(cache: Dict[Tuple[Any, ...], Any], key: Optional[Tuple[Any, ...]], entry: Any) -> None:
    if key is not None:
        if len(cache) >= _LAYOUT_CACHE_SIZE:
            cache.clear()
        cache[key] = entry


class _DeviceRecipe(NamedTuple):
    """What a device-level call with one layout of arguments needs from its validation."""

    problem: Any
    scalars: Tuple[Any, ...]   # the scalar C arguments, ready for the call
    outputs: Tuple[int, ...]   # per output slot: the argument position of a computed one, else -1
    complete: bool             # every computed output given, and no host-values argument


def _device_recipe(operator: Operator, revision: Revision, arguments: Mapping[str, Any]) -> _DeviceRecipe:
    """Validates a device-level call, once per layout of its arguments."""
    key = _layout_key(revision, [arguments.get(name) for name in operator.argument_names])
    recipe = operator.device_recipes.get(key) if key is not None else None
    if recipe is None:
        problem = operator.validate_device(dict(arguments), revision)
        complete = all(arguments.get(name) is not None for name in problem.outputs) and not any(
            arguments.get(name) is not None for name in revision.host_inputs)
        outputs = tuple(operator.argument_names.index(name) if name in problem.outputs else -1
                        for name in operator.output_names)
        recipe = _DeviceRecipe(problem, tuple(revision.scalars(problem)), outputs, complete)
        _remember(operator.device_recipes, key, recipe)
    return recipe


class _OneShotLayout(NamedTuple):
    """What a one-shot call with one layout of arguments needs before any data moves: the
    validated problem and where each array goes in the call's arena."""

    problem: Any
    arena: ArenaLayout
    inputs: Tuple[int, ...]   # the argument position of each arena input, in arena order
    slots: Tuple[int, ...]    # per operator slot: its arena index, or -1
    host_inputs: Tuple[Tuple[int, str], ...]   # (slot position, name) of each host-values argument given
    outputs: Tuple[Tuple[str, Tuple[int, ...], np.dtype], ...]   # the results, in arena order
    convert: bool             # an array is not in native byte order: convert it first
    stage: bool               # an input's strides cannot go to the device: copy it in C order first
    native: List[Optional[ArenaPhase1]]   # phase 1 for the helper's one-call run, once built (None: not possible)


_LAYOUT_CACHE_SIZE = 256


def _one_shot_layout(operator: Operator, revision: Revision, values: Sequence[Any]) -> _OneShotLayout:
    key = _layout_key(revision, values)
    layout = operator.one_shot_layouts.get(key) if key is not None else None
    if layout is None:
        convert = any(isinstance(v, np.ndarray) and not v.dtype.isnative for v in values)
        arguments = dict(zip(operator.argument_names, (_native(v) for v in values)))
        problem = operator.description.validate(arguments, revision, (np.ndarray,), "a numpy.ndarray", (), False)
        positions = [position for position, name in enumerate(operator.input_names)
                     if arguments.get(name) is not None and name not in revision.host_inputs]
        inputs = [(operator.input_names[p], arguments[operator.input_names[p]]) for p in positions]
        outputs = tuple((name, tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in problem.outputs.items())
        arena = arena_layout(inputs, outputs)
        order = [name for name, _ in arena.inputs] + [name for name, _ in arena.outputs]
        slots = tuple(order.index(name) if name in order else -1 for name in operator.slot_names)
        host_inputs = tuple((position, name) for position, name in enumerate(operator.slot_names)
                            if name in revision.host_inputs and arguments.get(name) is not None)
        stage = any(placement.make_contiguous for _, placement in arena.inputs)
        layout = _OneShotLayout(problem, arena, tuple(positions), slots, host_inputs, outputs, convert, stage, [])
        _remember(operator.one_shot_layouts, key, layout)
    return layout


def one_shot(operator: Operator, values: Sequence[Any]) -> Dict[str, np.ndarray]:
    """Both phases on NumPy arrays: copies to the device, runs, copies back; the outputs the
    call computes, as fresh host arrays by name. `values` are the arguments in the order of
    ``operator.argument_names`` (None for the outputs). Validation and the arena layout are
    computed once per layout of the arguments."""
    revision = operator.revision()
    layout = _one_shot_layout(operator, revision, values)
    if layout.convert:
        values = [_native(value) for value in values]
    results: List[np.ndarray] = []
    try:
        for name, shape, dtype in layout.outputs:
            results.append(np.empty(shape, dtype))
    except MemoryError:
        raise HostMemoryError(f"the result {name} has shape {shape}: it needs {math.prod(shape) * dtype.itemsize} "
                              "bytes, more than this host can allocate") from None
    visits: List[Visit] = []   # (left in the finally, whatever happens after the first)
    try:
        stream = _held_thread_stream(visits)
        api = runtime_api()
        helper = arena_helper(api, operator.description.phase2)
        if helper is not None:
            _one_shot_native(operator, revision, layout, values, results, api, helper, stream)
        else:
            _one_shot_steps(operator, revision, layout, values, results, api, stream)
    finally:
        for stay in visits:
            leave(stay)
    return {output[0]: result for output, result in zip(layout.outputs, results)}


def _held_thread_stream(visits: List[Visit]) -> Stream:
    """The thread's one-shot stream, held (its visit recorded in `visits`, for the caller to
    leave after the call): a release_cached() from another thread then destroys it only after
    this call."""
    free_collected()   # e.g. the streams of threads that ended
    stream: Optional[Stream] = getattr(_thread_state, "stream", None)
    if stream is not None and not stream.closed:
        stay = visit(_thread_state.group)
        visits.append(stay)
        enter(stay)
        if not stream._life.closed:   # (after enter: a close from here on defers the destroy)
            return stream
        leave(stay)   # (closed by another thread since)
    return _new_thread_stream(visits)


def _one_shot_native(operator: Operator, revision: Revision, layout: _OneShotLayout, values: Sequence[Any],
                     results: List[np.ndarray], api: SimpleNamespace, helper: ArenaHelper, stream: Stream) -> None:
    """The one-shot call through the C helper: all of it in one call (phase 1 through the
    operator's thunk), or, when phase 1 must be made from Python, the arena and every copy in
    and tensor in one call, phase 1, then phase 2, the synchronisation, the copies back and every
    release in another. The arena holds the workspace too, sized by the last call with this layout."""
    arena = layout.arena
    hosts = [values[position] for position in layout.inputs]
    if layout.stage:
        hosts = [np.ascontiguousarray(host) if placement.make_contiguous else host
                 for host, (_, placement) in zip(hosts, arena.inputs)]
    count = arena.arrays
    first_output = len(arena.inputs)
    capacity = arena.workspace[0]
    if HOST_DATA_OFFSET >= 0:   # (the helper reads each array's data pointer; the lists keep them alive)
        slots = arena.slots(*map(id, hosts), *map(id, results))
    else:
        slots = arena.slots(*[host_address(host) for host in hosts], *[host_address(result) for result in results])
    call = ArenaCall(None, arena.size + capacity, arena.size, capacity, 0, 0, ctypes.addressof(slots), None, 0,
                     HOST_DATA_OFFSET)
    phase1 = _arena_phase1_of(operator, revision, layout, api)
    description = operator.description
    if phase1 is not None:
        status = helper.run(helper.api, arena.native, count, first_output, ctypes.byref(call), phase1.argument,
                            stream._address)
    else:
        status = helper.open(helper.api, arena.native, count, first_output, ctypes.byref(call))
    buffer: Optional[DeviceBuffer] = None
    try:
        if status:
            if call.step == STEP_PHASE1 or call.step == STEP_LAUNCH:
                operator.check_status(api, status, description.phase1 if call.step == STEP_PHASE1 else description.phase2)
            helper.raise_failure(api, call, status)
        if phase1 is not None:
            if not call.executor:
                return   # done, everything released
            executor, size = ctypes.c_void_p(call.executor), call.workspace_size   # (more workspace than the arena's)
        else:
            handles: List[Any] = [None if index < 0 else ctypes.c_void_p(slots[count + index]) for index in layout.slots]
            if layout.host_inputs:
                with ExitStack() as stack:
                    for position, name in layout.host_inputs:   # read by phase 1: freed right after it
                        handles[position] = _host_input(operator, name, values[position], stack).address
                    executor, size = operator.phase1(api, revision, layout.problem, handles)
            else:
                executor, size = operator.phase1(api, revision, layout.problem, handles)
        if size > capacity:
            arena.workspace[0] = max(arena.workspace[0], size)   # the next call's arena holds it
            try:
                buffer, workspace = stream._take_workspace(size)
            except BaseException:
                destroy_unlaunched(api, executor)
                raise
        status = helper.finish(helper.api, arena.native, count, first_output, ctypes.byref(call), executor, size,
                               None if buffer is None else workspace, stream._address)
        if status:
            if call.step == STEP_LAUNCH:
                operator.check_status(api, status, description.phase2)
            helper.raise_failure(api, call, status)
    except BaseException:
        # (after the failure's message was read: the release's own failures are not reported)
        if helper.close(helper.api, count, ctypes.byref(call), stream._address):
            _ffi.drop_message(api.get_message)
        raise
    finally:
        if buffer is not None:
            unpin((buffer._life,), stream._life)


def _arena_phase1_of(operator: Operator, revision: Revision, layout: _OneShotLayout,
                     api: SimpleNamespace) -> Optional[ArenaPhase1]:
    """The layout's phase 1 for the helper's one-call run (built on its first use), or None:
    a host-values argument (made per call in Python), no thunk, or a wrapped phase 1."""
    native = layout.native
    if not native:
        record = None
        if not layout.host_inputs:
            record = arena_phase1(api, operator.description.phase1, operator.description.phase1_thunk,
                                  layout.slots, revision.scalars(layout.problem))
        native.append(record)
    phase1 = native[0]
    if phase1 is None:
        return None
    if phase1.api is not api or getattr(api.hot, operator.description.phase1) is not phase1.function:
        return None
    return phase1


def _one_shot_steps(operator: Operator, revision: Revision, layout: _OneShotLayout, values: Sequence[Any],
                    results: List[np.ndarray], api: SimpleNamespace, stream: Stream) -> None:
    """The one-shot call with one ctypes call per step (when the C helper is not there, or the
    ACL functions are wrapped)."""
    arena = layout.arena
    with CallScratch(api) as scratch:
        scratch.allocate_layout(arena)
        placed = [scratch.place(placement, values[position])
                  for position, (_, placement) in zip(layout.inputs, arena.inputs)]
        placed += [scratch.place(placement) for _, placement in arena.outputs]
        handles: List[Any] = [None if index < 0 else placed[index] for index in layout.slots]
        for position, name in layout.host_inputs:
            handles[position] = scratch.int_array(values[position])
        executor, size = operator.phase1(api, revision, layout.problem, handles)
        scratch.drain = stream._address
        launch_single_use(operator, api, executor, size, stream)
        _ffi.check(api, api.hot.aclrtSynchronizeStream(stream._address), "aclrtSynchronizeStream")
        for (_, placement), result in zip(arena.outputs, results):
            scratch.fetch(placement, result)
