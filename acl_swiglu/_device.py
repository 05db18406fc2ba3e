"""The device data model: streams, device memory, and device arrays (memory with a shape, dtype,
element strides and offset), plus the layout arithmetic they share with one-shot calls.

Reads wait for writers: a launch records on each output the stream it queued the write on
(``pending``), and ``to_numpy`` waits for that stream first, even when the Stream wrapper was
closed since. Device memory is never freed under queued work (see runtime.Life).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import math
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, TypeVar

import numpy as np

from . import _ffi
from ._checks import ADDRESS_MAX, INT64_MAX, whole_number
from ._dtypes import allowed_dtype_text, as_dtype, dtype_name, is_device_dtype
from .errors import ArgumentError, HandleClosedError
from .runtime import (Life, Owned, Release, at_fork_in_child, close_with, free_collected, in_forked_child, pin,
                      pin_open, runtime_api, unpin)

if TYPE_CHECKING:   # (for annotations only: both import this module)
    import numpy.typing as npt

    from ._plan import Plan
    from .tensor import AclTensor

ACL_MEM_MALLOC_HUGE_FIRST = 0
MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEVICE_TO_DEVICE = 3
MAX_ALLOCATION = INT64_MAX   # size_t on the device side; larger sizes would wrap in C

_Result = TypeVar("_Result")


# ---- layout arithmetic ----

_strides_cache: Dict[Tuple[int, ...], Tuple[int, ...]] = {}


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    """Row-major element strides of `shape` (a zero dim counts as 1, as CANN does)."""
    shape = tuple(shape)
    strides = _strides_cache.get(shape)
    if strides is None:
        out, step = [], 1
        for dim in reversed(shape):
            out.append(step)
            step *= max(int(dim), 1)
        strides = tuple(reversed(out))
        if len(_strides_cache) > 4096:
            _strides_cache.clear()
        _strides_cache[shape] = strides
    return strides


def element_span(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from the first to the last one a non-empty view touches, both included."""
    return sum((d - 1) * s for d, s in zip(shape, strides)) + 1


def host_element_strides(array: np.ndarray) -> Optional[Tuple[int, ...]]:
    """A host array's strides in elements, or None when they cannot go to the device as they
    are (negative, or not whole elements)."""
    itemsize = array.dtype.itemsize
    if any(s < 0 or s % itemsize for s in array.strides):
        return None
    return tuple(s // itemsize for s in array.strides)


def check_device_dtype(dtype: npt.DTypeLike, name: str = "dtype") -> np.dtype:
    """`dtype` as a NumPy dtype when device arrays can hold it (an ArgumentError otherwise)."""
    try:
        dtype = as_dtype(dtype)
    except TypeError:
        raise ArgumentError(f"{name} {dtype!r} is not a dtype; allowed: {allowed_dtype_text()}") from None
    if not is_device_dtype(dtype):
        raise ArgumentError(f"{name} is {dtype_name(dtype)}; a device array holds one of {allowed_dtype_text()}")
    return dtype


# ---- streams ----


class _StreamLife(Life):
    """A stream's life: waiting for its queued work still works after a borrowed wrapper was
    closed (the stream itself lives on); a destroyed stream has completed its work."""

    __slots__ = ("address", "destroyed", "guard")

    def __init__(self, release: Optional[Release], address: ctypes.c_void_p) -> None:
        super().__init__(release)
        self.address = address
        self.destroyed = False
        # Held by each wait and by the destroy: a close() from another thread destroys the stream
        # after a wait in progress, and a wait after the destroy has nothing to wait for.
        self.guard = threading.RLock()

    def wait(self) -> None:
        if self.destroyed:
            return
        api = runtime_api()   # (first: in a forked child it refuses, before any lock is taken)
        with self.guard:
            if self.destroyed:
                return
            status = api.hot.aclrtSynchronizeStream(self.address)
            if status:
                _ffi.raise_status(status, "aclrtSynchronizeStream", api.get_message)


_streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()


def _reset_stream_locks() -> None:
    for stream in list(_streams):   # another thread may have held them at the fork
        stream._workspace_lock = threading.Lock()
        stream._life.guard = threading.RLock()


at_fork_in_child(_reset_stream_locks)


class Stream(Owned):
    """An aclrtStream: ``Stream()`` creates and owns one; ``Stream.from_handle`` borrows another
    framework's and ``default_stream()`` is the NULL stream (closing those never destroys them)."""

    _kind = "Stream"
    _life: _StreamLife   # made by _make_life or _borrowed

    def __init__(self) -> None:
        super().__init__()
        self._setup(None)
        self._is_default = False
        api = runtime_api()
        handle = _ffi.aclrtStream_p()
        api.aclrtCreateStream(ctypes.byref(handle))
        self._address = ctypes.c_void_p(ctypes.cast(handle, ctypes.c_void_p).value)
        raw_destroy = api.raw.aclrtDestroyStream
        life_box: List[_StreamLife] = []

        def release(handle: Any = handle) -> int:
            runtime_api()
            life = life_box[0]
            with life.guard:
                life.destroyed = True   # destroying waits for the queued work
                status: int = raw_destroy(handle)
            return status

        self._own(handle, release)
        life_box.append(self._life)

    def _setup(self, address: Optional[int]) -> None:
        self._workspace: Optional[DeviceBuffer] = None
        self._workspace_lock = threading.Lock()
        self._address = ctypes.c_void_p(address)
        self._is_default = not address
        _streams.add(self)

    def _make_life(self, release: Release) -> _StreamLife:
        return _StreamLife(release, self._address)

    @classmethod
    def _borrowed(cls, address: int) -> "Stream":
        stream = cls.__new__(cls)
        Owned.__init__(stream)
        stream._setup(address)
        stream._life = _StreamLife(None, stream._address)
        stream._borrow(ctypes.cast(stream._address, _ffi.aclrtStream_p))
        return stream

    @classmethod
    def from_handle(cls, handle: int) -> "Stream":
        """Borrows a foreign aclrtStream (an int address); close() does not destroy it."""
        return cls._borrowed(whole_number(handle, "stream handle", 0, ADDRESS_MAX))

    @property
    def handle(self) -> int:
        """The aclrtStream address (0 for the default stream)."""
        self.check_open()
        return self._address.value or 0

    def synchronize(self) -> None:
        """Waits for the work queued on this stream; raises its error if one failed."""
        if self._handle is None:
            self.check_open()
        self._life.wait()

    def wait_queued(self) -> None:
        """Waits for work queued through this wrapper, also after it was closed."""
        self._life.wait()

    def _take_workspace(self, nbytes: int) -> Tuple["DeviceBuffer", int]:
        """A pinned buffer of at least nbytes from this stream's grow-only pool, and its address
        (read while the pool still held it: another thread may replace and close the wrapper
        right after, the memory stays); unpin it with this stream's life after queuing the work
        that uses it."""
        with self._workspace_lock:
            current = self._workspace
            if current is not None and current.nbytes >= nbytes and not current.closed:
                pin((current._life,))
                address = current._handle
                if address is not None and not current._life.closed:
                    return current, address.value
                unpin((current._life,))
        fresh = DeviceBuffer(nbytes)   # not under the lock: allocation may run a finalizer
        pin((fresh._life,))
        address = fresh.ptr
        with self._workspace_lock:
            old, self._workspace = self._workspace, fresh
        if old is not None:
            old.close()   # freed once the work queued with it is done
        return fresh, address

    def run_with_workspace(self, nbytes: int, launch: Callable[[Optional[int]], _Result]) -> _Result:
        """Calls launch(workspace address or None) with at least nbytes of workspace from this
        stream's pool; the buffer stays allocated until the work launched with it is done."""
        self.check_open()
        if nbytes == 0:
            return launch(None)
        buffer, address = self._take_workspace(nbytes)
        try:
            return launch(address)
        finally:
            unpin((buffer._life,), self._life)

    def release_workspace(self) -> None:
        """Frees the pooled workspace once the work queued on this stream is done."""
        if in_forked_child():
            return
        with self._workspace_lock:
            workspace, self._workspace = self._workspace, None
        if workspace is not None:
            workspace.close()

    def close(self) -> None:
        """Destroys an owned stream (queued work completes first), frees its workspace once the
        work is done, and kills the wrapper. A borrowed stream is left as it is."""
        if self._handle is None:
            return
        super().close()
        self.release_workspace()

    def __repr__(self) -> str:
        if self._handle is None:
            return "<Stream closed>"
        return f"<Stream 0x{self.handle:x}{' default' if self._is_default else ''}>"


_default_stream: Optional[Stream] = None


def default_stream() -> Stream:
    """The device's default stream (the NULL aclrtStream)."""
    global _default_stream
    stream = _default_stream
    if stream is None or stream.closed:
        stream = _default_stream = Stream._borrowed(0)
    return stream


# ---- device memory ----


def _check_nbytes(nbytes: object) -> int:
    nbytes = whole_number(nbytes, "nbytes", 1, INT64_MAX * 2 + 1)
    if nbytes > MAX_ALLOCATION:
        raise ArgumentError(f"nbytes {nbytes} is more than any device can address")
    return nbytes


class DeviceBuffer(Owned):
    """Device memory: ``DeviceBuffer(nbytes)`` allocates (aclrtMalloc) and owns it;
    ``DeviceBuffer.wrap`` borrows a foreign device pointer."""

    _kind = "DeviceBuffer"

    def __init__(self, nbytes: int):
        super().__init__()
        self.nbytes = _check_nbytes(nbytes)
        api = runtime_api()
        free_collected()
        ptr = ctypes.c_void_p()
        api.aclrtMalloc(ctypes.byref(ptr), self.nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
        raw_free = api.raw.aclrtFree
        address = ptr.value

        def release(address: Optional[int] = address) -> int:
            runtime_api()
            status: int = raw_free(address)
            return status

        self._own(ptr, release)

    @classmethod
    def wrap(cls, ptr: int, nbytes: int) -> "DeviceBuffer":
        """Borrows device memory someone else allocated; close() does not free it."""
        address = whole_number(ptr, "ptr", 1, ADDRESS_MAX)
        buffer = cls.__new__(cls)
        Owned.__init__(buffer)
        buffer.nbytes = _check_nbytes(nbytes)
        buffer._borrow(ctypes.c_void_p(address))
        return buffer

    @property
    def ptr(self) -> int:
        """The device address of the memory (HandleClosedError once closed)."""
        address: int = self._as_parameter_.value
        return address

    def _check_range(self, nbytes: int, offset: int) -> None:
        offset = whole_number(offset, "offset")
        if offset + nbytes > self.nbytes:
            raise ArgumentError(f"copy of {nbytes} bytes at offset {offset} exceeds the buffer's {self.nbytes} bytes")

    def copy_from_host(self, host: np.ndarray, offset: int = 0) -> None:
        """Synchronous copy of a C-contiguous host array's bytes to offset."""
        if not host.flags.c_contiguous:
            raise ArgumentError("copy_from_host needs a C-contiguous host array")
        self.copy_from_address(host.ctypes.data, host.nbytes, offset)

    def copy_from_address(self, address: int, nbytes: int, offset: int = 0) -> None:
        """Synchronous copy of nbytes of host memory at address to offset."""
        address = whole_number(address, "address", 0, ADDRESS_MAX)
        nbytes = whole_number(nbytes, "nbytes")
        self._check_range(nbytes, offset)
        if nbytes:
            with self._pinned() as device:
                runtime_api().aclrtMemcpy(device + offset, self.nbytes - offset, address, nbytes,
                                          MEMCPY_HOST_TO_DEVICE)

    def copy_to_host(self, host: np.ndarray, offset: int = 0) -> None:
        """Synchronous copy into a writable C-contiguous host array (does not wait for streams)."""
        if not (host.flags.c_contiguous and host.flags.writeable):
            raise ArgumentError("copy_to_host needs a writable C-contiguous host array")
        nbytes = host.nbytes
        self._check_range(nbytes, offset)
        if nbytes:
            with self._pinned() as device:
                runtime_api().aclrtMemcpy(host.ctypes.data, nbytes, device + offset, nbytes, MEMCPY_DEVICE_TO_HOST)

    @contextlib.contextmanager
    def _pinned(self) -> Iterator[int]:
        """The memory's address, pinned for the block: a close() from another thread meanwhile
        frees it only after the block, and makes the block fail as one that comes after it."""
        lives = (self._life,)
        if not pin_open(self._life):
            raise HandleClosedError(f"this {self._kind} was closed; it cannot be used any more")
        try:
            yield self._handle.value
        finally:
            unpin(lives)
        if self._handle is None:
            raise HandleClosedError(f"this {self._kind} was closed during the copy")

    def __repr__(self) -> str:
        if self._handle is None:
            return "<DeviceBuffer closed>"
        owner = "owned" if self._finalizer is not None else "borrowed"
        return f"<DeviceBuffer 0x{self.ptr:x} {self.nbytes} bytes {owner}>"


def _check_shape(shape: Iterable[object]) -> Tuple[int, ...]:
    """A shape as a tuple of whole numbers >= 0 (an error naming `shape` otherwise)."""
    try:
        dims: Tuple[Any, ...] = tuple(shape)
    except TypeError:
        raise TypeError(f"shape must be a sequence of whole numbers, got {type(shape).__name__}") from None
    for dim in dims:
        if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"shape {dims} must hold whole numbers, got {type(dim).__name__}")
        if dim < 0:
            raise ArgumentError(f"shape {dims} has a negative dim")
        if dim > INT64_MAX:
            raise ArgumentError(f"shape {dims} has a dim beyond int64")
    return tuple(int(d) for d in dims)


# Held while an array's tensor handle is made or taken away (tensor.tensor_for, DeviceArray.close).
_tensor_lock = threading.RLock()


def tensor_lock() -> "threading.RLock":
    return _tensor_lock


def _reset_tensor_lock() -> None:
    global _tensor_lock
    _tensor_lock = threading.RLock()   # another thread may have held it at the fork


at_fork_in_child(_reset_tensor_lock)


_layout_ids: Dict[Tuple[Any, ...], int] = {}
_next_layout_id = itertools.count(1)
_LAYOUT_IDS_KEPT = 4096


def layout_id(layout: Tuple[Any, ...]) -> int:
    """A number that stands for exactly this layout: a call's cache key is then a tuple of ints,
    cheap to hash. Numbers are never reused, so forgetting them only costs cache misses."""
    number = _layout_ids.get(layout)
    if number is None:
        if len(_layout_ids) >= _LAYOUT_IDS_KEPT:
            _layout_ids.clear()
        number = _layout_ids[layout] = next(_next_layout_id)
    return number


class DeviceArray:
    """A typed, strided view of device memory: what a tensor argument of an operator is.

    ``strides`` and ``offset`` count elements, as in aclCreateTensor. Made by ``to_device``,
    ``DeviceArray.empty`` or ``DeviceArray.wrap`` (a foreign pointer, e.g. a framework tensor's
    storage). Reading it back with ``to_numpy`` first waits for work queued on it.
    """

    def __init__(self, buffer: Optional[DeviceBuffer], shape: Sequence[int], dtype: npt.DTypeLike,
                 strides: Optional[Sequence[int]] = None, offset: int = 0) -> None:
        self.buffer = buffer
        self.shape = _check_shape(shape)
        self.dtype = check_device_dtype(dtype)
        if strides is None:
            self.strides = contiguous_strides(self.shape)
        else:
            self.strides = tuple(whole_number(s, "strides", 0) for s in strides)
        self.offset = whole_number(offset, "offset")
        self.pending: Optional[Stream] = None   # last stream with queued writes to it
        # plans that read it (told about writes to it), by id
        self._readers: Optional[Dict[int, "weakref.ReferenceType[Plan]"]] = None
        self._tensor: Optional[AclTensor] = None   # cached aclTensor for this exact view
        # (its address, the life a call pins, _layout_id), set with _tensor: what a device-level
        # call needs
        self._bound: Optional[Tuple[ctypes.c_void_p, Life, int]] = None
        self._dead = False
        self._layout = (self.shape, self.dtype, self.strides, self.offset)
        self._layout_id = layout_id(self._layout)

    # -- construction --

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: npt.DTypeLike) -> "DeviceArray":
        """Fresh C-contiguous device memory (contents undefined, as on a device)."""
        shape = _check_shape(shape)
        dtype = check_device_dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > MAX_ALLOCATION:
            raise ArgumentError(f"shape {shape} of {dtype_name(dtype)} needs {nbytes} bytes, more than any device "
                                "can address")
        return cls(DeviceBuffer(nbytes) if nbytes else None, shape, dtype)

    @classmethod
    def wrap(cls, ptr: int, shape: Sequence[int], dtype: npt.DTypeLike, strides: Optional[Sequence[int]] = None,
             offset: int = 0, nbytes: Optional[int] = None) -> "DeviceArray":
        """Borrows a foreign device pointer described by shape/dtype/strides/offset (elements)."""
        whole_number(ptr, "ptr", 1, ADDRESS_MAX)
        array = cls(None, shape, dtype, strides, offset)
        if len(array.strides) != len(array.shape):
            raise ArgumentError(f"strides {array.strides} must be one non-negative value per dim of {array.shape}")
        needed = array.extent_bytes
        if needed > MAX_ALLOCATION:
            raise ArgumentError(f"the view spans {needed} bytes, more than any device can address")
        if nbytes is None:
            nbytes = needed
        elif whole_number(nbytes, "nbytes") < needed:
            raise ArgumentError(f"the view needs {needed} bytes from ptr but nbytes is {nbytes}")
        if nbytes:
            array.buffer = DeviceBuffer.wrap(ptr, nbytes)
        return array

    # -- geometry --

    @property
    def ndim(self) -> int:
        """The number of dims."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements (the product of the dims)."""
        return math.prod(self.shape)

    @property
    def last_index(self) -> int:
        """Highest element index the view touches, offset included (-1 when empty)."""
        if self.size == 0:
            return -1
        return self.offset + element_span(self.shape, self.strides) - 1

    @property
    def extent_bytes(self) -> int:
        """Bytes from the buffer's start to the end of the last element the view touches (0 when
        empty): how much memory the view needs."""
        return (self.last_index + 1) * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        """Device address of the buffer (0 for an empty array without memory)."""
        if self._dead:
            raise HandleClosedError("this DeviceArray was closed; it cannot be used any more")
        return self.buffer.ptr if self.buffer is not None else 0

    @property
    def is_contiguous(self) -> bool:
        """True for a C-contiguous view that starts at the buffer's start (offset 0)."""
        return self.offset == 0 and self.strides == contiguous_strides(self.shape)

    def layout(self) -> Tuple[Tuple[int, ...], np.dtype, Tuple[int, ...], int]:
        """(shape, dtype, strides, offset): what a plan needs to be the same to rebind it."""
        return self._layout

    def _lives(self) -> Tuple[Life, ...]:
        """The native handles a launch using this array relies on: its memory (which also holds
        back the close of its tensor handle), or, without memory, its tensor handle."""
        if self.buffer is not None:
            return (self.buffer._life,)
        tensor = self._tensor
        return () if tensor is None else (tensor._life,)

    # -- data --

    def wait_for_writer(self) -> None:
        """Waits for the work queued to write this array (also through a closed Stream wrapper)."""
        pending = self.pending
        if pending is not None:
            pending.wait_queued()
            self.pending = None

    def to_numpy(self, sync: bool = True) -> np.ndarray:
        """A fresh host copy; waits first for work queued on this array (unless sync=False)."""
        if self.closed:
            raise HandleClosedError("this DeviceArray was closed; it cannot be read any more")
        if sync:
            self.wait_for_writer()
        out = np.empty(self.shape, self.dtype)
        if out.size == 0:
            return out
        buffer = self.buffer
        assert buffer is not None   # a non-empty view has memory
        if self.is_contiguous:
            buffer.copy_to_host(out)
            return out
        start = self.offset * self.dtype.itemsize
        span = np.empty(self.extent_bytes - start, np.uint8)
        buffer.copy_to_host(span, start)
        view = np.lib.stride_tricks.as_strided(
            span.view(self.dtype), self.shape, tuple(s * self.dtype.itemsize for s in self.strides))
        out[...] = view
        return out

    def copy_from(self, host: np.ndarray) -> None:
        """Writes host values into this (contiguous) array, synchronously, after the work queued
        to write it is done."""
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.shape != self.shape:
            raise ArgumentError(f"host array has shape {host.shape}, this DeviceArray has {self.shape}")
        if not self.is_contiguous:
            raise ArgumentError("copy_from needs a contiguous DeviceArray")
        self.wait_for_writer()
        if host.size:
            buffer = self.buffer
            assert buffer is not None   # a non-empty view has memory
            buffer.copy_from_host(host)

    def close(self) -> None:
        """Kills the array; frees its tensor handle and, when owned, its device memory as soon as
        no plan, executor or queued work uses them."""
        with _tensor_lock:
            self._dead = True
            self._bound = None
            tensor, self._tensor = self._tensor, None
        buffer = self.buffer
        if buffer is None:
            if tensor is not None:
                tensor.close()
            return
        # The memory closes first (the epoch moves): a call that pins it from here on fails its
        # epoch check, and one that pinned it before holds back the tensor's close too.
        buffer.close()
        if tensor is not None:
            close_with(buffer._life, tensor)   # calls in flight pin the buffer only

    @property
    def closed(self) -> bool:
        """True once close() was called on the array or on its buffer."""
        return self._dead or (self.buffer is not None and self.buffer._handle is None)

    def __enter__(self) -> "DeviceArray":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self.closed else ""
        address = 0 if self.closed or self.buffer is None else self.buffer.ptr
        return (f"<DeviceArray shape={self.shape} dtype={dtype_name(self.dtype)} strides={self.strides} "
                f"offset={self.offset} at 0x{address:x}{state}>")


def to_device(array: np.ndarray) -> DeviceArray:
    """Copies a NumPy array to new device memory. A non-contiguous view keeps its strides on
    the device (the bytes it spans are copied); negative strides are copied to C order first."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"to_device needs a numpy.ndarray, got {type(array).__name__}")
    check_device_dtype(array.dtype.newbyteorder("="), "array's dtype")
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if array.size == 0:
        return DeviceArray(None, array.shape, array.dtype)
    strides = host_element_strides(array)
    if strides is None:
        array = np.ascontiguousarray(array)
        strides = contiguous_strides(array.shape)
    span = element_span(array.shape, strides) * array.dtype.itemsize
    buffer = DeviceBuffer(span)
    try:
        buffer.copy_from_address(array.ctypes.data, span)
    except BaseException:
        buffer.close()
        raise
    return DeviceArray(buffer, array.shape, array.dtype, strides, 0)


__all__ = ["DeviceArray", "DeviceBuffer", "Stream", "default_stream", "to_device"]
