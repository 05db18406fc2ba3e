"""The generic two-phase aclnn layer's calls: an operator is an ``OperatorDescription``
(_operator.py) and these drive it.

``one_shot`` (NumPy in, NumPy out: one call into the helper, everything freed before it returns),
``device_call`` (device arrays, queued on a stream, through a repeatable executor reused for
calls of the same layout), ``workspace_size`` (phase 1 only: an ``Executor`` whose ``launch``
is phase 2); the reusable plan is in _plan.py.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from operator import is_
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _ffi
from ._arena import ArenaLayout, arena_layout
from ._checks import plain_array
from ._device import DeviceArray, Stream, default_stream, lives_of, order_launch, record_launch
from ._operator import (Binding, Executor, Operator, OperatorDescription, Signature, check_open, device_arrays,
                        host_lists, layout_key, picker, preset_outputs, remembered, stream_argument, views_of)
from .errors import ArgumentError, HostMemoryError
from .runtime import (Life, Use, _runtime, at_fork_in_child, current_device, free_collected, in_forked_child,
                      release_due, runtime_api, state)

_operators: "weakref.WeakSet[Operator]" = weakref.WeakSet()


def register(description: OperatorDescription) -> Operator:
    """The operator of a description, known to release_cached()."""
    operator = Operator(description)
    _ffi.declare(operator.declarations())
    _operators.add(operator)
    return operator


# ---- one-shot NumPy call ----

_thread_state = threading.local()
_thread_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()   # (under state.lock)
_KEPT = 256


def _reset_after_fork() -> None:
    global _thread_state
    _thread_state = threading.local()
    _thread_streams.clear()


at_fork_in_child(_reset_after_fork)


def thread_stream() -> Stream:
    """This thread's own stream on its current device, for one-shot calls (threads do not wait
    on each other). It and its workspace go when the thread ends, or at release_cached()."""
    free_collected()   # e.g. the streams of threads that ended
    device = current_device()
    streams: Optional[Dict[Optional[int], Stream]] = getattr(_thread_state, "streams", None)
    if streams is None:
        streams = _thread_state.streams = {}
    stream = streams.get(device)
    if stream is None or stream._life.closed:
        stream = Stream()   # (on the new device if another thread's set_device() moved this one meanwhile)
        with state.lock:
            _thread_streams.add(stream)   # (listed before it is kept: release_cached() sees every kept one)
        streams[stream._device] = stream   # (kept by the device it is on, not the one looked up)
    return stream


def release_cached() -> None:
    """Destroys the per-thread streams of one-shot calls, frees every pooled workspace and the
    executors device-level calls keep (they are made again on demand). A call in flight keeps
    what it uses until it ends."""
    if in_forked_child():
        return   # the parent's device resources are not this process's to free
    free_collected()
    with state.lock:   # (re-entrant: a collection inside it may call release_cached() again)
        streams = list(_thread_streams)
    for stream in streams:
        stream.close()   # (a closed one stays listed until its thread lets go of it: closing it again does nothing)
    default_stream().release_workspace()
    for operator in list(_operators):
        with state.lock:
            kept = operator.kept[:]
            del operator.kept[:]
            operator.generation += 1   # (executors out of the pool now are closed when put back)
        for executor in kept:
            executor.close()


# Host arrays are read through NumPy's public interfaces only: the buffer protocol (a dtype it
# cannot name, such as bfloat16, exported as bytes), or ndarray.ctypes where the protocol cannot
# export an array writable and contiguous (read-only, strided or empty arrays).
addressof, from_buffer, BYTES = ctypes.addressof, ctypes.c_char.from_buffer, np.dtype(np.uint8)
_Report = ctypes.c_uint64 * 4   # the helper's report: [step, index, workspace size, releases that failed]


def _one_shot_layout(operator: Operator, signature: Signature, values: List[Any]) -> ArenaLayout:
    """Validates a layout of arguments and places its arena. An array in non-native byte order
    is converted in `values`, here and on each call of the layout."""
    names = operator.argument_names
    converted = tuple(index for index, value in enumerate(values)
                      if type(value) is np.ndarray and not value.dtype.isnative)
    for index in converted:
        values[index] = plain_array(values[index], names[index])
    description = operator.description
    problem = description.validate(dict(zip(names, values)), signature.revision, False)
    return arena_layout(operator, signature, values, problem,
                        signature.scalar_struct.pack(*description.scalars(problem, signature.revision)), converted,
                        problem.outputs, views_of(problem), preset_outputs(problem))


def one_shot(operator: Operator, given: Dict[str, Any]) -> List[Optional[np.ndarray]]:
    """Both phases on NumPy arrays (`given` by argument name): copies to the device, runs, copies
    back; the outputs, as fresh host arrays in the operator's order (None for one the call does
    not compute). Validation and the arena are made once per layout; what depends on the arrays'
    contents is checked on every call."""
    signature = operator.signature()
    names = operator.argument_names
    values: List[Any] = list(map(given.get, names))
    layout: ArenaLayout = remembered(operator.one_shots, layout_key(signature.abi, values, names), _KEPT,
                                     lambda: _one_shot_layout(operator, signature, values))
    for index in layout.converted:   # (again on the call that made the layout: converted already, unchanged)
        values[index] = plain_array(values[index], names[index])
    operator.description.guard(layout.problem, given, signature.revision)
    try:
        results = list(map(np.empty, layout.shapes, layout.dtypes))
    except MemoryError:
        size, name, shape = max((math.prod(shape) * dtype.itemsize, name, shape)   # (the largest result)
                                for name, shape, dtype in zip(layout.names, layout.shapes, layout.dtypes))
        raise HostMemoryError(f"the result {name} has shape {shape}: it needs {size} bytes, more than this host "
                              "can allocate") from None
    hosts = [*map(values.__getitem__, layout.inputs), *results]
    if layout.restage:   # (inputs whose strides the device cannot take: copied to C order)
        hosts = [np.ascontiguousarray(a) if restage else a for a, restage in zip(hosts, layout.restage)]
    try:
        exported = hosts.copy()
        for index in layout.as_bytes:
            exported[index] = exported[index].view(BYTES)
        addresses = list(map(addressof, map(from_buffer, exported)))
    except (TypeError, ValueError, BufferError):   # (read-only, strided or empty arrays)
        addresses = [int(array.ctypes.data) for array in hosts]
    if layout.host_lists:
        for position in layout.host_lists:
            host_list = operator.description.host_values(names[position], values[position])
            hosts.append(host_list)
            addresses += (int(host_list.ctypes.data), host_list.size)
    api = operator.api()
    table = operator.one_shot_table
    words = layout.pack(layout.workspace[0], *addresses)
    report = _Report()
    while True:
        stream = thread_stream()
        life = stream._life
        with life.lock:   # (a release_cached() from another thread destroys the stream only after this call)
            if not life.closed:
                status = api.hot.acl_swiglu_one_shot(table[1], layout.reference, words, stream._address, report)
                break
    if report[2] > layout.workspace[0]:
        layout.workspace[0] = report[2]   # (the next call's arena holds it)
    if status:
        operator.raise_one_shot_failure(status, report[0])
    if layout.slots is None:
        return results   # type: ignore[return-value]
    return [None if slot < 0 else results[slot] for slot in layout.slots]


# ---- device-level calls ----

_KEPT_EXECUTORS = 16   # per operator: the idle repeatable executors device-level calls keep


class _DeviceLayout(NamedTuple):
    """What a device-level call of one layout (and scalar values) needs from its validation."""

    problem: Any
    scalars: Tuple[Any, ...]
    given: Tuple[str, ...]     # the array arguments given (inputs, and the outputs given)
    missing: Tuple[Tuple[str, Tuple[int, ...], np.dtype], ...]   # computed outputs not given: made
    inputs: Tuple[str, ...]    # the arrays the call reads
    outputs: Tuple[str, ...]   # the arrays it writes
    key: Optional[Tuple[Any, ...]]
    preset: Tuple[str, ...]    # the outputs made zeroed (the operator may leave parts unwritten)
    # Outputs of no elements not given (placeholders an operator requires): one each, with no
    # memory, shared by every call of the layout.
    placeholders: Mapping[str, DeviceArray]
    arrays_of: Callable[[Sequence[Any]], Tuple[Any, ...]]   # picks a call's device arrays from its values
    others_of: Callable[[Sequence[Any]], Tuple[Any, ...]]   # picks its other values


def _device_layout(operator: Operator, signature: Signature, values: Sequence[Any]) -> _DeviceLayout:
    key = layout_key(signature.abi, values)

    def make() -> _DeviceLayout:
        description = operator.description
        arguments = dict(zip(operator.argument_names, values))
        problem = description.validate(arguments, signature.revision, True)
        given = tuple(name for name in signature.tensor_names if arguments.get(name) is not None)
        made = [(name, tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in problem.outputs.items()
                if arguments.get(name) is None]
        placeholders = {name: DeviceArray.empty(shape, dtype) for name, shape, dtype in made if not math.prod(shape)}
        at = [i for i, value in enumerate(values) if type(value) is DeviceArray]
        return _DeviceLayout(problem, tuple(description.scalars(problem, signature.revision)), given,
                             tuple(m for m in made if m[0] not in placeholders),
                             tuple(name for name in given if name not in signature.output_names),
                             tuple(name for name in signature.output_names
                                   if name in problem.outputs and name not in placeholders), key,
                             tuple(preset_outputs(problem)), placeholders, picker(at),
                             picker([i for i in range(len(values)) if i not in at]))

    entry: _DeviceLayout = remembered(operator.device_layouts, key, _KEPT, make)
    return entry


def device_call(operator: Operator, given: Dict[str, Any], stream: Optional[Stream]) -> Tuple[Optional[DeviceArray], ...]:
    """Both phases on device arrays (`given` by argument name), queued on `stream`; the outputs,
    in the operator's order (made when not given; None for one the call does not compute). Does
    not wait. Runs a kept executor of the call's layout (docs/architecture.md): its repeat at
    once, else after validating and binding; what depends on contents is checked every time."""
    signature = operator.signature()
    if stream is None:
        stream = default_stream()
    elif type(stream) is not Stream or stream._life.closed:
        stream = stream_argument(stream)   # (a subclass, or the error naming what is wrong)
    try:
        values: Sequence[Any] = operator.values_of(given)
    except KeyError:   # (some argument not given at all)
        values = tuple(map(given.get, operator.argument_names))
    kept: Optional[_Kept] = None
    generation = start = -1
    try:
        with state.lock:   # (closes and frees are decided under it: from here on a close fails the call)
            generation, start = operator.generation, state.epoch
            kept = _take_repeat(operator.kept, values, signature.abi, stream._life, start)
        if kept is not None:
            operator.description.guard(kept.layout.problem, given, signature.revision)
            _launch(operator, kept, given, stream, start)
            outputs, placeholders = signature.outputs_of(values), kept.layout.placeholders
            if placeholders:   # (the layout's own, for outputs of no elements not given)
                outputs = tuple(placeholders.get(name) if array is None else array
                                for name, array in zip(signature.output_names, outputs))
            return outputs
    finally:
        if kept is not None:
            _put_back(operator, kept, generation)
    return _bind_and_launch(operator, signature, given, values, stream)


def _bind_and_launch(operator: Operator, signature: Signature, given: Dict[str, Any], values: Sequence[Any],
                     stream: Stream) -> Tuple[Optional[DeviceArray], ...]:
    """A device-level call that is no kept executor's repeat: validated, its missing outputs made,
    an executor of its key taken out of the pool (or made), bound, launched and put back."""
    layout = _device_layout(operator, signature, values)
    operator.description.guard(layout.problem, given, signature.revision)
    arrays = {name: given[name] for name in layout.given}
    if layout.missing:
        check_open(arrays)   # (before anything is made; else the launch's hold checks them)
    arrays.update(layout.placeholders)
    made: List[DeviceArray] = []
    kept: Optional[_Kept] = None
    generation = start = -1
    try:
        for name, shape, dtype in layout.missing:
            made.append(DeviceArray.zeros(shape, dtype) if name in layout.preset else DeviceArray.empty(shape, dtype))
            arrays[name] = made[-1]
        hosts = host_lists(operator, signature, given) if signature.host_names else {}
        # What phase 1 made the executor from: the layout (or, where the layout is not kept, the
        # revision, the arrays' layouts and the scalars), the device and the host values.
        shape = layout.key or (signature.abi, tuple((name, a._layout) for name, a in arrays.items()), layout.scalars)
        key = (shape, current_device(), tuple(tuple(v.tolist()) for v in hosts.values()) if hosts else ())
        with state.lock:   # (closes and frees are decided under it: from here on a close fails the call)
            generation, start = operator.generation, state.epoch
            kept = _take_kept(operator.kept, key)
        if kept is None:
            kept = _Kept(layout, key)
        _bind(operator, signature, kept, arrays, hosts, stream)
        order_launch([arrays[name] for name in layout.inputs], [arrays[name] for name in layout.outputs], stream._life)
        _launch(operator, kept, arrays, stream, start, layout)
        # A repeat needs the very same arguments again: not so with outputs made here, host values
        # (read at phase 1, and a list may change in place), or arguments whose checks are never
        # reused (their layout is not kept).
        if not (made or hosts or layout.key is None):
            kept.remember(signature.abi, values, stream._life)
    except BaseException:
        for array in made:
            array.close()
        raise
    finally:
        if kept is not None:
            _put_back(operator, kept, generation)
    return tuple(arrays.get(name) for name in signature.output_names)


_PLAIN = (type(None), bool, int, float, str)
_reference = weakref.ref


class _Arguments(NamedTuple):
    """What a kept executor's repeat must give again: its revision, stream and device, the very
    arrays (``weakref.ref(array)`` gives the same reference while that array lives) and the
    other values, of the same types."""

    abi: int
    stream: Life
    device: int
    references: Tuple["weakref.ReferenceType[DeviceArray]", ...]
    types: Tuple[type, ...]   # of the other values
    values: Tuple[Any, ...]


class _Kept:
    """A kept executor of device-level calls (one layout, device and host values) and its Use,
    idle while it waits in its operator's pool. A call with the very arguments of its last
    checked launch (the arrays known by weak reference), with the epoch unmoved since, is its
    repeat (docs/concurrency.md)."""

    def __init__(self, layout: "_DeviceLayout", key: Tuple[Any, ...]) -> None:
        self.layout, self.key = layout, key   # (the key: its layout, device and host values)
        self.binding: Optional[Binding] = None   # made by the first call's _bind
        self.use = Use()
        self.arguments: Optional[_Arguments] = None   # of its last checked launch
        self.checked_at = -1   # the epoch after its last checked launch (-1: bind and check first)
        self.first = 0   # id() of the first value of that launch: a quick way to pass over others
        self._let_go = weakref.finalize(self, setattr, self.use, "active", False)

    def remember(self, abi: int, values: Sequence[Any], stream: Life) -> None:
        """After its checked launch: the arguments a repeat must give again (none are kept when
        a value other than an array is not a plain number, string or None, whose == is its own)."""
        layout = self.layout
        others = layout.others_of(values)
        if all(type(value) in _PLAIN for value in others):
            self.first = id(values[0])
            self.arguments = _Arguments(abi, stream, self.key[1], tuple(map(_reference, layout.arrays_of(values))),
                                        tuple(map(type, others)), others)

    def repeats(self, values: Sequence[Any], abi: int, stream: Life, device: int) -> bool:
        """Whether this call is its repeat (the epoch aside): the very same arrays, and the other
        values of the same types (compared first: only then is their == a plain one) and equal."""
        was = self.arguments
        if was is None or was.abi != abi or was.stream is not stream or was.device != device:
            return False
        layout = self.layout
        try:
            same = all(map(is_, map(_reference, layout.arrays_of(values)), was.references))
        except TypeError:   # (a value there that no weak reference can point to: None, a number)
            return False
        others = layout.others_of(values)
        return same and all(map(is_, map(type, others), was.types)) and others == was.values

    def close(self) -> None:
        self._let_go.detach()
        self.use.let_go()
        if self.binding is not None:
            self.binding.close()   # (freed once the calls queued with it are done)


def _take_repeat(idle: List[_Kept], values: Sequence[Any], abi: int, stream: Life, epoch: int) -> Optional[_Kept]:
    """Under state.lock: the idle executor this call repeats, ready to launch as it stands, or
    None."""
    if getattr(_runtime.local, "generation", -1) != _runtime.generation:
        runtime_api()   # (a thread's first call binds its device; in a forked child it refuses)
    device, first = _runtime.local.device, id(values[0])
    for kept in reversed(idle):
        if kept.checked_at == epoch and kept.first == first and kept.repeats(values, abi, stream, device):
            idle.remove(kept)
            kept.use.idle = False
            return kept
    return None


# Idle executors of one key before a call rebinds one instead of making another: so many argument
# sets of one layout (a model's layers, each with its own buffers) can take turns, each call a repeat.
_PER_LAYOUT = 8


def _take_kept(idle: List[_Kept], key: Tuple[Any, ...]) -> Optional[_Kept]:
    """Under state.lock: when the key has its share of idle executors, the least recently used
    (to bind again); else None (make one)."""
    same = [kept for kept in idle if kept.key == key]
    if len(same) < _PER_LAYOUT:
        return None
    chosen = same[0]
    idle.remove(chosen)
    chosen.use.idle = False
    return chosen


def _launch(operator: Operator, kept: _Kept, arrays: Mapping[str, Any], stream: Stream, start: int,
            bound: Optional[_DeviceLayout] = None) -> None:
    """Queues the executor's phase 2 on the stream. A launch that was bound now (`bound`: its
    layout) records its accesses; a repeat's are recorded already. A call that overlaps a close
    of what it uses fails."""
    kept.checked_at = -1
    binding = kept.binding
    assert binding is not None   # (bound)
    result = binding._launch_call(binding._launch_argument, 0)
    if result:
        operator.raise_launch_failure(result)
    life = stream._life
    expected = start if bound is None else record_launch([arrays[name] for name in bound.inputs],
                                                         [arrays[name] for name in bound.outputs], life, start)
    if state.epoch != expected:   # closed by another thread during the call: it must not succeed
        check_open({name: value for name, value in arrays.items() if isinstance(value, DeviceArray)})
        stream.check_open("stream")
    else:
        kept.checked_at = expected


def _bind(operator: Operator, signature: Signature, kept: _Kept, arrays: Dict[str, DeviceArray],
          hosts: Dict[str, np.ndarray], stream: Stream) -> None:
    """Holds this call's arrays and stream in the kept executor's Use (letting go of the ones
    before), and points the executor (made now, the first time) at them and at the stream's
    pooled workspace."""
    use, binding, life = kept.use, kept.binding, stream._life
    kept.arguments = None
    with state.lock:
        taken = use.hold_only([life, *lives_of(arrays.values()), *([binding._life] if binding else [])], life)
    if not taken:
        check_open(arrays)
        stream.check_open("stream")
    if binding is None:
        check_open(arrays)   # (also arrays without memory, which hold nothing)
        layout = kept.layout
        binding = kept.binding = Binding(operator, signature, arrays, hosts, layout.scalars, views_of(layout.problem))
        use.add(binding._life)
    else:
        binding._rebind(arrays)
    size = binding.workspace_size
    binding._launch_args.workspace = stream.take_workspace(size, use) if size else None
    binding._launch_args.stream = stream._address.value


def _put_back(operator: Operator, kept: _Kept, generation: int) -> None:
    """Returns an executor to the pool, idle (the oldest idle one goes when the pool is full); one
    made before a release_cached() is closed instead."""
    with state.lock:
        spare: Optional[_Kept] = kept
        if generation == operator.generation and kept.binding is not None and not kept.binding.closed:
            kept.use.idle = True
            operator.kept.append(kept)
            spare = operator.kept.pop(0) if len(operator.kept) > _KEPT_EXECUTORS else None
    if spare is not None:
        spare.close()
    elif state.due or state.collected:
        release_due()   # (what was closed while this call held it)


def workspace_size(operator: Operator, arguments: Dict[str, Any]) -> Executor:
    """Phase 1 on device arrays: the Executor (``.workspace_size`` bytes of workspace needed)."""
    signature = operator.signature()
    values = [arguments.get(name) for name in operator.argument_names]
    problem = operator.problem(signature, arguments, values, True)
    operator.description.guard(problem, arguments, signature.revision)
    for name in problem.outputs:
        if arguments.get(name) is None:
            raise ArgumentError(f"{name} is required: phase 1 needs every output tensor the call computes")
    arrays = device_arrays(signature, arguments)
    check_open(arrays)
    return Executor(operator, signature, arrays, host_lists(operator, signature, arguments),
                    operator.description.scalars(problem, signature.revision), views_of(problem))
