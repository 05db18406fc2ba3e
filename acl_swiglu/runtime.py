"""Process-wide ACL initialisation, per-thread device binding, and the owned native objects:
streams and device buffers, plus device arrays (a buffer with a shape, dtype and strides).

Owned objects free their native handle exactly once: on close(), on leaving a ``with`` block,
when garbage-collected, or at interpreter exit (before aclFinalize). After close they are
dead: using them raises HandleClosedError instead of passing a dangling pointer to C.
"""

from __future__ import annotations

import atexit
import ctypes
import math
import os
import threading
import weakref
from typing import Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from . import _ffi
from ._dtypes import dtype_name
from .errors import AclError, ArgumentError, ConfigurationError, HandleClosedError

ACL_ERROR_REPEAT_INITIALIZE = 100002
ACL_MEM_MALLOC_HUGE_FIRST = 0
MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEVICE_TO_DEVICE = 3
ENV_DEVICE_ID = "ACL_SWIGLU_DEVICE_ID"
MAX_ALLOCATION = 2**63 - 1   # size_t on the device side; larger sizes would wrap in C


class _Runtime:
    """aclInit once per process, aclrtSetDevice once per thread, teardown at exit."""

    def __init__(self):
        self.lock = threading.RLock()
        self.initialized = False
        self.initialized_here = False   # False when someone else called aclInit first
        self.shut_down = False
        self.pid = os.getpid()
        self.device_id: Optional[int] = None
        self.local = threading.local()
        self.owned: "Dict[int, weakref.finalize]" = {}
        self.owned_counter = 0

    # -- setup --

    def _default_device(self) -> int:
        text = os.environ.get(ENV_DEVICE_ID, "0").strip() or "0"
        try:
            value = int(text)
        except ValueError:
            raise ConfigurationError(f"{ENV_DEVICE_ID}={text!r} is not a device id (a whole number)") from None
        if value < 0:
            raise ConfigurationError(f"{ENV_DEVICE_ID}={value} is negative")
        return value

    def api(self):
        """The C API, with ACL initialised and this thread bound to the device."""
        local = self.local
        if getattr(local, "device", None) is None or local.device != self.device_id:
            self._bind_thread()
        return _ffi.api()

    def _bind_thread(self) -> None:
        api = _ffi.api()
        with self.lock:
            if self.pid != os.getpid():
                raise AclError(100001, "acl_swiglu", "ACL cannot be used in a child process after fork(); "
                               "use it in the parent, or start the child with the 'spawn' method")
            if self.shut_down:
                raise HandleClosedError("the ACL runtime was already finalised at interpreter exit")
            if not self.initialized:
                code = api.raw.aclInit(None)
                if code == ACL_ERROR_REPEAT_INITIALIZE:
                    self.initialized_here = False   # someone else owns ACL: never finalise it
                elif code != 0:
                    _ffi.raise_status(code, "aclInit", api.get_message)
                else:
                    self.initialized_here = True
                self.initialized = True
                atexit.register(self.shutdown)
            if self.device_id is None:
                self.device_id = self._default_device()
            device = self.device_id
        api.aclrtSetDevice(device)
        self.local.device = device

    def set_device(self, device_id: int) -> None:
        if isinstance(device_id, bool) or not isinstance(device_id, (int, np.integer)) or device_id < 0:
            raise ArgumentError(f"device_id must be a whole number >= 0, got {device_id!r}")
        with self.lock:
            previous, self.device_id = self.device_id, int(device_id)
        if self.initialized:
            try:
                self._bind_thread()
            except BaseException:
                with self.lock:   # a device that cannot be set must not stick for later calls
                    self.device_id = previous
                raise

    # -- ownership --

    def adopt(self, obj: object, release: Callable[[], None]) -> "weakref.finalize":
        """Registers `release` to run once: at close(), GC, or exit (newest first)."""
        with self.lock:
            self.owned_counter += 1
            key = self.owned_counter
            finalizer = weakref.finalize(obj, self._release, key, release)
            finalizer.atexit = False   # shutdown() runs them in order instead
            self.owned[key] = finalizer
        return finalizer

    def _release(self, key: int, release: Callable[[], None]) -> None:
        _closes[0] += 1
        with self.lock:
            self.owned.pop(key, None)
            usable = self.initialized and not self.shut_down and self.pid == os.getpid()
        if usable:
            release()

    def shutdown(self) -> None:
        """At exit: frees what is still owned (newest first), then finalises what we initialised."""
        if self.pid != os.getpid():
            return   # a forked child must not touch the parent's device state
        with self.lock:
            pending = [self.owned[k] for k in sorted(self.owned, reverse=True)]
        for finalizer in pending:
            # weakref.finalize may already have shut down (its own exit hook can run before
            # this one, and then calling a finalizer does nothing): detach and release here.
            detached = finalizer.detach()
            if detached is None:
                continue
            _, func, args, _ = detached
            try:
                func(*args)
            except Exception:   # exit must finish; a failed free cannot be acted on now
                pass
        with self.lock:
            if not self.initialized or self.shut_down:
                return
            self.shut_down = True
        api = _ffi.api()
        if self.device_id is not None and getattr(self.local, "device", None) is not None:
            api.raw.aclrtResetDevice(self.device_id)
        if self.initialized_here:
            api.raw.aclFinalize()

    def _after_fork_in_child(self) -> None:
        self.lock = threading.RLock()
        self.local = threading.local()
        self.owned = {}


# Bumped whenever an owned handle is released, so hot paths re-check their arrays only then.
_closes = [0]


def close_count() -> int:
    return _closes[0]


_runtime = _Runtime()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _runtime._after_fork_in_child())


def in_forked_child() -> bool:
    """True in a child forked after this process used ACL (the child must not touch it)."""
    return _runtime.pid != os.getpid()


def runtime_api():
    """The C API on this thread, initialising ACL and binding the device as needed."""
    return _runtime.api()


def set_device(device_id: int) -> None:
    """Chooses the device (default 0, or ACL_SWIGLU_DEVICE_ID) for every thread."""
    _runtime.set_device(device_id)


def synchronize_device() -> None:
    """Waits for all work on all streams of the device."""
    runtime_api().aclrtSynchronizeDevice()


class Owned:
    """A native handle the package owns or borrows; dead after close()."""

    _kind = "handle"

    def __init__(self):
        self._handle = None
        self._finalizer = None

    def _own(self, handle, release: Callable[[], None]) -> None:
        self._handle = handle
        self._finalizer = _runtime.adopt(self, release)

    def _borrow(self, handle) -> None:
        self._handle = handle

    @property
    def closed(self) -> bool:
        return self._handle is None

    @property
    def _as_parameter_(self):
        handle = self._handle
        if handle is None:
            raise HandleClosedError(f"this {self._kind} was closed; it cannot be used any more")
        return handle

    def check_open(self, name: Optional[str] = None) -> None:
        """Raises HandleClosedError when closed (ctypes would wrap it in its own error)."""
        if self._handle is None:
            raise HandleClosedError(f"{name or 'this ' + self._kind} was closed; it cannot be used any more")

    def close(self) -> None:
        """Frees the native handle now (only the owner frees; a borrowed one is just dropped)."""
        if self._finalizer is not None:
            self._finalizer()
        elif self._handle is not None:
            _closes[0] += 1
        self._handle = None

    def _disown(self) -> None:
        """Forgets the handle without freeing it: its owner is now someone else (e.g. CANN)."""
        if self._finalizer is not None:
            detached = self._finalizer.detach()
            if detached is not None:
                key = detached[2][0]
                with _runtime.lock:
                    _runtime.owned.pop(key, None)
        _closes[0] += 1
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- streams ----


class Stream(Owned):
    """An aclrtStream: created and owned here, or borrowed from another framework."""

    _kind = "Stream"

    def __init__(self, _handle=None, _owned=True):
        super().__init__()
        self._workspace: Optional["DeviceBuffer"] = None
        self._workspace_lock = threading.Lock()
        if _handle is not None or not _owned:
            self._borrow(_handle)
            self._is_default = _handle is None or not ctypes.cast(_handle, ctypes.c_void_p).value
            return
        self._is_default = False
        api = runtime_api()
        handle = _ffi.aclrtStream_p()
        api.aclrtCreateStream(ctypes.byref(handle))
        raw_destroy = api.raw.aclrtDestroyStream

        def release(handle=handle):
            runtime_api()
            raw_destroy(handle)

        self._own(handle, release)

    @classmethod
    def from_handle(cls, handle: int) -> "Stream":
        """Borrows a foreign aclrtStream (an int address); close() does not destroy it."""
        if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)) or handle < 0:
            raise ArgumentError(f"stream handle must be an int address (>= 0), got {handle!r}")
        return cls(_ffi.aclrtStream_p() if handle == 0 else ctypes.cast(ctypes.c_void_p(int(handle)),
                                                                         _ffi.aclrtStream_p), _owned=False)

    @property
    def handle(self) -> int:
        """The aclrtStream address (0 for the default stream)."""
        return ctypes.cast(self._as_parameter_, ctypes.c_void_p).value or 0

    def synchronize(self) -> None:
        """Waits for the work queued on this stream; raises its error if one failed."""
        if self._handle is None:
            self.check_open()
        api = runtime_api()
        status = api.hot.aclrtSynchronizeStream(self._address)
        if status:
            _ffi.raise_status(status, "aclrtSynchronizeStream", api.get_message)

    @property
    def _address(self) -> ctypes.c_void_p:
        """The handle as a c_void_p, for the unprototyped hot-path calls."""
        address = self.__dict__.get("_cached_address")
        if address is None:
            address = self._cached_address = ctypes.c_void_p(self.handle or None)
        return address

    def run_with_workspace(self, nbytes: int, launch: Callable[[Optional[int]], object]):
        """Calls launch(workspace address or None) with at least nbytes of workspace from this
        stream's grow-only pool; the pool's lock is held so the buffer cannot be swapped under it."""
        self.check_open()
        with self._workspace_lock:
            if nbytes == 0:
                return launch(None)
            current = self._workspace
            if current is None or current.closed or current.nbytes < nbytes:
                if current is not None:
                    # Queued work may still use the old buffer: it must finish before the free.
                    self.synchronize()
                    current.close()
                self._workspace = current = DeviceBuffer(nbytes)
            return launch(current.ptr)

    def release_workspace(self) -> None:
        """Frees the pooled workspace after the work queued on this stream is done."""
        if in_forked_child():
            return
        with self._workspace_lock:
            if self._workspace is not None:
                if not self._workspace.closed and not self.closed:
                    self.synchronize()
                self._workspace.close()
                self._workspace = None

    def close(self) -> None:
        """Destroys an owned stream (queued work completes first) and frees its workspace."""
        if self._handle is None:
            return
        super().close()
        if in_forked_child():
            self._workspace = None   # its lock may be held by a thread that did not survive the fork
            return
        with self._workspace_lock:
            if self._workspace is not None:
                self._workspace.close()
                self._workspace = None

    def __repr__(self) -> str:
        if self._handle is None:
            return "<Stream closed>"
        return f"<Stream 0x{self.handle:x}{' default' if self._is_default else ''}>"


_default_stream: Optional[Stream] = None


def default_stream() -> Stream:
    """The device's default stream (the NULL aclrtStream)."""
    global _default_stream
    if _default_stream is None or _default_stream.closed:
        _default_stream = Stream(_ffi.aclrtStream_p(), _owned=False)
    return _default_stream


# ---- device memory ----


class DeviceBuffer(Owned):
    """Device memory from aclrtMalloc (owned) or a foreign device pointer (borrowed)."""

    _kind = "DeviceBuffer"

    def __init__(self, nbytes: int, _ptr: Optional[int] = None):
        super().__init__()
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise ArgumentError(f"nbytes must be a whole number > 0, got {nbytes!r}")
        if nbytes > MAX_ALLOCATION:
            raise ArgumentError(f"nbytes {nbytes} is more than any device can address")
        self.nbytes = int(nbytes)
        if _ptr is not None:
            self._borrow(ctypes.c_void_p(_ptr))
            return
        api = runtime_api()
        ptr = ctypes.c_void_p()
        api.aclrtMalloc(ctypes.byref(ptr), self.nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
        raw_free = api.raw.aclrtFree
        address = ptr.value

        def release(address=address):
            runtime_api()
            raw_free(address)

        self._own(ptr, release)

    @classmethod
    def wrap(cls, ptr: int, nbytes: int) -> "DeviceBuffer":
        """Borrows device memory someone else allocated; close() does not free it."""
        if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)) or ptr <= 0:
            raise ArgumentError(f"ptr must be a non-zero int device address, got {ptr!r}")
        return cls(nbytes, _ptr=int(ptr))

    @property
    def ptr(self) -> int:
        return self._as_parameter_.value

    def copy_from_host(self, host: np.ndarray, offset: int = 0) -> None:
        """Synchronous copy of a C-contiguous host array's bytes to offset."""
        if not host.flags.c_contiguous:
            raise ArgumentError("copy_from_host needs a C-contiguous host array")
        self.copy_from_address(host.ctypes.data, host.nbytes, offset)

    def copy_from_address(self, address: int, nbytes: int, offset: int = 0) -> None:
        """Synchronous copy of nbytes of host memory at address to offset."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ArgumentError(f"copy of {nbytes} bytes at offset {offset} exceeds the buffer's {self.nbytes} bytes")
        if nbytes:
            runtime_api().aclrtMemcpy(self.ptr + offset, self.nbytes - offset, address, nbytes,
                                      MEMCPY_HOST_TO_DEVICE)

    def copy_to_host(self, host: np.ndarray, offset: int = 0) -> None:
        """Synchronous copy into a writable C-contiguous host array (does not wait for streams)."""
        if not (host.flags.c_contiguous and host.flags.writeable):
            raise ArgumentError("copy_to_host needs a writable C-contiguous host array")
        nbytes = host.nbytes
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ArgumentError(f"copy of {nbytes} bytes at offset {offset} exceeds the buffer's {self.nbytes} bytes")
        if nbytes:
            runtime_api().aclrtMemcpy(host.ctypes.data, nbytes, self.ptr + offset, nbytes, MEMCPY_DEVICE_TO_HOST)

    def __repr__(self) -> str:
        if self._handle is None:
            return "<DeviceBuffer closed>"
        owner = "owned" if self._finalizer is not None else "borrowed"
        return f"<DeviceBuffer 0x{self.ptr:x} {self.nbytes} bytes {owner}>"


def _check_shape(shape) -> Tuple[int, ...]:
    """A shape as a tuple of whole numbers >= 0 (an ArgumentError naming `shape` otherwise)."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of whole numbers, got {type(shape).__name__}") from None
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"shape {dims} must hold whole numbers, got {type(dim).__name__}")
        if dim < 0:
            raise ArgumentError(f"shape {dims} has a negative dim")
    return tuple(int(d) for d in dims)


def _contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    strides = []
    step = 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(strides))


class DeviceArray:
    """A typed, strided view of device memory: what a tensor argument of the operator is.

    ``strides`` and ``offset`` count elements, as in aclCreateTensor. Made by ``to_device``,
    ``DeviceArray.empty`` or ``DeviceArray.wrap`` (a foreign pointer, e.g. a framework tensor's
    storage). Reading it back with ``to_numpy`` first waits for work queued on it.
    """

    def __init__(self, buffer: Optional[DeviceBuffer], shape, dtype, strides=None, offset: int = 0):
        self.buffer = buffer
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.strides = tuple(int(s) for s in strides) if strides is not None else _contiguous_strides(self.shape)
        self.offset = int(offset)
        self.pending: Optional[Stream] = None   # last stream with queued writes to it
        self._tensor = None                      # cached aclTensor for this exact view
        self._layout = (self.shape, self.dtype, self.strides, self.offset)

    # -- construction --

    @classmethod
    def empty(cls, shape, dtype) -> "DeviceArray":
        """Fresh C-contiguous device memory (contents undefined, as on a device)."""
        shape = _check_shape(shape)
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > MAX_ALLOCATION:
            raise ArgumentError(f"shape {shape} of {dtype_name(dtype)} needs {nbytes} bytes, more than any device "
                                "can address")
        return cls(DeviceBuffer(nbytes) if nbytes else None, shape, dtype)

    @classmethod
    def wrap(cls, ptr: int, shape, dtype, strides=None, offset: int = 0, nbytes: Optional[int] = None) -> "DeviceArray":
        """Borrows a foreign device pointer described by shape/dtype/strides/offset (elements)."""
        array = cls(None, _check_shape(shape), dtype, strides, offset)
        if any(s < 0 for s in array.strides) or len(array.strides) != len(array.shape):
            raise ArgumentError(f"strides {array.strides} must be one non-negative value per dim of {array.shape}")
        if array.offset < 0:
            raise ArgumentError(f"offset {offset} is negative")
        needed = array.extent_bytes
        if nbytes is None:
            nbytes = needed
        elif nbytes < needed:
            raise ArgumentError(f"the view needs {needed} bytes from ptr but nbytes is {nbytes}")
        if nbytes:
            array.buffer = DeviceBuffer.wrap(ptr, nbytes)
        return array

    # -- geometry --

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def last_index(self) -> int:
        """Highest element index the view touches, offset included (-1 when empty)."""
        if self.size == 0:
            return -1
        return self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.strides))

    @property
    def extent_bytes(self) -> int:
        return (self.last_index + 1) * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        """Device address of the buffer (0 for an empty array without memory)."""
        return self.buffer.ptr if self.buffer is not None else 0

    @property
    def is_contiguous(self) -> bool:
        return self.offset == 0 and self.strides == _contiguous_strides(self.shape)

    def layout(self) -> tuple:
        """(shape, dtype, strides, offset): what a plan needs to be the same to rebind it."""
        return self._layout

    # -- data --

    def to_numpy(self, sync: bool = True) -> np.ndarray:
        """A fresh host copy; waits first for work queued on this array (unless sync=False)."""
        if sync and self.pending is not None:
            # A stream that was closed since completed its queued work when it was destroyed.
            if not self.pending.closed:
                self.pending.synchronize()
            self.pending = None
        out = np.empty(self.shape, self.dtype)
        if out.size == 0:
            return out
        if self.is_contiguous:
            self.buffer.copy_to_host(out)
            return out
        start = self.offset * self.dtype.itemsize
        span = np.empty(self.extent_bytes - start, np.uint8)
        self.buffer.copy_to_host(span, start)
        view = np.lib.stride_tricks.as_strided(
            span.view(self.dtype), self.shape, tuple(s * self.dtype.itemsize for s in self.strides))
        out[...] = view
        return out

    def copy_from(self, host: np.ndarray) -> None:
        """Writes host values into this (contiguous) array, synchronously."""
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.shape != self.shape:
            raise ArgumentError(f"host array has shape {host.shape}, this DeviceArray has {self.shape}")
        if not self.is_contiguous:
            raise ArgumentError("copy_from needs a contiguous DeviceArray")
        if host.size:
            self.buffer.copy_from_host(host)

    def close(self) -> None:
        """Frees the cached tensor handle and, when owned, the device memory."""
        if self._tensor is not None:
            self._tensor.close()
            self._tensor = None
        if self.buffer is not None:
            self.buffer.close()

    @property
    def closed(self) -> bool:
        return self.buffer is not None and self.buffer.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        return (f"<DeviceArray shape={self.shape} dtype={dtype_name(self.dtype)} strides={self.strides} "
                f"offset={self.offset} at 0x{self.ptr if not self.closed else 0:x}{state}>")


def _device_layout(array: np.ndarray) -> Optional[Tuple[int, Tuple[int, ...]]]:
    """(span in bytes, element strides) when `array` can go to the device as a strided view."""
    itemsize = array.dtype.itemsize
    if any(s < 0 or s % itemsize for s in array.strides):
        return None
    strides = tuple(s // itemsize for s in array.strides)
    span = (sum((d - 1) * s for d, s in zip(array.shape, strides)) + 1) * itemsize
    return span, strides


def to_device(array: np.ndarray) -> DeviceArray:
    """Copies a NumPy array to new device memory. A non-contiguous view keeps its strides on
    the device (the bytes it spans are copied); negative strides are copied to C order first."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"to_device needs a numpy.ndarray, got {type(array).__name__}")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.size == 0:
        return DeviceArray(None, array.shape, array.dtype)
    layout = _device_layout(array)
    if layout is None:
        array = np.ascontiguousarray(array)
        layout = _device_layout(array)
    span, strides = layout
    buffer = DeviceBuffer(span)
    try:
        buffer.copy_from_address(array.ctypes.data, span)
    except BaseException:
        buffer.close()
        raise
    return DeviceArray(buffer, array.shape, array.dtype, strides, 0)
