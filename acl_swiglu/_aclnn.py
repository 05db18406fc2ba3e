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
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from . import _ffi
from ._arena import ArenaLayout, arena_layout, helper_api, host_address, raise_failure
from ._device import DeviceArray, Stream, default_stream, lives_of, order_launch, plain_array, record_launch
from ._operator import (Executor, Operator, OperatorDescription, Signature, check_open, device_arrays, host_lists,
                        layout_key, preset_outputs, remembered, stream_argument, views_of)
from ._plan import Binding, raise_launch_failure
from .errors import ArgumentError, HostMemoryError
from .tensor import TensorView
from .runtime import Life, Use, at_fork_in_child, current_device, free_collected, in_forked_child, release_due, state

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
_helper_apis: Dict[Tuple[int, int], Any] = {}
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
    streams: Optional[Dict[int, Stream]] = getattr(_thread_state, "streams", None)
    if streams is None:
        streams = _thread_state.streams = {}
    device = current_device()
    stream = streams.get(device)
    if stream is None or stream.closed:
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
            kept = [k for idle in operator.bindings.values() for k in idle]
            operator.bindings.clear()
            operator.generation += 1   # (executors out of the pool now are closed when put back)
        for executor in kept:
            executor.close()


def _host_array(name: str, value: Any) -> Any:
    """A NumPy array argument as the array it stands for: a subclass or a proxy becomes the plain
    ndarray over the same memory (read through its own view()), and an array in non-native byte
    order a converted copy."""
    return plain_array(value, name) if isinstance(value, np.ndarray) else value


class _OneShotLayout(NamedTuple):
    """What a one-shot call of one layout (and scalar values) needs before any data moves."""

    problem: Any
    scalars: bytes
    arena: ArenaLayout


def _one_shot_layout(operator: Operator, signature: Signature, values: List[Any]) -> _OneShotLayout:
    def make() -> _OneShotLayout:
        description = operator.description
        problem = description.validate(dict(zip(operator.argument_names, values)), signature.revision, False)
        return _OneShotLayout(problem, signature.pack_scalars(description.scalars(problem, signature.revision)),
                              arena_layout(operator, signature, values, problem.outputs, views_of(problem),
                                           preset_outputs(problem)))

    entry: _OneShotLayout = remembered(operator.one_shots, layout_key(signature.abi, values), _KEPT, make)
    return entry


def one_shot(operator: Operator, given: Dict[str, Any]) -> Dict[str, np.ndarray]:
    """Both phases on NumPy arrays (`given` by argument name): copies to the device, runs, copies
    back; the outputs the call computes, as fresh host arrays by name. Validation and the arena
    are made once per layout; what depends on the arrays' contents is checked on every call."""
    signature = operator.signature()
    names = operator.argument_names
    values = [given.get(name) for name in names]
    for index, value in enumerate(values):
        if value is not None and (type(value) is not np.ndarray or not value.dtype.isnative):
            values[index] = _host_array(names[index], value)
    layout = _one_shot_layout(operator, signature, values)
    description = operator.description
    description.guard(layout.problem, given, signature.revision)
    arena = layout.arena
    results = []
    for name, shape, dtype, preset in arena.outputs:
        try:
            results.append(np.zeros(shape, dtype) if preset else np.empty(shape, dtype))
        except MemoryError:
            raise HostMemoryError(f"the result {name} has shape {shape}: it needs "
                                  f"{math.prod(shape) * dtype.itemsize} bytes, more than this host can allocate") from None
    arrays: List[np.ndarray] = values   # type: ignore[assignment]   # (where the arena places an input: an array)
    hosts = [np.ascontiguousarray(arrays[position]) if restage else arrays[position]
             for position, restage in arena.inputs]
    addresses = arena.addresses.pack(*map(host_address, hosts), *map(host_address, results))
    lists = [description.host_values(operator.argument_names[p], values[p]) for p in arena.host_lists]
    api = operator.api()
    functions = _helper_apis.get((id(api), id(operator)))
    if functions is None:
        functions = _helper_apis[(id(api), id(operator))] = (api, helper_api(operator, api))
    report = (ctypes.c_uint64 * 4)()
    use = Use()
    try:
        stream = _held_thread_stream(use)
        status = api.hot.acl_swiglu_one_shot(functions[1].reference, arena.reference, addresses,
                                             b"".join(map(_host_list, lists)) if lists else None, layout.scalars,
                                             ctypes.c_uint64(arena.workspace[0]), stream._address, report)
    finally:
        use.let_go()
    if report[2] > arena.workspace[0]:
        arena.workspace[0] = report[2]   # (the next call's arena holds it)
    if status:
        raise_failure(operator, api, status, report[0])
    return dict(zip(arena.names, results))


def _host_list(values: np.ndarray) -> bytes:
    """(address, count) of an int64 array, as the helper reads a host list."""
    return int(values.ctypes.data).to_bytes(8, "little") + int(values.size).to_bytes(8, "little")


def _held_thread_stream(use: Use) -> Stream:
    """The thread's one-shot stream, held by `use`: a release_cached() from another thread then
    destroys it only after this call."""
    while True:
        stream = thread_stream()
        if use.add(stream._life):
            return stream


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
        hosts = host_lists(operator, signature, given) if signature.host_names else {}
        key = (layout.key or tuple(a._layout_id for a in arrays.values()), current_device(),
               tuple(tuple(v.tolist()) for v in hosts.values()) if hosts else ())
        _launch_kept(operator, signature, key, layout, arrays, hosts, stream)
    except BaseException:
        for array in made:
            array.close()
        raise
    return [arrays.get(name) for name in signature.output_names]


class _Kept:
    """A kept executor of device-level calls, and what its Use holds from one call to the next:
    the memory of the arrays it is bound to (the arrays themselves only weakly referenced), the
    stream and the workspace. While it waits in its operator's pool the Use is idle, which holds
    off no close(): what is closed meanwhile is freed at once, and the epoch has moved, so the
    next call binds again."""

    def __init__(self) -> None:
        self.binding: Optional[Binding] = None   # made by the first call's _bind
        self.use = Use()
        self.arrays: Tuple["weakref.ReferenceType[DeviceArray]", ...] = ()   # of its last checked launch
        self.stream: Optional[Life] = None
        self.checked_at = -1   # the epoch after its last checked launch (-1: bind and check first)
        self.ready = False     # matched the arrays of the call that took it out of the pool
        self._let_go = weakref.finalize(self, setattr, self.use, "active", False)

    def matches(self, arrays: Dict[str, DeviceArray], stream: Life, epoch: int) -> bool:
        """Whether it can launch as it stands (``ready``): bound to these very arrays and stream,
        and nothing closed and no access record changed (the epoch) since its last checked
        launch."""
        self.ready = False
        if self.checked_at != epoch or self.stream is not stream or len(self.arrays) != len(arrays):
            return False
        for bound, array in zip(self.arrays, arrays.values()):
            if bound() is not array:
                return False
        self.ready = True
        return True

    def close(self) -> None:
        self._let_go.detach()
        self.use.let_go()
        if self.binding is not None:
            self.binding.close()   # (freed once the calls queued with it are done)


def _launch_kept(operator: Operator, signature: Signature, key: Tuple[Any, ...], layout: _DeviceLayout,
                 arrays: Dict[str, DeviceArray], hosts: Dict[str, np.ndarray], stream: Stream) -> None:
    """Takes a kept executor of this key out of the operator's pool (or makes one), launches it,
    and puts it back. Out of the pool an executor is this call's alone: a call that finds none
    idle (another thread's, or its own from a gc callback, has it) makes its own."""
    kept: Optional[_Kept] = None
    generation = -1
    start = -1
    try:
        with state.lock:   # (closes and frees are decided under it: from here on a close fails the call)
            generation, start = operator.generation, state.epoch
            kept = _take_kept(operator.bindings, key, arrays, stream._life, start)
        if kept is None:
            kept = _Kept()
        _launch(operator, signature, kept, arrays, hosts, layout, stream, start)
    finally:
        if kept is not None:
            _put_back(operator, key, kept, generation)


_PER_LAYOUT = 2   # idle executors of one key before a call rebinds one instead of making another


def _take_kept(pool: "OrderedDict[Tuple[Any, ...], List[_Kept]]", key: Tuple[Any, ...],
               arrays: Dict[str, DeviceArray], stream: Life, epoch: int) -> Optional[_Kept]:
    """Under state.lock: the idle executor of this key ready for these arrays; else, when the key
    has its share idle, the least recently used (to bind again); else None (make one)."""
    idle = pool.get(key)
    if not idle:
        return None
    chosen = next((k for k in idle if k.matches(arrays, stream, epoch)), idle[0] if len(idle) >= _PER_LAYOUT else None)
    if chosen is not None:
        idle.remove(chosen)
        if not idle:
            del pool[key]
        chosen.use.idle = False
    return chosen


def _launch(operator: Operator, signature: Signature, kept: _Kept, arrays: Dict[str, DeviceArray],
            hosts: Dict[str, np.ndarray], layout: _DeviceLayout, stream: Stream, start: int) -> None:
    """Launches the executor on this call's arrays: at once when it is ready for them (as a plan
    does), else after binding it, holding them, and ordering the launch after other streams'."""
    life = stream._life
    checked = kept.ready
    kept.ready = False
    if not checked:
        _bind(operator, signature, kept, arrays, hosts, layout, stream)
        inputs = [arrays[name] for name in layout.inputs]
        outputs = [arrays[name] for name in layout.outputs]
        order_launch(inputs, outputs, life)
    kept.checked_at = -1
    binding = kept.binding
    assert binding is not None   # (bound)
    result = binding.launch_call(binding.launch_argument, 0)
    if result:
        raise_launch_failure(operator, operator.api(), result)
    expected = start if checked else record_launch(inputs, outputs, life, start)
    if state.epoch != expected:   # closed by another thread during the call: it must not succeed
        check_open(arrays)
        stream.check_open("stream")
    else:
        kept.checked_at = expected


def _bind(operator: Operator, signature: Signature, kept: _Kept, arrays: Dict[str, DeviceArray],
          hosts: Dict[str, np.ndarray], layout: _DeviceLayout, stream: Stream) -> None:
    """Holds this call's arrays and stream in the kept executor's Use (letting go of the ones
    before), and points the executor (made now, the first time) at them and at the stream's
    pooled workspace."""
    use, binding, life = kept.use, kept.binding, stream._life
    kept.arrays, kept.stream = (), None
    with state.lock:
        taken = use.hold_only([life, *lives_of(arrays.values()), *([binding._life] if binding else [])], life)
    if not taken:
        check_open(arrays)
        stream.check_open("stream")
    if binding is None:
        check_open(arrays)   # (also arrays without memory, which hold nothing)
        binding = kept.binding = Binding(operator, signature, arrays, hosts, layout.scalars, views_of(layout.problem))
        use.add(binding._life)
    else:
        binding.bind(arrays)
    size = binding.workspace_size
    binding.launch.workspace = stream.take_workspace(size, use) if size else None
    binding.launch.stream = stream._address.value
    kept.arrays, kept.stream = tuple(weakref.ref(array) for array in arrays.values()), life


def _put_back(operator: Operator, key: Tuple[Any, ...], kept: _Kept, generation: int) -> None:
    """Returns an executor to the pool, idle (the oldest idle one goes when the pool is full); one
    made before a release_cached() is closed instead."""
    with state.lock:
        spare: Optional[_Kept] = kept
        if generation == operator.generation and kept.binding is not None and not kept.binding.closed:
            kept.use.idle = True
            pool = operator.bindings
            pool.setdefault(key, []).append(kept)
            pool.move_to_end(key)
            spare = None
            if sum(map(len, pool.values())) > _BINDINGS_KEPT:
                oldest = next(iter(pool))
                spare = pool[oldest].pop(0)
                if not pool[oldest]:
                    del pool[oldest]
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
