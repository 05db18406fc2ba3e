"""The public ``Plan``: one repeatable executor of an operator (a ``Binding``, _operator.py)
for fixed layouts, whose tensors are rebound to arrays of the same layouts, for hot loops.

A plan call is made under the plan's lock. It launches at once when nothing changed since the
plan last checked (the epoch, runtime.state); otherwise it first checks that what it is bound to
is open, waits for other streams' work on its arrays, and afterwards records its own.
"""

from __future__ import annotations

import threading
from contextlib import suppress
import weakref
from types import TracebackType
from typing import Any, Dict, List, Mapping, Optional, Tuple, Type, TypeVar

import numpy as np

from ._checks import synchronize_flag
from ._device import (DeviceArray, DeviceBuffer, Stream, closed_array_error, is_closed, lives_of, order_launch,
                      record_launch)
from ._operator import (Binding, Operator, check_open, device_arrays, host_lists, preset_outputs, stream_argument,
                        views_of)
from .errors import ArgumentError, HandleClosedError
from .runtime import (Uncopyable, Use, _runtime, at_fork_in_child, in_forked_child, refuse_inside_own_call,
                      release_due, runtime_api, state)


_plans: "weakref.WeakSet[Plan]" = weakref.WeakSet()
_Self = TypeVar("_Self", bound="Plan")


class Plan(Uncopyable):
    """A repeatable executor of `operator` for fixed shapes, dtypes and options, for hot loops.

    Built once from device arrays (their layouts are the plan's; their addresses the first
    binding). Each call rebinds only the addresses that changed (aclSetInputTensorAddr /
    aclSetOutputTensorAddr on the plan's own tensor handles) and launches phase 2 on the plan's
    stream. Calls are serialised by the plan's lock, so one plan may be shared between threads;
    a call made from inside another call of the same plan (a gc callback, a finalizer) is refused.
    """

    _operator: Operator   # set by each operator's subclass

    def __init__(self, arguments: Dict[str, Any], stream: Optional[Stream]) -> None:
        operator = self._operator
        signature = self._signature = operator.signature()
        values = [arguments.get(name) for name in operator.argument_names]
        problem = self._problem = operator.problem(signature, arguments, values, True)
        self._stream = stream_argument(stream)
        # (an RLock knows the thread holding it, _is_owned(): a call from inside a call is refused)
        self._lock: Any = threading.RLock()
        self._closed = False
        self._checked_at = -1   # the epoch the plan last checked its bindings at (-1: check first)
        self._binding: Optional[Binding] = None
        self._retired: List[Binding] = []   # executors rebinds replaced, closed before the next launch
        self._workspace: Optional[DeviceBuffer] = None
        self._owned_outputs: List[DeviceArray] = []
        self._use = Use((self._stream._life,), self._stream._life)   # what the plan holds, until close() or collection
        self._let_go = weakref.finalize(self, setattr, self._use, "active", False)
        _plans.add(self)
        try:
            if not self._use.take():
                self._stream.check_open("stream")
            guarded = operator.description.guard(problem, arguments, signature.revision)
            for name, (shape, dtype) in problem.outputs.items():
                if arguments.get(name) is None:
                    arguments[name] = DeviceArray.zeros(shape, dtype) if name in preset_outputs(problem) else \
                        DeviceArray.empty(shape, dtype)
                    self._owned_outputs.append(arguments[name])
            self._arrays = device_arrays(signature, arguments)
            check_open(self._arrays)
            for life in lives_of(self._arrays.values()):
                self._use.add(life)
            self._arguments = dict(arguments)
            self._guarded = guarded
            scalars = operator.description.scalars(problem, signature.revision)
            self._scalars = scalars
            binding = self._binding = Binding(operator, signature, self._arrays,
                                              host_lists(operator, signature, arguments), scalars, views_of(problem))
            if binding.workspace_size:
                self._workspace = DeviceBuffer(binding.workspace_size)
                self._use.add(self._workspace._life)
            self._use.add(binding._life)
            self._point_launch()
        except BaseException:
            self.close()
            raise
        self._set_outputs()

    def _point_launch(self) -> None:
        binding = self._binding
        assert binding is not None
        binding._launch_args.stream = self._stream._address.value
        binding._launch_args.workspace = None if self._workspace is None else self._workspace.ptr
        self._launch_call, self._launch_argument = binding._launch_call, binding._launch_argument

    def _set_outputs(self) -> None:
        names = self._signature.output_names
        self._outputs = tuple(self._arrays.get(name) for name in names)
        self._inputs_bound = [a for name, a in self._arrays.items() if name not in names]
        self._outputs_bound = [a for a in self._outputs if a is not None]

    @property
    def stream(self) -> Stream:
        """The stream the plan's calls are queued on (fixed when the plan is built)."""
        return self._stream

    @property
    def workspace_size(self) -> int:
        """Bytes of workspace the plan's executor needs (0 once the plan is closed)."""
        return 0 if self._binding is None or self._closed else self._binding.workspace_size

    # -- calls --

    def __call__(self, *arrays: Any, synchronize: bool = False,
                 **named: Any) -> Tuple[Optional[DeviceArray], ...]:
        """plan(<inputs>..., *, <outputs>=..., synchronize=False): launches phase 2 with the given
        arrays rebound (others keep their last binding) and returns the bound outputs. Each value
        is a DeviceArray, or host values for a host-values input (revision 1's group_index). The work
        is queued on the plan's stream; with synchronize=True the call also waits for it (one
        C call for both)."""
        if synchronize is not True and synchronize is not False:
            synchronize = synchronize_flag(synchronize)
        lock = self._lock
        refuse_inside_own_call(lock, f"this {type(self).__name__}", "called")
        try:
            lock.acquire()   # (inside the try: the finally releases it whichever line an exception hits)
            if getattr(_runtime.local, "generation", -1) != _runtime.generation:
                runtime_api()   # (a thread's first call binds its device; in a forked child it refuses)
            if arrays or named:
                self._rebind(arrays, named)
            start = state.epoch
            checked = start == self._checked_at
            if not checked:
                self._prepare()
            elif self._guarded:
                self._operator.description.guard(self._problem, self._arguments, self._signature.revision)
            result = self._launch_call(self._launch_argument, synchronize)
            if result:
                self._operator.raise_launch_failure(result)
            expected = start if checked else record_launch(self._inputs_bound, self._outputs_bound,
                                                           self._stream._life, start)
            if state.epoch != expected:
                self._checked_at = -1
                self._check_bindings()   # something was closed during the launch: this call fails
            else:
                self._checked_at = expected
            return self._outputs
        finally:
            if lock._is_owned():
                lock.release()

    def _prepare(self) -> None:
        """Before a launch the epoch check did not clear: the executors rebinds replaced closed,
        the plan's Use holding exactly what it is bound to, the bindings open and pointed at, the
        guard passed, and other streams' work on the arrays done."""
        self._close_retired()
        binding = self._binding
        assert binding is not None
        stream = self._stream._life
        held = [stream, binding._life, *lives_of(self._arrays.values())]
        if self._workspace is not None:
            held.append(self._workspace._life)
        with state.lock:   # (exactly what the plan is bound to: what a rebind replaced is let go here)
            taken = self._use.hold_only(held, stream)
        if state.due:
            release_due()
        self._check_bindings()
        if not taken:   # (the plan's own executor or workspace: closed only by the plan)
            raise HandleClosedError(f"this {type(self).__name__}'s executor or workspace was closed")
        binding._rebind(self._arrays)
        self._point_launch()   # (what a rebind an exception cut short did not derive yet)
        self._set_outputs()
        self._operator.description.guard(self._problem, self._arguments, self._signature.revision)
        order_launch(self._inputs_bound, self._outputs_bound, stream)

    def _close_retired(self) -> None:
        """Closes the executors rebinds replaced (each freed once the plan lets go of it and the
        stream has passed its launches)."""
        while self._retired:
            self._retired[-1].close()
            self._retired.pop()

    def _check_bindings(self) -> None:
        """The plan, every bound array, and the stream must still be open."""
        if self._closed:
            raise HandleClosedError(f"this {type(self).__name__} was closed")
        check_open(self._arrays)
        self._stream.check_open("stream")

    def _rebind(self, arrays: Tuple[Any, ...], named: Dict[str, Any]) -> None:
        """Takes new arrays (and host values) for some parameters: all of them, or, when one is
        refused, none."""
        signature = self._signature
        order = signature.input_names
        if len(arrays) > len(order):
            raise TypeError(f"a plan takes at most {len(order)} positional arrays ({', '.join(order)}), "
                            f"got {len(arrays)}")
        given = dict(zip(order, arrays))
        for name, value in named.items():
            if name not in signature.handle_names:
                raise TypeError(f"a plan takes no argument {name!r}; it takes {', '.join(signature.handle_names)} "
                                "and synchronize")
            if name in given:
                raise TypeError(f"{name} given twice")
            given[name] = value
        if self._closed:
            raise HandleClosedError(f"this {type(self).__name__} was closed")
        current = self._binding
        assert current is not None
        binding = current
        changes: Dict[str, DeviceArray] = {}
        hosts: Dict[str, np.ndarray] = {}
        for name, value in given.items():
            if value is None:
                continue
            if name in signature.host_names:
                if name not in binding._host_values:
                    raise ArgumentError(f"the plan was built without {name}; build another plan to use it")
                hosts[name] = self._operator.description.host_values(name, value)
            elif value is not self._arrays.get(name):
                self._check_rebind(name, value)
                changes[name] = value
        new_hosts = {name: v for name, v in hosts.items() if tuple(int(x) for x in v) != binding._host_values[name]}
        if not changes and not new_hosts:
            return
        arguments = {**self._arguments, **changes, **hosts}
        guarded = self._operator.description.guard(self._problem, arguments, signature.revision)
        bound = {**self._arrays, **changes}
        self._checked_at = -1   # whatever happens from here, the next launch holds, binds and checks first
        if new_hosts:
            binding = self._regroup(bound, {**{n: np.asarray(v, np.int64) for n, v in binding._host_values.items()},
                                            **hosts})
        else:
            binding._rebind(bound)   # (an address that cannot be read refuses the rebind here)
        retired = self._retired if binding is current else [*self._retired, current]
        # The rebind takes effect in this one statement: an exception before it leaves the plan as
        # it was, after it as rebound (the next launch closes the executor it replaced, holds,
        # binds and points at what the plan is bound to).
        self._arrays, self._arguments, self._guarded, self._binding, self._retired = \
            bound, arguments, guarded, binding, retired

    def _check_rebind(self, name: str, array: Any) -> None:
        previous = self._arrays.get(name)
        if previous is None:
            raise ArgumentError(f"the plan was built without {name}; build another plan to use it")
        if not isinstance(array, DeviceArray):
            raise TypeError(f"{name} must be a DeviceArray, got {type(array).__name__}")
        if is_closed(array):
            raise closed_array_error(name)
        if array._layout != previous._layout:
            raise ArgumentError(f"{name} has layout (shape, dtype, strides, offset) {array.layout()}; the plan was "
                                f"built for {previous.layout()}")

    def _regroup(self, arrays: Mapping[str, DeviceArray], hosts: Mapping[str, np.ndarray]) -> Binding:
        """New host values are read at phase 1: a new executor, held by the plan, for the plan
        to switch to (it must fit the plan's workspace)."""
        binding = Binding(self._operator, self._signature, arrays, hosts, self._scalars, views_of(self._problem))
        if binding.workspace_size > (0 if self._workspace is None else self._workspace.nbytes):
            binding.close()
            raise ArgumentError(f"the new {', '.join(hosts)} need a larger workspace; build another plan")
        return binding

    # -- end --

    def close(self) -> None:
        """Destroys the executor and the plan's tensors, frees outputs the plan allocated (after
        the work queued with them is done), and lets go of the arrays it was bound to."""
        if in_forked_child():
            self._closed = True   # the parent's device state is not this process's to free
            return
        lock = self._lock
        refuse_inside_own_call(lock, f"this {type(self).__name__}", "closed")
        try:
            lock.acquire()
            if not self._closed:
                self._closed = True
                if self._binding is not None and not self._stream.closed:
                    # Reports a failure of queued work here. (Another thread may close the stream
                    # just now: as if it had been closed before.)
                    with suppress(HandleClosedError):
                        self._stream.synchronize()
        finally:
            if lock._is_owned():
                try:
                    if self._closed:   # (also finishes a close an exception cut short)
                        self._release()
                finally:
                    lock.release()

    def _release(self) -> None:
        """What close() frees, under the plan's lock; each step can be made again."""
        self._close_retired()
        if self._binding is not None:
            self._binding.close()
        for array in self._owned_outputs:
            array.close()
        if self._workspace is not None:
            self._workspace.close()
        self._let_go.detach()
        self._use.let_go()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def __repr__(self) -> str:
        name = type(self).__name__
        if self._closed:
            return f"<{name} closed>"
        shapes = ", ".join(f"{n}={a.shape}" for n, a in self._arrays.items())
        return f"<{name} {shapes} on {self._stream!r}, workspace {self.workspace_size} bytes>"

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        try:
            self.close()   # everything is released either way
        except Exception:
            if exc_type is None:
                raise   # (else the error already propagating is the one that matters)


def _reset_after_fork() -> None:
    """A parent thread may have held a plan's lock at the fork: the child's plans get new locks,
    and check before their next launch, which refuses (runtime_api) in the child."""
    for plan in list(_plans):
        plan._lock = threading.RLock()
        plan._checked_at = -1


at_fork_in_child(_reset_after_fork)
