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
from collections import OrderedDict
from threading import get_ident
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from . import _ffi
from ._arena import ArenaLayout, HelperApi, arena_layout, helper_api, raise_failure
from ._device import DeviceArray, Stream, default_stream, lives_of, order_launch, plain_array, record_launch
from ._operator import (Executor, Operator, OperatorDescription, Signature, check_open, device_arrays, host_lists,
                        layout_key, preset_outputs, remembered, stream_argument, views_of)
from ._plan import Binding, raise_launch_failure
from .errors import ArgumentError, HostMemoryError
from .tensor import TensorView
from .runtime import Use, at_fork_in_child, current_device, free_collected, in_forked_child, state

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
_helper_apis: Dict[Operator, Tuple[Any, HelperApi]] = {}   # the API they were made from, the helper's table
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
    streams: Optional[Dict[int, Stream]] = getattr(_thread_state, "streams", None)
    if streams is None:
        streams = _thread_state.streams = {}
    stream = streams.get(device)
    if stream is None or stream._life.closed:
        stream = Stream()
        with state.lock:
            _thread_streams.add(stream)   # (listed before it is kept: release_cached() sees every kept one)
        streams[device] = stream
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
            bindings = list(operator.bindings.values())
            operator.bindings.clear()
        for binding in bindings:
            binding.close()


# Host arrays are read through NumPy's public interfaces only: the buffer protocol (a dtype it
# cannot name, such as bfloat16, exported as bytes), or ndarray.ctypes where the protocol cannot
# export an array writable and contiguous (read-only, strided or empty arrays).
addressof, from_buffer, BYTES = ctypes.addressof, ctypes.c_char.from_buffer, np.dtype(np.uint8)
_Report = ctypes.c_uint64 * 4   # the helper's report: [step, index, workspace size, releases that failed]
_SCALAR_KINDS = (float, int, bool, str)


def _host_key(abi: int, names: Tuple[str, ...], values: List[Any]) -> Optional[Tuple[Any, ...]]:
    """What a one-shot call's layout depends on: types, dtypes, shapes, strides and scalar values,
    in argument order; None for an argument of another kind (a sequence, say): then nothing is
    reused. A NumPy array argument that is not a plain ndarray (a subclass, or a proxy) is made
    the plain ndarray over the same memory first, in `values` (read through its own view(): in
    native byte order, a converted copy)."""
    key: Optional[List[Any]] = [abi]
    for index, value in enumerate(values):
        kind = type(value)
        if kind is not np.ndarray and isinstance(value, np.ndarray):
            values[index] = value = plain_array(value, names[index])
            kind = np.ndarray
        if key is None:
            continue
        if kind is np.ndarray:
            key.append((value.dtype, value.shape, value.strides))
        elif value is None or kind in _SCALAR_KINDS:
            key.append((kind, value))
        else:
            key = None
    return None if key is None else tuple(key)


def _one_shot_layout(operator: Operator, signature: Signature, values: List[Any],
                     key: Optional[Tuple[Any, ...]]) -> ArenaLayout:
    """Validates a layout of arguments and places its arena (kept by `key`, unless None). An
    array in non-native byte order is converted in `values`, here and on each call of the layout."""
    names = operator.argument_names
    converted = tuple(index for index, value in enumerate(values)
                      if type(value) is np.ndarray and not value.dtype.isnative)
    for index in converted:
        values[index] = plain_array(values[index], names[index])
    description = operator.description
    problem = description.validate(dict(zip(names, values)), signature.revision, False)
    layout = arena_layout(operator, signature, values, problem,
                          signature.pack_scalars(description.scalars(problem, signature.revision)), converted,
                          problem.outputs, views_of(problem), preset_outputs(problem))
    if key is not None:
        with state.lock:
            if len(operator.one_shots) >= _KEPT:
                operator.one_shots.clear()
            operator.one_shots[key] = layout
    return layout


def one_shot(operator: Operator, given: Dict[str, Any]) -> List[Optional[np.ndarray]]:
    """Both phases on NumPy arrays (`given` by argument name): copies to the device, runs, copies
    back; the outputs, as fresh host arrays in the operator's order (None for one the call does
    not compute). Validation and the arena are made once per layout; what depends on the arrays'
    contents is checked on every call."""
    signature = operator.signature()
    names = operator.argument_names
    values: List[Any] = list(map(given.get, names))
    parts: List[Any] = [signature.abi]
    for value in values:   # (_host_key's common case inline: plain arrays, scalars and None)
        kind = type(value)
        if kind is np.ndarray:
            parts.append((value.dtype, value.shape, value.strides))
        elif value is None or kind in _SCALAR_KINDS:
            parts.append((kind, value))
        else:
            key = _host_key(signature.abi, names, values)
            break
    else:
        key = tuple(parts)
    layout = operator.one_shots.get(key) if key is not None else None
    if layout is None:
        layout = _one_shot_layout(operator, signature, values, key)
    else:
        for index in layout.converted:
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
    helper = _helper_apis.get(operator)
    if helper is None or helper[0] is not api:
        helper = _helper_apis[operator] = (api, helper_api(operator, api))
    words = layout.pack(layout.workspace[0], *addresses)
    report = _Report()
    use = Use()
    try:
        while True:   # (held: a release_cached() from another thread destroys it only after this call)
            stream = thread_stream()
            if use.add(stream._life):
                break
        status = api.hot.acl_swiglu_one_shot(helper[1].reference, layout.reference, words, stream._address, report)
    finally:
        use.let_go()
    if report[2] > layout.workspace[0]:
        layout.workspace[0] = report[2]   # (the next call's arena holds it)
    if status:
        raise_failure(operator, api, status, report[0])
    if layout.slots is None:
        return results   # type: ignore[return-value]
    return [None if slot < 0 else results[slot] for slot in layout.slots]


# ---- device-level calls ----

_BINDINGS_KEPT = 8   # per operator: the repeatable executors device-level calls reuse


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


def _device_layout(operator: Operator, signature: Signature, values: List[Any]) -> _DeviceLayout:
    key = layout_key(signature.abi, values)

    def make() -> _DeviceLayout:
        description = operator.description
        arguments = dict(zip(operator.argument_names, values))
        problem = description.validate(arguments, signature.revision, True)
        given = tuple(name for name in signature.tensor_names if arguments.get(name) is not None)
        made = [(name, tuple(shape), np.dtype(dtype)) for name, (shape, dtype) in problem.outputs.items()
                if arguments.get(name) is None]
        placeholders = {name: DeviceArray.empty(shape, dtype) for name, shape, dtype in made if not math.prod(shape)}
        return _DeviceLayout(problem, tuple(description.scalars(problem, signature.revision)), given,
                             tuple(m for m in made if m[0] not in placeholders),
                             tuple(name for name in given if name not in signature.output_names),
                             tuple(name for name in signature.output_names
                                   if name in problem.outputs and name not in placeholders), key,
                             tuple(preset_outputs(problem)), placeholders)

    entry: _DeviceLayout = remembered(operator.device_layouts, key, _KEPT, make)
    return entry


def device_call(operator: Operator, given: Dict[str, Any], stream: Optional[Stream]) -> List[Optional[DeviceArray]]:
    """Both phases on device arrays (`given` by argument name), queued on `stream`; the outputs,
    in the operator's order (made when not given; None for one the call does not compute). Does
    not wait.

    Phase 1 is made once per layout of the arguments (and device, scalar and host values): its
    repeatable executor is kept (a few per operator) and rebound to each call's addresses.
    Validation is reused for the same layout; what depends on contents is checked every call."""
    signature = operator.signature()
    stream = default_stream() if stream is None else stream_argument(stream)
    layout = _device_layout(operator, signature, [given.get(name) for name in operator.argument_names])
    operator.description.guard(layout.problem, given, signature.revision)
    arrays = {name: given[name] for name in layout.given}
    if layout.missing:
        check_open(arrays)   # (before anything is made; else the launch's hold checks them)
    arrays.update(layout.placeholders)
    made: List[DeviceArray] = []
    try:
        for name, shape, dtype in layout.missing:
            made.append(DeviceArray.zeros(shape, dtype) if name in layout.preset else DeviceArray.empty(shape, dtype))
            arrays[name] = made[-1]
        hosts = host_lists(operator, signature, given)
        key = (layout.key or tuple(a._layout_id for a in arrays.values()), current_device(),
               tuple(tuple(v.tolist()) for v in hosts.values()))
        _launch_kept(operator, signature, key, layout, arrays, hosts, stream)
    except BaseException:
        for array in made:
            array.close()
        raise
    return [arrays.get(name) for name in signature.output_names]


def _launch_kept(operator: Operator, signature: Signature, key: Tuple[Any, ...], layout: _DeviceLayout,
                 arrays: Dict[str, DeviceArray], hosts: Dict[str, np.ndarray], stream: Stream) -> None:
    """Rebinds the kept executor of this key (made first if needed) and launches it, holding the
    arrays and the stream from before the executor is made to after the launch is queued."""
    inputs = [arrays[name] for name in layout.inputs]
    outputs = [arrays[name] for name in layout.outputs]
    use = Use((stream._life, *lives_of(arrays.values())), stream._life)
    try:
        epoch = state.epoch
        if not use.take():
            check_open(arrays)
            stream.check_open("stream")
        views = views_of(layout.problem)
        binding = _binding(operator, signature, key, arrays, hosts, layout.scalars, views)
        while not use.add(binding._life):   # (dropped by release_cached() or evicted meanwhile)
            binding = _binding(operator, signature, key, arrays, hosts, layout.scalars, views)
        if binding.owner == get_ident():
            # A call from code run inside a call of this executor (a gc callback): its own executor.
            binding = Binding(operator, signature, arrays, hosts, layout.scalars, views)
            use.add(binding._life)
            binding.close()   # (freed when this call lets go, after the stream is past it)
        with binding.lock:
            _launch_locked(operator, binding, arrays, inputs, outputs, stream, use, epoch)
    finally:
        use.let_go()


def _launch_locked(operator: Operator, binding: Binding, arrays: Dict[str, DeviceArray], inputs: List[DeviceArray],
                   outputs: List[DeviceArray], stream: Stream, use: Use, epoch: int) -> None:
    """The launch, under the executor's lock. (A function of its own: a ``try`` right inside a
    ``with`` does not cover its own first line.)"""
    try:
        binding.owner = get_ident()
        binding.bind(arrays)
        launch = binding.launch
        launch.stream = stream._address.value
        size = binding.workspace_size
        launch.workspace = stream.take_workspace(size, use) if size else None
        order_launch(inputs, outputs, stream._life)
        result = binding.launch_call(binding.launch_argument, 0)
        if result:
            raise_launch_failure(operator, operator.api(), result)
        record_launch(inputs, outputs, stream._life)
        if state.epoch != epoch:   # closed by another thread during the call: it must not succeed
            check_open(arrays)
            stream.check_open("stream")
    finally:
        binding.owner = None


def _binding(operator: Operator, signature: Signature, key: Tuple[Any, ...], arrays: Dict[str, DeviceArray],
             hosts: Dict[str, np.ndarray], scalars: Tuple[Any, ...], views: Mapping[str, TensorView]) -> Binding:
    """The kept executor of this key, or a new one (the oldest kept one goes)."""
    bindings: "OrderedDict[Tuple[Any, ...], Binding]" = operator.bindings
    with state.lock:
        binding = bindings.get(key)
        if binding is not None and not binding.closed:
            bindings.move_to_end(key)
            return binding
    binding = Binding(operator, signature, arrays, hosts, scalars, views)
    with state.lock:
        bindings[key] = binding
        evicted = bindings.popitem(last=False)[1] if len(bindings) > _BINDINGS_KEPT else None
    if evicted is not None:
        evicted.close()   # (freed once the calls using it are done)
    return binding


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
