"""What the behaviour tests share: inputs, the exact bits the emulator must give for them
(tests/device_model.py), bounded thread and child-process runners, and hostile stand-ins for a
user's arrays and streams (subclasses whose hooks run the user's code inside a call).

Every wait here is bounded by a timeout that only keeps a broken core from hanging the run; no
outcome depends on how fast the machine is.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pytest

import acl_swiglu
from acl_swiglu import emulator

import device_model

TESTS = os.path.dirname(os.path.abspath(__file__))
JOIN_TIMEOUT = 60.0   # seconds: bounds every wait for a thread (never decides an outcome)
CHILD_TIMEOUT = 120.0
CLAMP = 1.5


def case(rows: int = 6, hidden: int = 16, seed: int = 5, dtype: Any = np.float32) -> Tuple[np.ndarray, np.ndarray]:
    """grad_y [rows, hidden] and x [rows, 2 * hidden], standard normal."""
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((rows, hidden)).astype(np.float32).astype(dtype)
    x = rng.standard_normal((rows, 2 * hidden)).astype(np.float32).astype(dtype)
    return gy, x


def weighted_case(rows: int = 5, hidden: int = 8, seed: int = 12,
                  dtype: Any = np.float32) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """grad_y, x, weight [rows] (in [0.5, 1.5)) and y_origin."""
    rng = np.random.default_rng(seed)
    gy = rng.standard_normal((rows, hidden)).astype(np.float32).astype(dtype)
    x = rng.standard_normal((rows, 2 * hidden)).astype(np.float32).astype(dtype)
    weight = (rng.random(rows) + 0.5).astype(np.float32)
    y_origin = rng.standard_normal((rows, hidden)).astype(np.float32).astype(dtype)
    return gy, x, weight, y_origin


def model(gy, x, weight=None, y_origin=None, group_index=None, clamp: Optional[float] = CLAMP):
    """(grad_x, grad_weight) as the emulator computes them, for any host arrays (views included)."""
    plain = [None if a is None else np.ascontiguousarray(np.asarray(a)) for a in (gy, x, weight, y_origin)]
    return device_model.swiglu_group_quant_grad_model(*plain, group_index, clamp)


def want(gy, x, clamp: Optional[float] = CLAMP, **kw: Any) -> np.ndarray:
    """grad_x as the emulator computes it."""
    return model(gy, x, kw.get("weight"), kw.get("y_origin"), kw.get("group_index"), clamp)[0]


def same_bits(got: np.ndarray, expected: np.ndarray) -> bool:
    """Same shape, dtype and bytes (so -0.0 and NaN payloads count)."""
    got, expected = np.ascontiguousarray(got), np.ascontiguousarray(expected)
    return got.shape == expected.shape and got.dtype == expected.dtype and np.array_equal(
        got.view(np.uint8), expected.view(np.uint8))


def check_clamp_types(run, gy, x):
    """2, 2.0 and NumPy scalars of 2 give the same bits, 1 and 1.0 alike; bools, NaN and the
    values that mean "off" in the other revision are refused, whether or not an equal value was
    seen before, and a refusal leaves nothing in the way of the next call."""
    want_two, want_one = want(gy, x, 2.0), want(gy, x, 1.0)
    for first in (True, False):
        with pytest.raises(TypeError, match="bool"):
            run(first)
    for clamp in (2.0, 2, np.float32(2.0), 2.0, 2, np.float64(2.0), np.int64(2)):
        assert same_bits(run(clamp), want_two), repr(clamp)
    for clamp in (1, 1.0, 1, float("1."), 1.0):
        assert same_bits(run(clamp), want_one), repr(clamp)
    for clamp in (True, np.bool_(True), False, -0.0, 0.0, 0, float("nan"), "1.5", [1.5]):
        with pytest.raises((TypeError, acl_swiglu.ArgumentError)):
            run(clamp)
    assert same_bits(run(1.0), want_one)


def idle_counts() -> Dict[str, int]:
    """The emulator's live handles once the package's caches are dropped."""
    acl_swiglu.release_cached()
    return emulator.live_counts()


def run_threads(targets: Sequence[Callable[[], None]], timeout: float = JOIN_TIMEOUT) -> List[BaseException]:
    """Runs each target on its own thread; returns what they raised. Every thread must end."""
    failures: List[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:   # reported to the caller
                failures.append(exc)
        return run

    threads = [threading.Thread(target=guarded(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(t.is_alive() for t in threads), "a thread did not finish (hung)"
    return failures


def on_thread(target: Callable[[], Any], timeout: float = JOIN_TIMEOUT) -> Tuple[bool, Any]:
    """Runs target on a daemon thread: (whether it finished, what it returned or raised). A call
    that deadlocks leaves only that thread stuck, not the test run."""
    box: List[Any] = []

    def run() -> None:
        try:
            box.append(target())
        except BaseException as exc:   # returned to the caller
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return not thread.is_alive(), (box[0] if box else None)


def use_the_package_on_this_thread() -> None:
    """A thread's first use of the package that is not a plan call (a plan call as a thread's
    first use is tested on its own: test_plan.py)."""
    acl_swiglu.synchronize_device()


def child_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACL_EMU_FAULT")}
    env.update(ACL_SWIGLU_BACKEND="emulator", PYTHONPATH=TESTS, PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def run_child(code: str, cwd: Any, timeout: float = CHILD_TIMEOUT, **env: str) -> Any:
    """Runs `code` in a fresh interpreter (its own process group, killed at the time limit) and
    returns the JSON of the last line it printed."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=str(cwd), env=child_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"the child did not finish within {timeout} s (hung): {stdout[-2000:]!r} "
                             f"{stderr[-3000:]!r}") from None
    assert proc.returncode == 0, (proc.returncode, stdout[-2000:], stderr[-4000:])
    lines = [line for line in stdout.splitlines() if line.startswith(("{", "["))]
    assert lines, (stdout[-2000:], stderr[-4000:])
    return json.loads(lines[-1])


class Rigged(acl_swiglu.DeviceArray):
    """A device array whose address runs the user's code once armed: a call reads the addresses
    of the arrays it binds (from the array's own record, ``_address``, which no public property
    can change) while it holds what it holds, so the hook runs inside it. ``arm(action)`` makes
    the next read run action() first (once)."""

    _action: Optional[Callable[[], None]] = None

    @classmethod
    def over(cls, array: acl_swiglu.DeviceArray) -> "Rigged":
        """Another view of the same memory, shape, dtype, strides and offset."""
        return cls(array.buffer, array.shape, array.dtype, array.strides, array.offset)

    def arm(self, action: Callable[[], None]) -> None:
        self._action = action

    @property
    def _address(self) -> int:
        action, self._action = self._action, None
        if action is not None:
            action()
        address: int = self.__dict__["_rigged_address"]
        return address

    @_address.setter
    def _address(self, value: int) -> None:
        self.__dict__["_rigged_address"] = value


class RiggedStream(acl_swiglu.Stream):
    """A stream whose synchronize() runs the user's code once armed (a plan's close()
    synchronises its stream under the plan's lock)."""

    _action: Optional[Callable[[], None]] = None

    def arm(self, action: Callable[[], None]) -> None:
        self._action = action

    def synchronize(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()
        super().synchronize()


def line_of(function: Any, text: str) -> int:
    """The line number (in its file) of the first line of `function` that contains `text`."""
    lines, first = inspect.getsourcelines(function)
    for index, line in enumerate(lines):
        if text in line:
            return first + index
    raise AssertionError(f"{text!r} not found in {function.__qualname__}")


@contextmanager
def at_line(code: Any, line: int, action: Callable[[Any], None], threads: bool = False) -> Iterator[List[bool]]:
    """While active, runs action(frame) once: the first time `code` reaches `line` (a line number
    in its file), on this thread (and, with threads=True, on threads started meanwhile). Yields a
    list that holds True once it has run."""
    fired: List[bool] = []

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(True)
            action(frame)
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code is code and not fired else None

    sys.settrace(tracer)
    if threads:
        threading.settrace(tracer)
    try:
        yield fired
    finally:
        sys.settrace(None)
        if threads:
            threading.settrace(None)   # type: ignore[arg-type]


def raiser(exc: BaseException) -> Callable[[], None]:
    def action() -> None:
        raise exc
    return action


class Proxy:
    """A transparent proxy (as wrapt.ObjectProxy makes): ``__class__`` answers the wrapped
    object's class, so isinstance() takes it for that class, and every other attribute is the
    wrapped object's. Its own memory is a small Python object, not the array's data."""

    __slots__ = ("_wrapped",)

    def __init__(self, wrapped: Any) -> None:
        object.__setattr__(self, "_wrapped", wrapped)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return object.__getattribute__(self, "_wrapped").__class__

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_wrapped"), name)

    def __len__(self) -> int:
        return len(object.__getattribute__(self, "_wrapped"))

    def __getitem__(self, key: Any) -> Any:
        return object.__getattribute__(self, "_wrapped")[key]

    def __repr__(self) -> str:
        return f"Proxy({object.__getattribute__(self, '_wrapped')!r})"
