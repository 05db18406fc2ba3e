"""Process and thread state: ACL initialisation, the device of each thread, fork, and the life of
every native handle the package owns.

A handle lives in a ``Life``: it is freed exactly once, when it is closed (close(), the end of a
``with`` block, garbage collection, interpreter exit) and nothing still uses it. Two things
delay the free: pins (a plan or executor that holds the handle, or a call in flight) and the
streams it was used on (queued work may still read or write it: each is synchronised first).
After close() the object is dead at once: using it raises HandleClosedError.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Optional, TypeVar

from . import _ffi
from ._checks import INT32_MAX, whole_number
from .errors import AclError, ConfigurationError, HandleClosedError

ACL_ERROR_REPEAT_INITIALIZE = 100002
ENV_DEVICE_ID = "ACL_SWIGLU_DEVICE_ID"

# Bumped whenever a handle is closed, so hot paths re-check what they use only then. C memory:
# the C helper's plan calls read it too.
close_epoch = (ctypes.c_int64 * 1)()

# Guards pins, the used-on streams and the closed flag of every Life. Re-entrant: a garbage
# collection (and so a finalizer) can start inside any allocation, also while it is held.
_state_lock = threading.RLock()


# Frees a native handle; returns its C status (non-zero: the free failed) or None.
Release = Callable[[], Optional[int]]


class Life:
    """One native handle's state, shared with its finalizer (which cannot see the object)."""

    __slots__ = ("release", "pins", "streams", "closed", "key", "dependents", "__weakref__")

    def __init__(self, release: Optional[Release]) -> None:
        self.release = release
        self.pins = 0
        self.streams: Optional[List[Life]] = None   # lives of streams whose queued work may use it
        self.closed = False
        self.key = 0
        self.dependents: Optional[List[Owned]] = None   # objects closed with it (a buffer's tensor handle)

    def wait(self) -> None:
        """Streams override this: wait for the work queued on them."""


def _quiet_wait(stream_life: Life) -> None:
    try:
        stream_life.wait()
    except Exception:   # the failure belongs to whoever reads the results; the free goes on
        pass


class _Runtime:
    """aclInit once per process, a device per thread, teardown at exit."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.initialized = False
        self.initialized_here = False   # False when someone else called aclInit first
        self.shut_down = False
        self.pid = os.getpid()
        self.device_id: Optional[int] = None   # set_device's choice; None: ACL_SWIGLU_DEVICE_ID
        self.generation = 0                   # bumped by set_device: bound threads rebind
        self.local = threading.local()
        self.owned: "Dict[int, weakref.finalize[Any, Any]]" = {}
        self.owned_counter = 0
        self.graveyard: List[Life] = []   # collected on a thread without a device: freed later

    # -- setup --

    @staticmethod
    def _configured_device() -> int:
        text = os.environ.get(ENV_DEVICE_ID, "0").strip() or "0"
        try:
            value = int(text)
        except ValueError:
            raise ConfigurationError(f"{ENV_DEVICE_ID}={text!r} is not a device id (a whole number)") from None
        return whole_number(value, ENV_DEVICE_ID, 0, INT32_MAX, ConfigurationError)

    def _bind_thread(self) -> None:
        api = _ffi.api()
        with self.lock:
            if self.pid != os.getpid():
                raise AclError(100001, "acl_swiglu", "ACL cannot be used in a child process forked after the parent "
                               "initialised it; use it in the parent, or start the child with the 'spawn' method")
            if self.shut_down:
                raise HandleClosedError("the ACL runtime was already finalised at interpreter exit")
            if not self.initialized:
                code = api.raw.aclInit(None)
                if code == ACL_ERROR_REPEAT_INITIALIZE:
                    self.initialized_here = False   # someone else owns ACL: never finalise it
                    _ffi.drop_message(api.get_message)
                elif code != 0:
                    _ffi.raise_status(code, "aclInit", api.get_message)
                else:
                    self.initialized_here = True
                self.initialized = True
                atexit.register(self.shutdown)
            generation, chosen = self.generation, self.device_id
        local = self.local
        if getattr(local, "device", None) is None:
            current = _current_device(api)
            if current is not None:
                # A device set by the caller or a framework: keep it, whatever was configured.
                local.device, local.adopted, local.generation = current, True, generation
                return
        elif local.adopted:
            local.generation = generation
            return
        device = chosen if chosen is not None else self._configured_device()
        api.aclrtSetDevice(device)
        local.device, local.adopted, local.generation = device, False, generation

    def set_device(self, device_id: int) -> None:
        device = whole_number(device_id, "device_id", 0, INT32_MAX)
        with self.lock:
            previous = self.device_id
            self.device_id = device
            self.generation += 1
        if not self.initialized:
            return
        try:
            api = runtime_api()
            if self.local.device != device:   # an explicit choice also moves an adopted thread
                api.aclrtSetDevice(device)
            self.local.device, self.local.adopted = device, False
        except BaseException:
            with self.lock:   # a device that cannot be set must not stick for later calls
                self.device_id = previous
                self.generation += 1
            raise

    # -- ownership --

    def adopt(self, obj: object, life: Life) -> "weakref.finalize[Any, Any]":
        """Registers `life` to be released once: at close(), GC, or exit (newest first)."""
        with self.lock:
            self.owned_counter += 1
            life.key = self.owned_counter
            finalizer = weakref.finalize(obj, self.collected, life)
            finalizer.atexit = False   # shutdown() runs them in order instead
            self.owned[life.key] = finalizer
        return finalizer

    def collected(self, life: Life) -> None:
        """The owner was garbage-collected (or the process is exiting): release once unused.
        A collection can run on any thread, also one that never used ACL or is ending (its
        thread-local state already gone): then the free waits for the next call that can make
        it, rather than binding a device on that thread."""
        with _state_lock:
            if life.closed:
                return
            life.closed = True
            close_epoch[0] += 1
            if life.pins or (_inside and _held_inside(life)):
                return
        bound = getattr(self.local, "generation", -1) == self.generation
        if bound or not self.initialized or self.shut_down or self.pid != os.getpid():
            self.retire(life)   # freed now, or (not initialised, exiting, forked) never by us
        else:
            with self.lock:
                self.graveyard.append(life)

    def bury(self) -> None:
        """Frees what was collected on threads without a device (call on a thread with one)."""
        with self.lock:
            lives, self.graveyard = self.graveyard, []
        for life in lives:
            self.retire(life)

    def retire(self, life: Life) -> None:
        """Frees a closed, unpinned handle after the streams that used it are past that work."""
        with self.lock:
            self.owned.pop(life.key, None)
            usable = self.initialized and not self.shut_down and self.pid == os.getpid()
        release, life.release = life.release, None
        streams, life.streams = life.streams, None
        dependents, life.dependents = life.dependents, None
        if not usable or (release is None and not dependents):
            return
        for stream_life in streams or ():
            _quiet_wait(stream_life)
        if release is not None and release():
            # A failed free cannot be acted on (the owner is gone or closing); its text must not
            # show up in the next error of this thread.
            _ffi.drop_message(_ffi.api().get_message)
        for dependent in dependents or ():
            dependent.close()

    def forget(self, life: Life) -> None:
        """The handle now belongs to someone else (e.g. CANN): never release it."""
        with _state_lock:
            life.release = None
            life.closed = True
            close_epoch[0] += 1
        with self.lock:
            finalizer = self.owned.pop(life.key, None)
        if finalizer is not None:
            finalizer.detach()

    def shutdown(self) -> None:
        """At exit: frees what is still owned (newest first), then finalises what we initialised."""
        if self.pid != os.getpid():
            return   # a forked child must not touch the parent's device state
        if self.initialized and not self.shut_down:
            try:
                runtime_api()
                self.bury()
            except Exception:   # exit must finish
                pass
        with self.lock:
            pending = [self.owned[k] for k in sorted(self.owned, reverse=True)]
        for finalizer in pending:
            # weakref.finalize may already have shut down (its own exit hook can run before
            # this one, and then calling a finalizer does nothing): detach and call it here.
            detached = finalizer.detach()
            if detached is None:
                continue
            _, func, args, kwargs = detached
            try:
                func(*args, **kwargs)
            except Exception:   # exit must finish; a failed free cannot be acted on now
                pass
        with self.lock:
            if not self.initialized or self.shut_down:
                return
            self.shut_down = True
        api = _ffi.api()
        local = self.local
        failed = False
        if getattr(local, "device", None) is not None and not local.adopted:
            failed = api.raw.aclrtResetDevice(local.device) != 0
        if self.initialized_here:
            failed = api.raw.aclFinalize() != 0 or failed
        if failed:   # nothing can be done about it at exit
            _ffi.drop_message(api.get_message)

    def after_fork_in_child(self) -> None:
        self.lock = threading.RLock()
        self.local = threading.local()
        self.owned = {}
        self.graveyard = []
        if not self.initialized:
            self.pid = os.getpid()   # the parent never touched ACL: this process may start afresh


def _current_device(api: SimpleNamespace) -> Optional[int]:
    """The thread's current device when the runtime can tell (aclrtGetDevice), else None."""
    get_device = api.raw.aclrtGetDevice
    if get_device is None:
        return None
    device = ctypes.c_int32(-1)
    if get_device(ctypes.byref(device)) != 0:
        _ffi.drop_message(api.get_message)   # "no device yet" is an answer, not an error
        return None
    return device.value


_runtime = _Runtime()
_fork_hooks: List[Callable[[], None]] = []


def at_fork_in_child(hook: Callable[[], None]) -> None:
    """Runs `hook` in a forked child, to replace locks another thread may have held at the fork."""
    _fork_hooks.append(hook)


def _after_fork_in_child() -> None:
    global _state_lock
    _state_lock = threading.RLock()
    _inside.clear()   # (the calls of other threads are not in this process)
    _closing[0] = 0
    _runtime.after_fork_in_child()
    _ffi._reset_after_fork()
    for hook in _fork_hooks:
        hook()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def in_forked_child() -> bool:
    """True in a child forked after this process initialised ACL (the child must not touch it)."""
    return _runtime.pid != os.getpid()


def runtime_api() -> SimpleNamespace:
    """The C API on this thread, initialising ACL and binding a device as needed."""
    runtime = _runtime
    if getattr(runtime.local, "generation", -1) != runtime.generation:
        runtime._bind_thread()
    return _ffi._api or _ffi.api()


def set_device(device_id: int) -> None:
    """Chooses the device for this thread and for every thread that has no device of its own
    (threads whose device was set by the caller or a framework keep theirs)."""
    _runtime.set_device(device_id)


def free_collected() -> None:
    """Frees handles whose owners were garbage-collected on threads without a device."""
    if _runtime.graveyard:
        runtime_api()
        _runtime.bury()


def synchronize_device() -> None:
    """Waits for all work on all streams of the device."""
    runtime_api().aclrtSynchronizeDevice()


def pin(lives: Iterable[Life]) -> None:
    """Marks handles as in use (by a plan, an executor or a call in flight): a close() then
    defers their free until unpin()."""
    with _state_lock:
        for life in lives:
            life.pins += 1


def pin_open(life: Life) -> bool:
    """Pins `life` unless it is closed already (then False): a close() after it defers the free."""
    with _state_lock:
        if life.closed:
            return False
        life.pins += 1
        return True


def unpin(lives: Iterable[Life], stream_life: Optional[Life] = None) -> None:
    """Ends a use (on `stream_life`, whose queued work may still use them); frees the handles
    that were closed meanwhile once that work is done."""
    repin((), lives, stream_life)


def repin(held: Iterable[Life], released: Iterable[Life], stream_life: Optional[Life]) -> None:
    """pin(held), then unpin(released, stream_life), under one lock."""
    retired = []
    with _state_lock:
        for life in held:
            life.pins += 1
        for life in released:
            if stream_life is not None:
                streams = life.streams
                if streams is None:
                    life.streams = [stream_life]
                elif stream_life not in streams:
                    streams.append(stream_life)
            life.pins -= 1
            if life.closed and life.pins == 0 and (life.release is not None or life.dependents) and \
                    not (_inside and _held_inside(life)):
                retired.append(life)
    for life in retired:
        _runtime.retire(life)


def close_with(life: Life, dependent: "Owned") -> None:
    """Closes `dependent` together with the closed handle of `life`: now when nothing pins it,
    else when the last pin goes (after the streams that used it are past that work)."""
    with _state_lock:
        if life.pins or (_inside and _held_inside(life)):
            if life.dependents is None:
                life.dependents = [dependent]
            else:
                life.dependents.append(dependent)
            return
    dependent.close()


def used_on(lives: Iterable[Life], stream_life: Life) -> None:
    """Records that work queued on the stream uses these handles: their free waits for it."""
    with _state_lock:
        for life in lives:
            _add_stream(life, stream_life)


def _add_stream(life: Life, stream_life: Life) -> None:
    streams = life.streams
    if streams is None:
        life.streams = [stream_life]
    elif stream_life not in streams:
        streams.append(stream_life)


class CallGroup:
    """The handles a repeated call uses, held as one for the length of each call: between
    enter() and leave(), closing any of them defers its free until the last call has left (the
    free then still waits for the streams that used it). Cheaper than pinning each: for calls
    whose handles already carry their stream (a call that pinned them recorded it)."""

    __slots__ = ("lives", "deferred")

    def __init__(self, lives: Iterable[Life]) -> None:
        self.lives = tuple(lives)
        self.deferred: Optional[List[Life]] = None   # closed while inside: freed at the last leave


# One call's stay in a group: [group], made before the call's try, entered inside it and left
# in its finally, so that an exception at any point leaves nothing entered behind. (A list:
# the cheapest object to make; visits are told apart by identity, their id() while alive.)
Visit = List[CallGroup]


def visit(group: CallGroup) -> Visit:
    return [group]


# The visits of the calls inside groups, by id(). enter() and leave() take no lock: a dict store
# and a dict pop are single steps under the GIL. A close holds _state_lock while it looks here
# (_held_inside), and counts itself in _closing meanwhile, so that a leave() racing it waits for
# it (see leave).
_inside: Dict[int, Visit] = {}
_closing = [0]


def enter(stay: Visit) -> None:
    """Holds the group's handles. The caller then re-checks close_epoch: a close that found
    nothing inside before this may have freed one of them already."""
    _inside[id(stay)] = stay


def leave(stay: Visit) -> None:
    """Ends the visit (nothing, when it was not entered)."""
    if _inside.pop(id(stay), None) is None:
        return
    group = stay[0]
    # (in this order: a close that saw this call inside either is still scanning, which
    # _closing shows, or has finished, which group.deferred shows)
    if _closing[0] or group.deferred is not None:
        _settle(group)


def _settle(group: CallGroup) -> None:
    """Frees what was closed while calls were inside the group, once none is."""
    with _state_lock:
        deferred = group.deferred
        if deferred is None or any(stay[0] is group for stay in tuple(_inside.values())):
            return   # (nothing, or the last call inside frees it when it leaves)
        group.deferred = None
        retired = [life for life in deferred if life.pins == 0 and not (_inside and _held_inside(life)) and
                   (life.release is not None or life.dependents)]
    for life in retired:
        _runtime.retire(life)


def _held_inside(life: Life) -> bool:
    """Whether a call inside a group uses `life` (then that group frees it when the last call
    leaves). Under _state_lock."""
    _closing[0] += 1
    try:
        for stay in tuple(_inside.values()):
            group = stay[0]
            if life in group.lives:
                if group.deferred is None:
                    group.deferred = [life]
                elif life not in group.deferred:
                    group.deferred.append(life)
                return True
        return False
    finally:
        _closing[0] -= 1


_Self = TypeVar("_Self", bound="Owned")


class Owned:
    """A native handle the package owns or borrows; dead after close()."""

    _kind = "handle"

    def __init__(self) -> None:
        self._handle: Any = None
        self._life = Life(None)
        self._finalizer: "Optional[weakref.finalize[Any, Any]]" = None

    def _own(self, handle: Any, release: Release) -> None:
        self._handle = handle
        self._life = self._make_life(release)
        self._finalizer = _runtime.adopt(self, self._life)

    def _make_life(self, release: Release) -> Life:
        return Life(release)

    def _borrow(self, handle: Any) -> None:
        self._handle = handle

    @property
    def closed(self) -> bool:
        """True once close() was called (or the handle was handed over to its new owner)."""
        return self._handle is None

    @property
    def _as_parameter_(self) -> Any:
        """The native handle, as ctypes passes the object to C (HandleClosedError once closed)."""
        handle = self._handle
        if handle is None:
            raise HandleClosedError(f"this {self._kind} was closed; it cannot be used any more")
        return handle

    def check_open(self, name: Optional[str] = None) -> None:
        """Raises HandleClosedError when closed (ctypes would wrap it in its own error)."""
        if self._handle is None:
            raise HandleClosedError(f"{name or 'this ' + self._kind} was closed; it cannot be used any more")

    def close(self) -> None:
        """Kills the object now; frees the native handle (only an owned one) as soon as nothing
        uses it: no plan or executor holds it and the streams that used it have passed that work."""
        if self._handle is None:
            return
        life = self._life
        with _state_lock:
            self._handle = None
            close_epoch[0] += 1
            if life.closed:
                return
            life.closed = True
            if life.pins or life.release is None or (_inside and _held_inside(life)):
                return
        if self._finalizer is not None:
            self._finalizer.detach()
        _runtime.retire(life)

    def _disown(self) -> None:
        """Forgets the handle without freeing it: its owner is now someone else (e.g. CANN)."""
        _runtime.forget(self._life)
        self._handle = None

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def __getattr__(name: str) -> Any:
    # The device data model moved to _device.py; its names stay importable from here.
    if name in ("DeviceArray", "DeviceBuffer", "Stream", "default_stream", "to_device"):
        from . import _device
        return getattr(_device, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
