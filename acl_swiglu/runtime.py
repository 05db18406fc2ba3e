"""Process and thread state: ACL initialisation, the device of each thread, fork, and the life of
every native handle the package owns.

A handle lives in a ``Life``. It is freed exactly once, when it is closed (close(), the end of a
``with`` block, garbage collection, interpreter exit) and nothing holds it any more: a ``Use``
(a plan, an executor, a call in flight) holds the handles it needs from before it touches them
until after, and the free also waits for every stream that queued work on it. After close() the
owning object is dead at once: using it raises HandleClosedError.

Every piece of shared state here (lives, the epoch, the access records of device arrays in
_device.py) is changed under one re-entrant lock, ``state.lock`` (docs/concurrency.md).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple, TypeVar

from . import _ffi
from ._checks import INT32_MAX, whole_number
from .errors import AclError, ConfigurationError, HandleClosedError

ACL_ERROR_REPEAT_INITIALIZE = 100002
ENV_DEVICE_ID = "ACL_SWIGLU_DEVICE_ID"


class _State:
    """The lock where threads meet, and the epoch: a number that moves whenever a handle is
    closed or a device array's access record changes, so that a plan can tell in one comparison
    whether anything it relies on may have changed since it last looked."""

    def __init__(self) -> None:
        # Re-entrant: a garbage collection (and so a finalizer, which closes) can start inside any
        # allocation, also while the lock is held.
        self.lock = threading.RLock()
        self.epoch = 0
        self._numbers = 0

    def next_number(self) -> int:
        """A number never given before in this process (under the lock)."""
        self._numbers += 1
        return self._numbers


state = _State()

# Frees a native handle; returns its C status (non-zero: the free failed) or None.
Destroy = Callable[[Any], Optional[int]]


class Life:
    """One native handle's state, shared with its finalizer (which cannot see the object).

    ``handle`` is set by the very statement that makes the handle (the constructor's result, or
    the out-parameter the C call writes into), so that from then on it is owned: an exception
    arriving right after still leaves it to be freed."""

    __slots__ = ("handle", "destroy", "holders", "streams", "closed", "released", "key", "__weakref__")

    def __init__(self, destroy: Optional[Destroy] = None, handle: Any = None) -> None:
        self.handle = handle
        self.destroy = destroy   # None: borrowed, never freed by the package
        self.holders: Set[object] = set()   # the Uses that hold it now
        self.streams: Optional[Set[Life]] = None   # lives of streams whose queued work may use it
        self.closed = False
        self.released = False   # the free has been claimed (it may still be running)
        self.key = 0

    def wait(self) -> None:
        """Streams override this: wait for the work queued on them."""


_Claim = Tuple[Destroy, Any, Optional[Set[Life]]]


def _claim(life: Life) -> Optional[_Claim]:
    """Under state.lock, for a closed life nothing holds: takes over its free (once)."""
    if life.released:
        return None
    life.released = True
    destroy, life.destroy = life.destroy, None
    streams, life.streams = life.streams, None
    handle = life.handle
    if destroy is None or handle is None or not ctypes.cast(handle, ctypes.c_void_p).value:
        return None
    return destroy, handle, streams


def _free(claimed: Optional[_Claim]) -> None:
    """Frees a claimed handle after the streams that used it are past that work. On a thread the
    package has not bound to a device (a collection can run on any thread, also one that never
    used ACL or is ending), the free waits for the next call that can make it."""
    if claimed is None:
        return
    if not _runtime.usable():
        return   # (not initialised, exited or forked: never ours to free)
    if getattr(_runtime.local, "generation", -1) != _runtime.generation and not _runtime.exiting:
        with state.lock:
            _runtime.graveyard.append(claimed)
        return
    destroy, handle, streams = claimed
    for stream_life in streams or ():
        try:
            stream_life.wait()
        except Exception:   # the failure belongs to whoever reads the results; the free goes on
            pass
    runtime_api()
    if destroy(handle):
        # A failed free cannot be acted on (the owner is gone or closing); its text must not show
        # up in the next error of this thread.
        _ffi.drop_message(_ffi.api().get_message)


def close_life(life: Life) -> None:
    """Marks the handle closed (the epoch moves); frees it now if nothing holds it (or the
    process is exiting: then nothing will use it again)."""
    with state.lock:
        if life.closed and not _runtime.exiting:
            return
        life.closed = True
        state.epoch += 1
        claimed = None if life.holders and not _runtime.exiting else _claim(life)
    _free(claimed)


class Use:
    """One holder of several handles: a call in flight, a plan, an executor.

    Take it inside the ``try`` whose ``finally`` lets it go: ``take()`` adds this Use to each
    life's holders and ``let_go()`` removes it from each, so a take cut short by an exception
    leaves nothing behind once let_go has run. A handle closed while held is freed by the let_go
    of its last holder (after the streams that used it)."""

    __slots__ = ("lives",)

    def __init__(self, lives: Iterable[Life] = ()) -> None:
        self.lives: List[Life] = list(lives)

    def take(self) -> bool:
        """Holds every life; False when one of them was closed already (the caller refuses)."""
        with state.lock:
            for life in self.lives:
                life.holders.add(self)
            return not any(life.closed for life in self.lives)

    def add(self, life: Life) -> bool:
        """Holds one more life; False when it was closed already."""
        with state.lock:
            self.lives.append(life)
            life.holders.add(self)
            return not life.closed

    def drop(self, lives: Iterable[Life], stream: Optional[Life] = None) -> None:
        """Ends the hold of these lives (on `stream`, whose queued work may still use them); frees
        the ones that were closed meanwhile and that nothing else holds."""
        dropped = set(lives)
        claims = []
        with state.lock:
            for life in dropped:
                if stream is not None and stream is not life:
                    if life.streams is None:
                        life.streams = {stream}
                    else:
                        life.streams.add(stream)
                life.holders.discard(self)
                if life.closed and not life.holders:
                    claims.append(_claim(life))
            self.lives = [life for life in self.lives if life not in dropped]
        for claimed in claims:
            _free(claimed)

    def let_go(self, stream: Optional[Life] = None) -> None:
        """Ends the hold of every life (see drop)."""
        self.drop(self.lives, stream)


def used_on(lives: Iterable[Life], stream: Life) -> None:
    """Records that work queued on the stream uses these handles: their free waits for it."""
    with state.lock:
        for life in lives:
            if life.streams is None:
                life.streams = {stream}
            else:
                life.streams.add(stream)


class _Runtime:
    """aclInit once per process, a device per thread, what is owned, teardown at exit."""

    def __init__(self) -> None:
        self.initialized = False
        self.initialized_here = False   # False when someone else called aclInit first
        self.shut_down = False
        self.pid = os.getpid()
        self.device_id: Optional[int] = None   # set_device's choice; None: ACL_SWIGLU_DEVICE_ID
        self.generation = 0                   # moves at set_device: bound threads rebind
        self.local = threading.local()
        self.owned: "Dict[int, weakref.finalize[Any, Any]]" = {}
        self.owned_counter = 0
        self.graveyard: List[_Claim] = []   # frees claimed on a thread without a device: made later
        self.exiting = False

    def usable(self) -> bool:
        return self.initialized and not self.shut_down and self.pid == os.getpid()

    @staticmethod
    def _configured_device() -> int:
        text = os.environ.get(ENV_DEVICE_ID, "0").strip() or "0"
        try:
            value = int(text)
        except ValueError:
            raise ConfigurationError(f"{ENV_DEVICE_ID}={text!r} is not a device id (a whole number)") from None
        return whole_number(value, ENV_DEVICE_ID, 0, INT32_MAX, ConfigurationError)

    def _initialise(self, api: SimpleNamespace) -> Tuple[int, Optional[int]]:
        with state.lock:
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
            return self.generation, self.device_id

    def bind_thread(self) -> None:
        api = _ffi.api()
        generation, chosen = self._initialise(api)
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
        with state.lock:
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
            with state.lock:   # a device that cannot be set must not stick for later calls
                self.device_id = previous
                self.generation += 1
            raise

    # -- ownership --

    def adopt(self, obj: object, life: Life) -> "weakref.finalize[Any, Any]":
        """Registers `life` to be closed once: at close(), GC, or exit (newest first)."""
        with state.lock:
            self.owned_counter += 1
            life.key = self.owned_counter
            finalizer = weakref.finalize(obj, self.collected, life)
            finalizer.atexit = False   # shutdown() runs them in order instead
            self.owned[life.key] = finalizer
        return finalizer

    def disown(self, life: Life) -> None:
        with state.lock:
            self.owned.pop(life.key, None)

    def collected(self, life: Life) -> None:
        """The owner was garbage-collected (or the process is exiting): close its handle."""
        self.disown(life)
        close_life(life)

    def bury(self) -> None:
        """Makes the frees claimed on threads without a device (call on a thread with one)."""
        with state.lock:
            claims, self.graveyard = self.graveyard, []
        for claimed in claims:
            _free(claimed)

    def shutdown(self) -> None:
        """At exit: frees what is still owned (newest first), then finalises what we initialised."""
        if self.pid != os.getpid():
            return   # a forked child must not touch the parent's device state
        if self.usable():
            try:
                runtime_api()
                self.bury()
            except Exception:   # exit must finish
                pass
        with state.lock:
            self.exiting = True   # (what is still held is freed all the same: nothing runs after this)
            pending = [self.owned[k] for k in sorted(self.owned, reverse=True)]
        for finalizer in pending:
            # weakref.finalize may already have shut down (its own exit hook can run before this
            # one, and then calling a finalizer does nothing): detach and call it here.
            detached = finalizer.detach()
            if detached is None:
                continue
            _, func, args, kwargs = detached
            try:
                func(*args, **kwargs)
            except Exception:   # exit must finish; a failed free cannot be acted on now
                pass
        with state.lock:
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
    state.lock = threading.RLock()
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
        runtime.bind_thread()
    return _ffi._api or _ffi.api()


def current_device() -> int:
    """The device of this thread (bound first if needed)."""
    runtime_api()
    device: int = _runtime.local.device
    return device


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


_Self = TypeVar("_Self", bound="Owned")


class Owned:
    """A native handle the package owns or borrows; dead after close()."""

    _kind = "handle"

    def __init__(self) -> None:
        self._life = Life()
        self._dead = False
        self._finalizer: "Optional[weakref.finalize[Any, Any]]" = None

    def _prepare(self, destroy: Destroy, handle: Any = None) -> Life:
        """Readies this object to own a handle: call right before the statement that makes it,
        which stores it in the returned life's ``handle`` (or writes it into `handle`, an
        out-parameter given here)."""
        life = self._life = self._make_life(destroy, handle)
        self._finalizer = _runtime.adopt(self, life)
        return life

    def _make_life(self, destroy: Optional[Destroy], handle: Any) -> Life:
        return Life(destroy, handle)

    def _borrow(self, handle: Any) -> None:
        self._life = self._make_life(None, handle)

    @property
    def _handle(self) -> Any:
        return None if self._dead else self._life.handle

    @property
    def closed(self) -> bool:
        """True once close() was called (or the handle was handed over to its new owner)."""
        return self._dead

    @property
    def _as_parameter_(self) -> Any:
        """The native handle, as ctypes passes the object to C (HandleClosedError once closed)."""
        if self._dead:
            raise HandleClosedError(f"this {self._kind} was closed; it cannot be used any more")
        return self._life.handle

    def check_open(self, name: Optional[str] = None) -> None:
        """Raises HandleClosedError when closed (ctypes would wrap it in its own error)."""
        if self._dead:
            raise HandleClosedError(f"{name or 'this ' + self._kind} was closed; it cannot be used any more")

    def close(self) -> None:
        """Kills the object now; frees the native handle (only an owned one) as soon as nothing
        holds it and the streams that used it have passed that work."""
        if self._dead:
            return
        self._dead = True
        if self._finalizer is not None:
            self._finalizer.detach()
            _runtime.disown(self._life)
        close_life(self._life)

    def _disown(self) -> None:
        """Forgets the handle without freeing it: its owner is now someone else (e.g. CANN)."""
        life = self._life
        with state.lock:
            life.destroy = None
            life.closed = life.released = True
            state.epoch += 1
        self._dead = True
        if self._finalizer is not None:
            self._finalizer.detach()
            _runtime.disown(life)

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
