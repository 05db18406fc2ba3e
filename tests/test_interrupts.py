"""An exception can arrive at any line (KeyboardInterrupt, a signal handler that raises, an alarm):
whatever a function had acquired by then (a lock, a hold on a handle, a native handle, device
memory, a cache entry) must not stay held or leak, and the next call must work (SPEC section 8,
docs/concurrency.md).

Tested as a class: every function of the core that acquires something is listed below with an
operation that runs it; for each line of the function in turn, the operation runs with a trace
function that raises KeyboardInterrupt when the function first reaches that line. After each
run: the state lock is free, the next call completes (on another thread, with a time limit: a
lock left held would make it wait forever) with the right bits, and once the operation's objects
are closed and the caches released, the emulator's live handles are what they were before.
Lines inside ``finally`` and ``except`` blocks are not interrupted: an exception raised while
cleanup itself runs is beyond any Python construct (docs/concurrency.md). A scan of the core's
source checks that no acquiring function is missing from the list.
"""

from __future__ import annotations

import ast
import ctypes
import gc
import inspect
import os
import sys
import textwrap
import threading
from contextlib import ExitStack
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import device_model  # noqa: E402
from swiglu_cases import at_line, on_thread  # noqa: E402

import acl_swiglu  # noqa: E402
from acl_swiglu import _aclnn, _arena, _device, _ffi, _operator, _plan, emulator, runtime, tensor  # noqa: E402
from acl_swiglu.errors import HandleClosedError  # noqa: E402

pytestmark = pytest.mark.emulator_only

T, H = 6, 16
CLAMP = 1.5
JOIN = 30.0


def _case(seed: int = 3):
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((T, H)).astype(np.float32)
    x = rng.standard_normal((T, 2 * H)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, (T, 1)).astype(np.float32)
    yo = rng.standard_normal((T, H)).astype(np.float32)
    return gy, x, w, yo


CASE = _case()
GROUPS = np.array([2, 3], np.int64)
WANT = device_model.swiglu_group_quant_grad_model(*CASE, GROUPS, CLAMP)


def _same(got, want) -> bool:
    return got.shape == want.shape and np.array_equal(np.ascontiguousarray(got).view(np.uint32), want.view(np.uint32))


# ---- operations: each runs some acquiring functions, and has a check of its next call ----


class Operation:
    """setup() -> ctx (not interrupted); run(ctx) (interrupted); check(ctx) -> problem or None
    (the next, uninterrupted call); teardown(ctx)."""

    def setup(self, stack: ExitStack) -> Any:
        return None

    def run(self, ctx: Any) -> None:
        raise NotImplementedError

    def check(self, ctx: Any) -> Optional[str]:
        return None


def _forget_layouts() -> None:
    """Drops what one-shot calls made once (their layouts and the helper's table), so that the
    next call makes them again, interrupted or not."""
    op = acl_swiglu.op.SWIGLU_GROUP_QUANT_GRAD
    op.one_shots.clear()
    op._api = None


class OneShot(Operation):
    def __init__(self, abi: int = 2):
        self.abi = abi

    def setup(self, stack):
        _forget_layouts()
        acl_swiglu.release_cached()

    def run(self, ctx):
        return acl_swiglu.swiglu_group_quant_grad(*CASE, GROUPS, CLAMP)

    def check(self, ctx):
        gx, gw = self.run(ctx)
        return None if _same(gx, WANT[0]) and _same(gw, WANT[1]) else "wrong bits"


def _device_arrays(stack: ExitStack, abi: int):
    arrays = [stack.enter_context(acl_swiglu.to_device(a)) for a in CASE]
    groups = stack.enter_context(acl_swiglu.to_device(GROUPS)) if abi == 2 else GROUPS.tolist()
    return arrays, groups


class DeviceCall(Operation):
    def __init__(self, abi: int = 2, allocate: bool = False):
        self.abi, self.allocate = abi, allocate

    def setup(self, stack):
        arrays, groups = _device_arrays(stack, self.abi)
        stream = stack.enter_context(acl_swiglu.Stream())
        outputs = () if self.allocate else tuple(stack.enter_context(acl_swiglu.DeviceArray.empty(a.shape, np.float32))
                                                 for a in (CASE[1], CASE[2]))
        return arrays, groups, stream, outputs

    def run(self, ctx):
        arrays, groups, stream, outputs = ctx
        named = {"grad_x": outputs[0], "grad_weight": outputs[1]} if outputs else {}
        gx, gw = acl_swiglu.swiglu_group_quant_grad_device(*arrays, groups, CLAMP, stream=stream, **named)
        stream.synchronize()
        result = gx.to_numpy(), gw.to_numpy()
        if not outputs:
            gx.close()
            gw.close()
        return result

    def check(self, ctx):
        gx, gw = self.run(ctx)
        return None if _same(gx, WANT[0]) and _same(gw, WANT[1]) else "wrong bits"


class Phases(Operation):
    def __init__(self, repeatable: bool = False, explicit: bool = False):
        self.repeatable, self.explicit = repeatable, explicit

    def setup(self, stack):
        arrays, groups = _device_arrays(stack, 2)
        stream = stack.enter_context(acl_swiglu.Stream())
        outputs = [stack.enter_context(acl_swiglu.DeviceArray.empty(a.shape, np.float32)) for a in (CASE[1], CASE[2])]
        workspace = stack.enter_context(acl_swiglu.DeviceBuffer(1 << 16))
        return arrays, groups, stream, outputs, workspace

    def run(self, ctx):
        arrays, groups, stream, (gx, gw), workspace = ctx
        with acl_swiglu.get_workspace_size(*arrays, groups, CLAMP, grad_x=gx, grad_weight=gw) as executor:
            if self.repeatable:
                executor.make_repeatable()
            executor.launch(stream, workspace=workspace if self.explicit else None)
            stream.synchronize()
        return gx.to_numpy(), gw.to_numpy()

    def check(self, ctx):
        gx, gw = self.run(ctx)
        return None if _same(gx, WANT[0]) and _same(gw, WANT[1]) else "wrong bits"


class PlanBuild(Operation):
    def __init__(self, abi: int = 2):
        self.abi = abi

    def setup(self, stack):
        arrays, groups = _device_arrays(stack, self.abi)
        return arrays, groups, stack.enter_context(acl_swiglu.Stream())

    def run(self, ctx):
        arrays, groups, stream = ctx
        with acl_swiglu.SwigluGroupQuantGradPlan(*arrays, groups, CLAMP, stream=stream) as plan:
            plan(synchronize=True)
            return plan.grad_x.to_numpy(), plan.grad_weight.to_numpy()

    def check(self, ctx):
        gx, gw = self.run(ctx)
        return None if _same(gx, WANT[0]) and _same(gw, WANT[1]) else "wrong bits"


class PlanCall(Operation):
    """A plan built before; the interrupted call rebinds (every array, and in revision 1 the
    counts) or not."""

    def __init__(self, abi: int = 2, rebind: bool = False):
        self.abi, self.rebind = abi, rebind

    def setup(self, stack):
        arrays, groups = _device_arrays(stack, self.abi)
        second, groups2 = _device_arrays(stack, self.abi)
        if self.abi == 1:
            groups2 = [1, 4]   # (new counts: a new executor)
        stream = stack.enter_context(acl_swiglu.Stream())
        plan = stack.enter_context(acl_swiglu.SwigluGroupQuantGradPlan(*arrays, groups, CLAMP, stream=stream))
        plan(synchronize=True)
        return plan, arrays, groups, second, groups2

    def run(self, ctx):
        plan, arrays, groups, second, groups2 = ctx
        if self.rebind:
            plan(*second, group_index=groups2, synchronize=True)
        else:
            plan(synchronize=True)

    def check(self, ctx):
        plan, arrays, groups, _, _ = ctx
        gx, gw = plan(*arrays, group_index=groups, synchronize=True)
        return None if _same(gx.to_numpy(), WANT[0]) and _same(gw.to_numpy(), WANT[1]) else "wrong bits"


class PlanClose(Operation):
    def setup(self, stack):
        arrays, groups = _device_arrays(stack, 2)
        return arrays, groups, stack.enter_context(acl_swiglu.Stream()), []

    def run(self, ctx):
        arrays, groups, stream, plans = ctx
        plan = acl_swiglu.SwigluGroupQuantGradPlan(*arrays, groups, CLAMP, stream=stream)
        plans.append(plan)
        plan()
        plan.close()

    def check(self, ctx):
        for plan in ctx[3]:
            plan.close()   # (an interrupted close is finished by the next one)
            if not plan.closed:
                return "a close() after an interrupted one did not close the plan"
        return None


class Copies(Operation):
    """to_device, copy_from (waits for queued readers), to_numpy, a stream's synchronize."""

    def setup(self, stack):
        return stack.enter_context(acl_swiglu.Stream())

    def run(self, ctx):
        with acl_swiglu.to_device(CASE[0]) as d:
            d.copy_from(CASE[0] * 2)
            got = d.to_numpy()
        ctx.synchronize()
        return got

    def check(self, ctx):
        return None if np.array_equal(self.run(ctx), CASE[0] * 2) else "wrong values"


class Borrowed(Operation):
    """A framework's stream and memory: a stream borrowed by its handle and arrays wrapped by
    address, used by a device-level call."""

    def setup(self, stack):
        arrays, groups = _device_arrays(stack, 2)
        return arrays, groups, stack.enter_context(acl_swiglu.Stream())

    def run(self, ctx):
        arrays, groups, owner = ctx
        stream = acl_swiglu.Stream.from_handle(owner.handle)
        wrapped = [acl_swiglu.DeviceArray.wrap(a.ptr, a.shape, a.dtype) for a in arrays]
        gx, gw = acl_swiglu.swiglu_group_quant_grad_device(*wrapped, groups, CLAMP, stream=stream)
        with gx, gw:
            stream.synchronize()
            return gx.to_numpy(), gw.to_numpy()

    def check(self, ctx):
        gx, gw = self.run(ctx)
        return None if _same(gx, WANT[0]) and _same(gw, WANT[1]) else "wrong bits"


class StreamLifecycle(Operation):
    """A stream made, its pooled workspace taken by a call, the workspace released, the stream
    closed."""

    def setup(self, stack):
        arrays, _ = _device_arrays(stack, 2)
        return arrays

    def run(self, ctx):
        with acl_swiglu.Stream() as stream:
            gx, _ = acl_swiglu.swiglu_group_quant_grad_device(ctx[0], ctx[1], stream=stream)
            with gx:
                stream.synchronize()
                stream.release_workspace()

    def check(self, ctx):
        self.run(ctx)
        return None


class ReleaseCached(Operation):
    def setup(self, stack):
        arrays, groups = _device_arrays(stack, 2)
        return arrays, groups

    def run(self, ctx):
        arrays, groups = ctx
        acl_swiglu.swiglu_group_quant_grad(*CASE, GROUPS, CLAMP)
        gx, gw = acl_swiglu.swiglu_group_quant_grad_device(*arrays, groups, CLAMP)
        acl_swiglu.default_stream().synchronize()
        gx.close()
        gw.close()
        acl_swiglu.release_cached()

    def check(self, ctx):
        self.run(ctx)
        return None


class Collected(Operation):
    """Arrays and a plan dropped without close(): their finalizers close them."""

    def setup(self, stack):
        return stack.enter_context(acl_swiglu.Stream())

    def run(self, ctx):
        arrays = [acl_swiglu.to_device(a) for a in CASE[:2]]
        plan = acl_swiglu.SwigluGroupQuantGradPlan(*arrays, stream=ctx)
        plan()
        del arrays, plan
        gc.collect()
        acl_swiglu.release_cached()   # (frees what the collection left due)

    def check(self, ctx):
        self.run(ctx)
        return None


class NewThread(Operation):
    """A one-shot call on a thread that never used the package (it binds a device)."""

    def run(self, ctx):
        box: List[BaseException] = []

        def work():
            try:
                acl_swiglu.swiglu_group_quant_grad(*CASE, GROUPS, CLAMP)
            except BaseException as error:   # (raised again on the calling thread)
                box.append(error)

        thread = threading.Thread(target=work)   # (traced too: see _run_interrupted)
        thread.start()
        thread.join(JOIN)
        if box:
            raise box[0]

    def check(self, ctx):
        return OneShot().check(ctx)


class SetDevice(Operation):
    def run(self, ctx):
        acl_swiglu.set_device(0)
        acl_swiglu.swiglu_group_quant_grad(*CASE, GROUPS, CLAMP)

    def check(self, ctx):
        return OneShot().check(ctx)


# Every acquiring function of the core, with the operations that run it.
TARGETS: Dict[str, Tuple[Callable[..., Any], List[Operation]]] = {
    "runtime.Use.take": (runtime.Use.take, [Copies(), PlanBuild()]),
    "runtime.Use.hold_also": (runtime.Use.hold_also, [DeviceCall(), PlanBuild()]),
    "runtime.Use.hold_only": (runtime.Use.hold_only, [DeviceCall(), DeviceCall(abi=1)]),
    "runtime.Use.add": (runtime.Use.add, [DeviceCall(), PlanBuild()]),
    "runtime._Runtime.adopt": (runtime._Runtime.adopt, [Copies(), PlanBuild()]),
    "runtime._Runtime.bind_thread": (runtime._Runtime.bind_thread, [NewThread()]),
    "runtime._Runtime._initialise": (runtime._Runtime._initialise, [NewThread()]),
    "runtime._Runtime.set_device": (runtime._Runtime.set_device, [SetDevice()]),
    "runtime.Owned._prepare": (runtime.Owned._prepare, [Copies(), PlanBuild()]),
    "runtime._waiting": (runtime._waiting, [Copies(), PlanBuild(), Collected()]),
    "_device.StreamLife.__init__": (_device.StreamLife.__init__, [StreamLifecycle(), OneShot()]),
    "_device.StreamLife.wait": (_device.StreamLife.wait, [Copies(), DeviceCall()]),
    "_device.Stream.__init__": (_device.Stream.__init__, [StreamLifecycle(), OneShot()]),
    "_device.Stream.take_workspace": (_device.Stream.take_workspace, [StreamLifecycle(), DeviceCall()]),

    "_device.DeviceBuffer.__init__": (_device.DeviceBuffer.__init__, [Copies(), DeviceCall(allocate=True)]),
    "_device.DeviceBuffer._copy": (_device.DeviceBuffer._copy, [Copies()]),
    "_device.access_of": (_device.access_of, [Borrowed()]),
    "_device.Stream.from_handle": (_device.Stream.from_handle, [Borrowed()]),
    "_device.order_launch": (_device.order_launch, [DeviceCall(), PlanCall(rebind=True)]),
    "_device.record_launch": (_device.record_launch, [DeviceCall(), PlanCall(rebind=True)]),
    "_device.DeviceArray.wait_for_access": (_device.DeviceArray.wait_for_access, [Copies()]),
    "_device.to_device": (_device.to_device, [Copies()]),
    "_device.DeviceArray.empty": (_device.DeviceArray.empty, [DeviceCall(allocate=True)]),
    "tensor.AclTensor.__init__": (tensor.AclTensor.__init__, [Phases(), PlanBuild()]),
    "tensor.AclIntArray.__init__": (tensor.AclIntArray.__init__, [PlanBuild(abi=1), DeviceCall(abi=1)]),
    "_operator.Operator.problem": (_operator.Operator.problem, [PlanBuild()]),
    "_operator.remembered": (_operator.remembered, [PlanBuild(), DeviceCall()]),
    "_operator.Operator.api": (_operator.Operator.api, [OneShot()]),
    "_operator.Executor.__init__": (_operator.Executor.__init__, [Phases()]),
    "_operator.Executor.launch": (_operator.Executor.launch, [Phases(), Phases(repeatable=True, explicit=True)]),
    "_operator.Executor._launch": (_operator.Executor._launch, [Phases(), Phases(repeatable=True, explicit=True)]),
    "_operator.Executor.make_repeatable": (_operator.Executor.make_repeatable, [Phases(repeatable=True)]),
    "runtime.refuse_inside_own_call": (runtime.refuse_inside_own_call, [Phases(), PlanCall(), PlanClose()]),
    "_operator.Executor._finish_hand_over": (_operator.Executor._finish_hand_over, [Phases()]),
    "_operator.Binding._make_repeatable": (_operator.Binding._make_repeatable, [Phases(repeatable=True), PlanBuild()]),
    "_operator.Binding.__init__": (_operator.Binding.__init__, [Phases(), PlanBuild(), PlanBuild(abi=1), DeviceCall(),
                                                                PlanCall(abi=1, rebind=True)]),
    "_operator.Binding._rebind": (_operator.Binding._rebind, [PlanCall(rebind=True)]),
    "_plan.Plan.__init__": (_plan.Plan.__init__, [PlanBuild(), PlanBuild(abi=1)]),
    "_plan.Plan.__call__": (_plan.Plan.__call__, [PlanCall(), PlanCall(rebind=True)]),
    "_plan.Plan._prepare": (_plan.Plan._prepare, [PlanCall(rebind=True)]),
    "_plan.Plan._rebind": (_plan.Plan._rebind, [PlanCall(rebind=True), PlanCall(abi=1, rebind=True)]),
    "_plan.Plan._regroup": (_plan.Plan._regroup, [PlanCall(abi=1, rebind=True)]),
    "_aclnn.thread_stream": (_aclnn.thread_stream, [OneShot(), NewThread()]),
    "_aclnn.one_shot": (_aclnn.one_shot, [OneShot(), OneShot(abi=1)]),
    "_aclnn._one_shot_layout": (_aclnn._one_shot_layout, [OneShot()]),
    "_aclnn._device_layout": (_aclnn._device_layout, [DeviceCall()]),
    "_aclnn.device_call": (_aclnn.device_call, [DeviceCall(), DeviceCall(allocate=True), DeviceCall(abi=1)]),
    "_aclnn._Kept.__init__": (_aclnn._Kept.__init__, [DeviceCall()]),
    "_aclnn._bind": (_aclnn._bind, [DeviceCall(), DeviceCall(abi=1)]),
    "_aclnn._put_back": (_aclnn._put_back, [DeviceCall()]),
    "_aclnn._take_kept": (_aclnn._take_kept, [DeviceCall()]),
    "_aclnn._take_repeat": (_aclnn._take_repeat, [DeviceCall()]),
    "_aclnn._bind_and_launch": (_aclnn._bind_and_launch, [DeviceCall(), DeviceCall(allocate=True), DeviceCall(abi=1)]),
    "_aclnn.workspace_size": (_aclnn.workspace_size, [Phases()]),
    "_arena.arena_layout": (_arena.arena_layout, [OneShot()]),
}

# Acquiring (run at interpreter exit only, or a fork hook): checked by their own tests in
# subprocesses (tests/test_concurrency.py, tests/test_c_boundary.py).
ELSEWHERE = {"runtime._Runtime.shutdown", "runtime._after_fork_in_child", "_plan._reset_after_fork",
             "_aclnn._reset_after_fork"}

# Releases: what they let go of must be let go of when a release an exception cut short is made
# again (a second close(), the object's collection, the next call that frees what is due):
# RELEASES below, swept by test_an_interrupted_release_is_finished_by_the_next_one. Those only
# called from a finally block are the cleanup of the sweep above (not interrupted there).
RELEASES: Dict[str, Tuple[Callable[..., Any], List[Operation]]] = {
    "runtime.close_life": (runtime.close_life, [Copies(), PlanBuild()]),
    "runtime.release_due": (runtime.release_due, [Copies(), PlanBuild(), Collected()]),
    "runtime.free_collected": (runtime.free_collected, [Collected()]),
    "runtime._take_collected": (runtime._take_collected, [Collected()]),
    "runtime.Owned.close": (runtime.Owned.close, [Copies(), PlanClose()]),
    "runtime.Owned._disown": (runtime.Owned._disown, [Phases()]),
    "_device.Stream.release_workspace": (_device.Stream.release_workspace, [StreamLifecycle(), ReleaseCached()]),
    "_device.Stream.close": (_device.Stream.close, [StreamLifecycle()]),
    "runtime._free": (runtime._free, [Copies(), PlanBuild(), StreamLifecycle(), Collected()]),
    "runtime._next_due": (runtime._next_due, [Copies(), PlanBuild()]),
    "_device.DeviceArray.close": (_device.DeviceArray.close, [Copies()]),
    "_operator.Executor.close": (_operator.Executor.close, [Phases(repeatable=True)]),
    "_operator.Binding.close": (_operator.Binding.close, [Phases(repeatable=True), PlanClose()]),
    "_plan.Plan.close": (_plan.Plan.close, [PlanClose(), PlanBuild()]),
    "_aclnn.release_cached": (_aclnn.release_cached, [ReleaseCached()]),
}
CLEANUP = {"runtime.Use.let_go", "runtime._mark_closed",
           "runtime._Runtime.disown", "_operator.Executor._handed_over"}


def _interruptible_lines(function: Callable[..., Any]) -> List[int]:
    """The first line of each statement of `function`, outside finally and except blocks."""
    lines, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for block in [node.finalbody] + [handler.body for handler in node.handlers]:
                for statement in block:
                    for inner in ast.walk(statement):
                        if isinstance(inner, ast.stmt):
                            skipped.add(inner.lineno)
    body = tree.body[0].body   # (the function's own statements, not its def line)
    wanted = set()
    for statement in body:
        for inner in ast.walk(statement):
            if isinstance(inner, ast.stmt) and inner.lineno not in skipped and \
                    not (isinstance(inner, ast.Expr) and isinstance(inner.value, ast.Constant)):
                wanted.add(inner.lineno)
    return sorted(first - 1 + line for line in wanted)


def _raise_interrupt(frame: Any) -> None:
    raise KeyboardInterrupt


def _run_interrupted(code, line: int, action: Callable[[], Any]) -> bool:
    """Runs action() raising KeyboardInterrupt when `code` first reaches `line` (also on threads
    the action starts); whether it fired."""
    with at_line(code, line, _raise_interrupt, threads=True) as fired:
        try:
            action()
        except KeyboardInterrupt:
            if not fired:
                raise
    return bool(fired)


def _live() -> Dict[str, int]:
    acl_swiglu.release_cached()
    counts = emulator.live_counts()
    if any(counts.values()):
        gc.collect()
        acl_swiglu.release_cached()
        counts = emulator.live_counts()
    return counts


def _sweep(name: str, function: Callable[..., Any], operation: Operation) -> List[str]:
    code = function.__code__
    problems = []
    fired_somewhere = False
    for line in _interruptible_lines(function):
        start = _live()
        with ExitStack() as stack:
            ctx = operation.setup(stack)
            fired = _run_interrupted(code, line, lambda ctx=ctx: operation.run(ctx))
            fired_somewhere = fired_somewhere or fired
            where = f"{name} line {line - code.co_firstlineno + 1} ({type(operation).__name__})"
            finished, outcome = on_thread(lambda: runtime.state.lock.acquire(timeout=5) and
                                          (runtime.state.lock.release() or True), JOIN)
            if not finished or outcome is not True:
                problems.append(f"{where}: the state lock stayed held")
                break
            finished, outcome = on_thread(lambda ctx=ctx: operation.check(ctx), JOIN)
            if not finished:
                problems.append(f"{where}: the next call never returned (something stayed held)")
                break
            if outcome is not None:
                problems.append(f"{where}: the next call failed: {outcome!r}")
            ctx = None   # (the operation's objects go with the block)
        end = _live()
        if end != start:
            problems.append(f"{where}: live handles {start} -> {end}")
    if not fired_somewhere:
        problems.append(f"{name}: {type(operation).__name__} never ran it")
    return problems


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_an_interrupt_at_any_line_leaves_nothing_held(name):
    function, operations = TARGETS[name]
    problems = []
    for operation in operations:
        abi = getattr(operation, "abi", 2)
        previous = os.environ.get("ACL_SWIGLU_ABI")
        os.environ["ACL_SWIGLU_ABI"] = str(abi)
        try:
            problems += _sweep(name, function, operation)
        finally:
            if previous is None:
                os.environ.pop("ACL_SWIGLU_ABI", None)
            else:
                os.environ["ACL_SWIGLU_ABI"] = previous
    assert not problems, "\n".join(problems[:20])


# What makes a function "acquiring": it makes or holds something that must be given back.
_ACQUIRES = ("Use(", ".take(", "use.add(", "_prepare(", "state.lock", "self._lock", "with self.lock", "self._launching",
             "DeviceBuffer(",
             "DeviceArray.empty(", "AclTensor(", "AclIntArray(", "Stream()", "Binding(", "Executor(",
             "adopt(", "_next_due(", "close_life(", "release_due(")
_CORE = {"runtime": runtime, "_device": _device, "tensor": tensor, "_operator": _operator, "_plan": _plan,
         "_aclnn": _aclnn, "_arena": _arena}


def _acquiring_functions() -> List[str]:
    found = []
    for module_name, module in _CORE.items():
        tree = ast.parse(inspect.getsource(module))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        text = ast.get_source_segment(inspect.getsource(module), item) or ""
                        if any(marker in text for marker in _ACQUIRES):
                            found.append(f"{module_name}.{node.name}.{item.name}")
        for item in tree.body:
            if isinstance(item, ast.FunctionDef):
                text = ast.get_source_segment(inspect.getsource(module), item) or ""
                if any(marker in text for marker in _ACQUIRES):
                    found.append(f"{module_name}.{item.name}")
    return found


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_an_interrupted_release_is_finished_by_the_next_one(name):
    """The operations close what they made (and close again, or collect, what an interrupted
    close left): the same checks as above hold."""
    function, operations = RELEASES[name]
    problems = []
    for operation in operations:
        problems += _sweep(name, function, operation)
    assert not problems, "\n".join(problems[:20])


def test_every_acquiring_function_is_swept():
    covered = set(TARGETS) | ELSEWHERE | set(RELEASES) | CLEANUP
    missing = [name for name in _acquiring_functions() if name not in covered]
    assert not missing, f"acquiring functions the sweep does not cover: {missing}"


def test_an_interrupt_as_a_launch_hands_its_executor_to_cann_never_has_it_destroyed(monkeypatch):
    """CANN owns a single-use executor once phase 2 has it: an exception arriving right after the
    launch, or as the Executor tidies up after it, leaves it refused for a second launch and never
    destroyed by the package; one never launched is destroyed once."""
    api = _ffi.api()
    original = api.raw.aclDestroyAclOpExecutor
    destroyed: List[int] = []

    def counted(address):
        destroyed.append(address)
        return original(ctypes.cast(address, original.argtypes[0]))

    monkeypatch.setattr(api.raw, "aclDestroyAclOpExecutor", ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(counted))
    launch_lines, launch_first = inspect.getsourcelines(_operator.Executor._launch)
    after_launch = launch_first + next(i for i, text in enumerate(launch_lines) if "self._launches += 1" in text)
    tidy_first = inspect.getsourcelines(_operator.Executor._handed_over)[1] + 1
    places = [(_operator.Executor._launch, after_launch), (_operator.Executor._handed_over, tidy_first)]
    start = _live()
    with ExitStack() as stack:
        arrays, groups, stream, (gx, gw), workspace = Phases().setup(stack)
        for function, line in places:
            executor = acl_swiglu.get_workspace_size(*arrays, groups, CLAMP, grad_x=gx, grad_weight=gw)
            assert _run_interrupted(function.__code__, line, lambda: executor.launch(stream))
            stream.synchronize()
            assert _same(gx.to_numpy(), WANT[0]) and _same(gw.to_numpy(), WANT[1])   # (the launch ran)
            with pytest.raises(HandleClosedError, match="consumed by its launch"):
                executor.launch(stream)
            executor.close()
        assert destroyed == []
        unused = acl_swiglu.get_workspace_size(*arrays, groups, CLAMP, grad_x=gx, grad_weight=gw)
        unused.close()
        assert len(destroyed) == 1
        assert Phases().check((arrays, groups, stream, (gx, gw), workspace)) is None
    assert _live() == start
    assert len(destroyed) == 1   # (the check's executor was launched: CANN's too)
