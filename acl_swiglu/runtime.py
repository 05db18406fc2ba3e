"""Process and thread state: ACL initialisation, the device of each thread, fork, and the life of
every native handle the package owns (a ``Life``, held by ``Use``s; docs/concurrency.md).
"""

from __future__ import annotations

import atexit
from collections import deque
import ctypes
from contextlib import nullcontext, suppress
import os
import threading
import weakref
from types import SimpleNamespace
from typing import Any, Callable, Deque, Dict, Iterable, List, NoReturn, Optional, Set, Tuple, TypeVar

from . import _ffi
from ._checks import INT32_MAX, whole_number
from .errors import AclError, ConfigurationError, HandleClosedError

ACL_ERROR_REPEAT_INITIALIZE = 100002
ENV_DEVICE_ID = "ACL_SWIGLU_DEVICE_ID"


class _State:
    """The lock where threads meet, and the epoch: it moves whenever a handle is closed or an
    access record changes, so one comparison tells a plan whether to look again."""

    def __init__(self) -> None:
        # Re-entrant: a garbage collection (and so a finalizer, which closes) can start inside any
        # allocation, also while the lock is held.
        self.lock = threading.RLock()
        self.epoch = 0
        self.due: Set[Life] = set()   # closed lives not yet freed
        # References to the lives a thread may be waiting on (owned streams), each dropped with its life.
        self.waited: "Set[weakref.ReferenceType[Life]]" = set()
        # The weak references (keys of _runtime.owned) of owners that were garbage-collected,
        # appended by the reference's callback itself (a C-level append: a collection an
        # exception interrupts has either recorded its owner or not run).
        self.collected: "Deque[weakref.ReferenceType[Any]]" = deque()


state = _State()


class OwnerReference(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to an owner, hashed and compared as itself: an owner class's own
    ``__eq__`` and ``__hash__`` (a subclass's) must not merge or refuse entries."""

    __slots__ = ()
    __hash__ = object.__hash__
    __eq__ = object.__eq__
    __ne__ = object.__ne__


# Frees a native handle: a C function (a ctypes function object) that takes the handle and
# returns its status (non-zero: the free failed).
Destroy = Any

_NO_LOCK = nullcontext()


class Life:
    """One native handle's state, shared with the runtime, which closes it when its owner is collected.
    ``handle`` (a ctypes pointer) is set by the very statement that makes the handle, and made NULL
    by the very call that frees it (runtime._free): an exception between leaves it owned."""

    __slots__ = ("handle", "destroy", "device", "holders", "streams", "closed", "after", "__weakref__")
    lock: Any = _NO_LOCK   # held while the handle is freed (a stream's: no wait on it runs meanwhile)

    def __init__(self, destroy: Optional[Destroy] = None, handle: Any = None, device: Optional[int] = None) -> None:
        self.handle = handle
        self.device = device     # the device it belongs to (freed there), or None for a host object
        self.destroy = destroy   # None: borrowed, never freed by the package
        self.holders: Set[Use] = set()   # the Uses that may hold it (those still active do)
        self.streams: Optional[Set[Life]] = None   # lives of streams whose queued work may use it
        self.closed = False
        self.after: Optional[Life] = None   # a life this one is freed after (an executor, for its tensors)

    def wait(self) -> None:
        """Streams override this: wait for the work queued on them."""

    def busy(self) -> bool:
        """Streams override this: this thread is inside a wait on it."""
        return False

    def live_besides(self, other: "Life") -> bool:
        """Streams override this: whether this stream's work is still to wait for once `other`'s is."""
        return True


_L = TypeVar("_L", bound=Life)


def joined(streams: Optional[Set[_L]], stream: _L) -> Set[_L]:
    """`streams` with `stream` added, less those whose work a wait on `stream` covers or that
    have none left (destroyed, or the same native stream borrowed again)."""
    return {other for other in streams or () if other.live_besides(stream)} | {stream}


def _held(life: Life) -> bool:
    return any(use.active and not use.idle for use in life.holders)


def watch_waits(life: Life) -> None:
    """Lets _waiting see the waits on this life (an owned stream's)."""
    waited = state.waited
    waited.add(weakref.ref(life, waited.discard))


def _waiting() -> bool:
    """Whether this thread is inside a wait on a stream (running code the wait let run: a gc
    callback, a signal handler). Frees, which may wait for streams themselves, are left to the end
    of that wait: no thread waits for a stream's lock while it holds another's."""
    for reference in state.waited.copy():   # (a copy: code run meanwhile may add to it)
        life = reference()
        if life is not None and life.busy():
            return True
    return False


def _next_due() -> Optional[Life]:
    """Under state.lock: a closed life in state.due that nothing holds, to free (the caller takes
    it out once it has it: an exception in between leaves it due)."""
    exiting = _runtime.exiting
    for life in state.due:
        first = life.after
        if life.closed and (exiting or not _held(life)) and (first is None or first.destroy is None or not first.handle):
            return life
    return None


def _take_collected() -> None:
    """Closes the lives of collected owners, in order. Each step can be made again, so a pass an
    exception cut short, or one that code run inside it (a signal handler) made meanwhile, is
    finished by the next."""
    collected, owned = state.collected, _runtime.owned
    with state.lock:
        while collected:
            reference = collected[0]
            life = owned.get(reference)
            if life is not None:   # (None: closed, or handed over, before its owner went)
                _mark_closed(life)
                owned.pop(reference, None)
            with suppress(ValueError):   # (gone already if code run meanwhile took it)
                collected.remove(reference)   # (one C step, by identity: at the front unless taken)


def _mark_closed(life: Life) -> None:
    """Under state.lock: the life is due, the epoch moves, and it is closed, in this order (a
    close an exception cut short is finished by the next)."""
    if not life.closed:
        state.due.add(life)
        state.epoch += 1
        life.closed = True


def release_due() -> None:
    """Frees every closed handle that nothing holds any more. On a thread the package has not
    bound to a device (a collection can run on any thread) they wait for the next call that
    can; so does a free an exception cut short."""
    if state.collected:
        _take_collected()
    if not state.due or not _runtime.usable():
        return   # (nothing due; or not initialised, exited or forked: never ours to free)
    local = _runtime.local
    if getattr(local, "generation", -1) != _runtime.generation and not _runtime.exiting:
        return
    if getattr(local, "releasing", False) or _waiting():
        return   # (a free that closes more, an executor its tensors, leaves them to the loop below)
    life: Optional[Life] = None
    try:
        local.releasing = True
        while state.due:
            life = None
            with state.lock:
                life = _next_due()
                state.due.discard(life)
            if life is None:
                break   # (not return: CPython runs a return's finally outside the try's reach)
            _free(life)
    except BaseException:
        if life is not None and life.handle:   # (not freed yet: due again)
            with state.lock:
                state.due.add(life)
        raise
    finally:
        local.releasing = False


def _free(life: Life) -> None:
    """Frees the handle, on its device, once the streams that used it are past that work."""
    destroy, handle = life.destroy, life.handle
    if destroy is None or not handle:   # (None, or a ctypes pointer made NULL by its free)
        return
    api = runtime_api()
    here = _runtime.local.device
    elsewhere = life.device is not None and life.device != here
    if elsewhere:
        api.aclrtSetDevice(life.device)
    try:
        for stream_life in life.streams or ():
            with suppress(Exception):   # (the failure belongs to whoever reads the results)
                stream_life.wait()
        with life.lock:
            # One helper call frees the handle and clears it where the life keeps it: an exception
            # before the call leaves it to be freed, one after finds it gone. (A failed destroy
            # leaves it there: a stream's work is then still to wait for.)
            status = api.hot.acl_swiglu_destroy(ctypes.cast(destroy, ctypes.c_void_p), ctypes.byref(handle))
        life.destroy = None   # (tried: never again; the lives freed after it go)
        if status:   # (cannot be acted on: its text must not show up in the thread's next error)
            _ffi.drop_message(api.get_message)
    finally:
        if elsewhere:
            api.aclrtSetDevice(here)


def close_life(life: Life) -> None:
    """Marks the handle closed (the epoch moves) and due to be freed, then frees what is due:
    this one too, unless something still holds it."""
    with state.lock:
        _mark_closed(life)
    release_due()


class Use:
    """One holder of several handles (a call in flight, a plan, an executor), made before the
    ``try`` whose ``finally`` lets it go. An ``idle`` Use (an executor waiting in its pool) holds
    off no free: the epoch tells its owner to look again (docs/concurrency.md)."""

    __slots__ = ("lives", "stream", "active", "idle")

    def __init__(self, lives: Iterable[Life] = (), stream: Optional[Life] = None) -> None:
        self.lives: List[Life] = list(lives)
        self.stream = stream
        self.active = True
        self.idle = False

    def take(self) -> bool:
        """Holds every life; False when one of them was closed already (the caller refuses)."""
        with state.lock:
            return self.hold_only(self.lives, self.stream)

    def add(self, life: Life) -> bool:
        """Holds one more life; False when it was closed already."""
        with state.lock:
            return self.hold_also(life)

    def hold_also(self, life: Life) -> bool:
        """add(), for a caller that holds state.lock already."""
        self.lives.append(life)
        self._hold(life)
        return not life.closed

    def hold_only(self, lives: List[Life], stream: Optional[Life]) -> bool:
        """Under state.lock: holds exactly `lives` from now on, recording `stream` on them, and
        lets go of the others; False when one of them was closed already. (At every step
        ``self.lives`` covers every life this Use holds, so an interrupted call is undone by
        let_go, or finished by the next.)"""
        keep = set(lives)
        stale = [life for life in self.lives if life not in keep]
        self.lives = stale + lives
        self.stream = stream
        taken = True
        for life in lives:
            self._hold(life)
            if life.closed:
                taken = False
        for life in stale:
            life.holders.discard(self)
        self.lives = list(lives)
        return taken

    def _hold(self, life: Life) -> None:
        holders = life.holders
        if len(holders) > 16:   # (Uses ended by their owner's collection stay listed, inactive)
            life.holders = holders = {use for use in holders if use.active}
        holders.add(self)
        stream = self.stream
        if stream is not None and stream is not life:
            if life.streams is None or stream not in life.streams:
                life.streams = joined(life.streams, stream)

    def let_go(self) -> None:
        """Ends the hold of every life in one store (as a collected owner's finalizer does), then
        frees what was closed meanwhile."""
        self.active = False
        if state.due or state.collected:
            release_due()


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
        # What the package owns: each handle's life, by a weak reference to the object that owns it.
        self.owned: "Dict[weakref.ReferenceType[Any], Life]" = {}
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

    def adopt(self, obj: object, life: Life) -> "weakref.ReferenceType[Any]":
        """Registers `life` to be closed once: at close(), when `obj` is collected, or at exit.
        Returns the reference to give disown()."""
        reference = OwnerReference(obj, state.collected.append)
        with state.lock:
            self.owned[reference] = life
        return reference

    def disown(self, reference: "weakref.ReferenceType[Any]") -> None:
        with state.lock:
            self.owned.pop(reference, None)

    def shutdown(self) -> None:
        """At exit: frees what is still owned (each life after the one it must outlive), then
        finalises what we initialised."""
        if self.pid != os.getpid():
            return   # a forked child must not touch the parent's device state
        if self.usable():
            with suppress(Exception):   # (exit must finish)
                runtime_api()
                release_due()
        with state.lock:
            self.exiting = True   # (what is still held is freed all the same: nothing runs after this)
            state.collected.extend(self.owned)   # (as if every owner was collected)
        with suppress(Exception):
            release_due()   # (also what was closed while held)
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
        if not self.initialized:
            self.pid = os.getpid()   # the parent never touched ACL: this process may start afresh


def refuse_inside_own_call(lock: Any, subject: str, done: str, calls: str = "calls") -> None:
    """Refuses a use of `subject` (an object whose calls take turns under `lock`, an RLock) from
    code run inside one of its own calls on this thread (a gc callback, a finalizer, a signal
    handler): it would otherwise deadlock, or find the call half done."""
    if lock._is_owned():
        raise RuntimeError(f"{subject} was {done} from code run inside one of its own {calls} (a gc callback, a "
                           "finalizer or a signal handler); wait until that one returns")


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
    state.due = set()   # (the parent's handles are not this process's to free)
    state.waited = set()
    state.collected.clear()
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
    """Frees what is due: handles of collected owners, handles closed on threads without a
    device, or while something held them."""
    if state.due or state.collected:
        runtime_api()
        release_due()


def synchronize_device() -> None:
    """Waits for all work on all streams of the device."""
    runtime_api().aclrtSynchronizeDevice()


class Uncopyable:
    """Stands for native state: copying or pickling it is refused. (A copy would share the
    handles but not their life: a close, or the collection of either, would free them under the
    other.)"""

    def __copy__(self) -> NoReturn:
        raise TypeError(f"{type(self).__name__} objects cannot be copied: each stands for native state (make another "
                        "one instead)")

    def __deepcopy__(self, memo: Any) -> NoReturn:
        self.__copy__()

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError(f"{type(self).__name__} objects cannot be pickled: each stands for native state of this process")


_Self = TypeVar("_Self", bound="Owned")


class Owned(Uncopyable):
    """A native handle the package owns or borrows; dead after close()."""

    _kind = "handle"

    def __init__(self) -> None:
        self._life = Life()
        self._reference: "Optional[weakref.ReferenceType[Any]]" = None   # the runtime's, while it owns a handle

    def _prepare(self, destroy: Destroy, handle: Any = None, device: Optional[int] = None) -> Life:
        """Readies this object to own a handle: call right before the statement that makes it,
        which stores it in the returned life's ``handle`` (or writes it into `handle`, an
        out-parameter given here). `device`: the device the handle belongs to."""
        life = self._life = self._make_life(destroy, handle)
        life.device = device
        self._reference = _runtime.adopt(self, life)
        return life

    def _make_life(self, destroy: Optional[Destroy], handle: Any) -> Life:
        return Life(destroy, handle)

    def _borrow(self, handle: Any) -> None:
        self._life = self._make_life(None, handle)

    @property
    def closed(self) -> bool:
        """True once close() was called (or the handle was handed over to its new owner)."""
        return self._life.closed

    @property
    def _as_parameter_(self) -> Any:
        """The native handle, as ctypes passes the object to C (HandleClosedError once closed)."""
        life = self._life
        if life.closed:
            raise HandleClosedError(f"this {self._kind} was closed; it cannot be used any more")
        return life.handle

    def check_open(self, name: Optional[str] = None) -> None:
        """Raises HandleClosedError when closed (ctypes would wrap it in its own error)."""
        if self._life.closed:
            raise HandleClosedError(f"{name or 'this ' + self._kind} was closed; it cannot be used any more")

    def close(self) -> None:
        """Kills the object now; frees the native handle (only an owned one) as soon as nothing
        holds it and the streams that used it have passed that work. Closing again finishes a
        close an exception cut short."""
        close_life(self._life)
        self._forget()

    def _forget(self) -> None:
        """The runtime no longer closes the handle when this object is collected."""
        if self._reference is not None:
            _runtime.disown(self._reference)
            self._reference = None

    def _disown(self) -> None:
        """Forgets the handle without freeing it: its owner is now someone else (e.g. CANN)."""
        life = self._life
        with state.lock:
            life.destroy = None
            life.closed = True
            state.epoch += 1
        self._forget()

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
