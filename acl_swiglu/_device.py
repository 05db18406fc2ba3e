"""The device data model: streams, device memory, and device arrays (memory with a shape, dtype,
element strides and offset), plus the layout arithmetic they share with one-shot calls. Each
device array's memory has an access record that orders reads and writes across streams
(docs/concurrency.md, "Ordering").
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
import numpy.typing as npt

from . import _ffi
from ._checks import (ADDRESS_MAX, MAX_ALLOCATION, check_device_dtype, check_nbytes, check_shape, plain_array,
                      whole_number)
from ._dtypes import dtype_name
from .errors import ArgumentError, HandleClosedError
from .runtime import (Destroy, Life, Owned, Uncopyable, Use, current_device, free_collected, in_forked_child,
                      joined, release_due, runtime_api, state, watch_waits)

ACL_MEM_MALLOC_HUGE_FIRST = 0
MEMCPY_HOST_TO_DEVICE = 1
MEMCPY_DEVICE_TO_HOST = 2


# ---- layout arithmetic ----


def contiguous_strides(shape: Sequence[int]) -> Tuple[int, ...]:
    """Row-major element strides of `shape` (a zero dim counts as 1, as CANN does)."""
    out, step = [], 1
    for dim in reversed(shape):
        out.append(step)
        step *= max(int(dim), 1)
    return tuple(reversed(out))


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


# ---- streams ----


class StreamLife(Life):
    """A stream's life: a wait works also after a borrowed wrapper was closed; a destroyed
    stream has completed its work. An owned stream's ``lock`` orders its waits against its
    destruction (runtime._free holds it), and knows the thread inside a wait (runtime._waiting)."""

    __slots__ = ("address", "owned", "device", "wrapper", "lock", "owner")

    def __init__(self, destroy: Optional[Destroy], handle: Any, device: Optional[int]) -> None:
        super().__init__(destroy, handle)
        self.address = ctypes.cast(handle, ctypes.c_void_p) if handle is not None else ctypes.c_void_p()
        self.owned = destroy is not None
        self.device = device   # the device it belongs to; None for the default stream (each device has one)
        self.wrapper: Optional["weakref.ReferenceType[Stream]"] = None
        self.lock: Any = threading.RLock()   # (its _is_owned() tells a wait of this thread)
        self.owner: Optional[StreamLife] = None   # a borrowed wrapper's: the package's own stream it wraps
        if self.owned:
            watch_waits(self)

    @property
    def destroyed(self) -> bool:
        """An owned stream the package destroyed (aclrtDestroyStream runs its queued work first)."""
        return self.owned and not self.handle   # (a ctypes pointer is false when NULL)

    def busy(self) -> bool:
        return bool(self.lock._is_owned())

    def live_besides(self, other: Life) -> bool:
        """False once destroyed (its work is done), or when `other` is the same native stream
        (borrowed again): waiting on `other` then covers this one."""
        if (self.owner or self).destroyed:
            return False
        return not (isinstance(other, StreamLife) and not self.owned and not other.owned
                    and self.address.value == other.address.value and self.device == other.device)

    def wait(self) -> None:
        if self.owner is not None:
            return self.owner.wait()   # (destroyed by the package: its work is done)
        api = runtime_api()   # (first: in a forked child it refuses, before any lock is taken)
        if not self.owned:   # (the package never destroys a borrowed stream: no lock)
            status = api.hot.aclrtSynchronizeStream(self.address)
        else:
            with self.lock:
                status = 0 if self.destroyed else api.hot.aclrtSynchronizeStream(self.address)
            if state.due or state.collected:
                release_due()   # (a free put off while this thread waited)
        if status:
            _ffi.raise_status(status, "aclrtSynchronizeStream", api.get_message)


class Stream(Owned):
    """An aclrtStream: ``Stream()`` creates and owns one on the thread's device;
    ``Stream.from_handle`` borrows another framework's and ``default_stream()`` is the NULL stream
    (closing those never destroys them)."""

    _kind = "Stream"
    _life: StreamLife

    def __init__(self) -> None:
        super().__init__()
        self._pools: Dict[Optional[int], DeviceBuffer] = {}   # pooled workspace, by the device it is on
        api = runtime_api()
        self._device: Optional[int] = current_device()
        handle = _ffi.aclrtStream_p()
        self._prepare(api.raw.aclrtDestroyStream, handle, self._device)   # (destroying waits for the queued work)
        api.aclrtCreateStream(ctypes.byref(handle))
        self._address = ctypes.c_void_p(ctypes.cast(handle, ctypes.c_void_p).value)
        self._life.address = self._address
        with state.lock:
            _owned_streams[self._address.value or 0] = self._life

    def _make_life(self, destroy: Optional[Destroy], handle: Any) -> StreamLife:
        life = StreamLife(destroy, handle, self._device)
        life.wrapper = weakref.ref(self)
        return life

    @classmethod
    def _borrowed(cls, address: int, device: Optional[int]) -> "Stream":
        stream = cls.__new__(cls)
        Owned.__init__(stream)
        stream._pools = {}
        stream._device = device
        stream._address = ctypes.c_void_p(address or None)
        stream._borrow(ctypes.cast(stream._address, _ffi.aclrtStream_p))
        return stream

    @classmethod
    def from_handle(cls, handle: int) -> "Stream":
        """Borrows a foreign aclrtStream (an int address) of the thread's current device; close()
        does not destroy it."""
        address = whole_number(handle, "stream handle", 0, ADDRESS_MAX)
        with state.lock:
            owner = _owned_streams.get(address) if address else None
        if owner is not None and owner.destroyed:
            owner = None
        stream = cls._borrowed(address, owner.device if owner is not None else current_device() if address else None)
        stream._life.owner = owner
        return stream

    @property
    def handle(self) -> int:
        """The aclrtStream address (0 for the default stream)."""
        self.check_open()
        return self._address.value or 0

    @property
    def device(self) -> Optional[int]:
        """The device the stream belongs to (None for the default stream: each device has one)."""
        return self._device

    def synchronize(self) -> None:
        """Waits for the work queued on this stream; raises its error if one failed."""
        life = self._life
        if life.closed:
            self.check_open()   # (raises)
        life.wait()

    def take_workspace(self, nbytes: int, use: Use) -> int:
        """The address of at least nbytes of this stream's pooled workspace on the current
        device, held by `use` (let it go on this stream after queuing the work that uses it)."""
        device = self._device if self._device is not None else current_device()
        with state.lock:
            pooled = self._pools.get(device)
            if pooled is not None and pooled.nbytes >= nbytes and use.hold_also(pooled._life):
                return int(pooled._life.handle.value)   # (held: freed only after this use)
        fresh = DeviceBuffer(nbytes)   # (not under the lock: an allocation may run a finalizer)
        made_on = fresh._life.device   # (not `device` if another thread's set_device() moved this one meanwhile)
        with state.lock:
            use.hold_also(fresh._life)
            spare: Optional[DeviceBuffer] = fresh   # (a closed stream pools nothing: it goes with `use`)
            if not self._life.closed:
                spare, self._pools[made_on] = self._pools.get(made_on), fresh
        if spare is not None:
            spare.close()   # freed once the work queued with it is done
        return int(fresh._life.handle.value)

    def release_workspace(self) -> None:
        """Frees the pooled workspaces once the work queued on this stream is done."""
        if in_forked_child():
            return
        with state.lock:
            pools, self._pools = self._pools, {}
        for buffer in pools.values():
            buffer.close()

    def close(self) -> None:
        """Destroys an owned stream (queued work completes first), frees its workspace once the
        work is done, and kills the wrapper. A borrowed stream is left as it is."""
        super().close()
        self.release_workspace()   # (after: once closed, the stream pools no workspace)

    def __repr__(self) -> str:
        if self.closed:
            return "<Stream closed>"
        kind = "default" if not self._address.value else ("owned" if self._life.owned else "borrowed")
        device = "" if self._device is None else f" device {self._device}"
        return f"<Stream 0x{self.handle:x} {kind}{device}>"


_default_stream: Optional[Stream] = None
# The package's own streams by address: a borrowed wrapper of one waits through it (the package
# knows when it destroyed it).
_owned_streams: "weakref.WeakValueDictionary[int, StreamLife]" = weakref.WeakValueDictionary()


def default_stream() -> Stream:
    """The default stream (the NULL aclrtStream: the current device's own)."""
    global _default_stream
    stream = _default_stream
    if stream is None or stream.closed:
        stream = _default_stream = Stream._borrowed(0, None)
    return stream


# ---- device memory ----


class DeviceBuffer(Owned):
    """Device memory: ``DeviceBuffer(nbytes)`` allocates (aclrtMalloc) and owns it;
    ``DeviceBuffer.wrap`` borrows a foreign device pointer."""

    _kind = "DeviceBuffer"

    def __init__(self, nbytes: int):
        super().__init__()
        self._nbytes = check_nbytes(nbytes)
        api = runtime_api()
        free_collected()
        ptr = ctypes.c_void_p()
        self._prepare(api.raw.aclrtFree, ptr, current_device())
        api.aclrtMalloc(ctypes.byref(ptr), self._nbytes, ACL_MEM_MALLOC_HUGE_FIRST)
        with state.lock:   # (fresh memory: no record of what was freed at this address before)
            self._access = _accesses[ptr.value or 0] = Access()

    @classmethod
    def wrap(cls, ptr: int, nbytes: int) -> "DeviceBuffer":
        """Borrows device memory someone else allocated; close() does not free it."""
        address = whole_number(ptr, "ptr", 1, ADDRESS_MAX)
        buffer = cls.__new__(cls)
        Owned.__init__(buffer)
        buffer._nbytes = check_nbytes(nbytes)
        buffer._borrow(ctypes.c_void_p(address))
        buffer._access = access_of(address)
        return buffer

    @property
    def nbytes(self) -> int:
        """Its size in bytes (fixed: copies and tensors over it are checked against it)."""
        return self._nbytes

    @property
    def ptr(self) -> int:
        """The device address of the memory (HandleClosedError once closed)."""
        address: int = self._as_parameter_.value
        return address

    def _check_range(self, nbytes: int, offset: int) -> None:
        offset = whole_number(offset, "offset")
        if offset + nbytes > self._nbytes:
            raise ArgumentError(f"copy of {nbytes} bytes at offset {offset} exceeds the buffer's {self._nbytes} bytes")

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
            self._copy(offset, address, nbytes, MEMCPY_HOST_TO_DEVICE)

    def copy_to_host(self, host: np.ndarray, offset: int = 0) -> None:
        """Synchronous copy into a writable C-contiguous host array (does not wait for streams)."""
        if not (host.flags.c_contiguous and host.flags.writeable):
            raise ArgumentError("copy_to_host needs a writable C-contiguous host array")
        self._check_range(host.nbytes, offset)
        if host.nbytes:
            self._copy(offset, host.ctypes.data, host.nbytes, MEMCPY_DEVICE_TO_HOST)

    def _copy(self, offset: int, host: int, nbytes: int, kind: int) -> None:
        """One synchronous copy, the memory held meanwhile: a close() from another thread frees
        it only after the copy, and makes the copy fail as one that comes after it."""
        api = runtime_api()
        use = Use((self._life,))
        try:
            if not use.take():
                raise HandleClosedError(f"this {self._kind} was closed; it cannot be used any more")
            device = self._life.handle.value + offset   # (held: freed only after the copy)
            if kind == MEMCPY_HOST_TO_DEVICE:
                api.aclrtMemcpy(device, self._nbytes - offset, host, nbytes, kind)
            else:
                api.aclrtMemcpy(host, nbytes, device, nbytes, kind)
        finally:
            use.let_go()
        if self.closed:
            raise HandleClosedError(f"this {self._kind} was closed during the copy (by close(), or collected "
                                    "with the last objects that referred to it, as a finalizer in a cycle sees it)")

    def __repr__(self) -> str:
        if self.closed:
            return "<DeviceBuffer closed>"
        owner = "owned" if self._life.destroy is not None else "borrowed"
        return f"<DeviceBuffer 0x{self.ptr:x} {self.nbytes} bytes {owner}>"


# ---- access records ----


class Access:
    """The order of the work queued on one piece of device memory: the stream of its last
    queued write, and the streams that queued reads of it since. Shared by every array over the
    memory (every view of a buffer, and every buffer wrapping the same address)."""

    __slots__ = ("writer", "readers", "__weakref__")

    def __init__(self) -> None:
        self.writer: Optional[StreamLife] = None
        self.readers: Set[StreamLife] = set()


_accesses: "weakref.WeakValueDictionary[int, Access]" = weakref.WeakValueDictionary()


def access_of(address: int) -> Access:
    """The access record of the memory that starts at `address`."""
    with state.lock:
        record = _accesses.get(address)
        if record is None:
            record = _accesses[address] = Access()
    return record


def order_launch(reads: Sequence["DeviceArray"], writes: Sequence["DeviceArray"], stream: Optional[StreamLife]) -> None:
    """Before queuing work on `stream` (None: a write from the host) that reads and writes these
    arrays: waits for their writers on other streams, and for the readers on other streams of
    what it writes."""
    with state.lock:
        waits = {array._access.writer for array in (*reads, *writes)}
        for array in writes:
            waits |= array._access.readers
    waits -= {None, stream}
    for other in waits:
        other.wait()   # type: ignore[union-attr]


def record_launch(reads: Sequence["DeviceArray"], writes: Sequence["DeviceArray"], stream: StreamLife,
                  start: int = -1) -> int:
    """After queuing the work: `stream` reads these and is the last writer of those. Only a
    change moves the epoch (a plan repeating a launch records nothing new). Returns the epoch
    after this record when nothing else moved it since `start`, else -1."""
    changed = False
    with state.lock:
        for array in reads:
            access = array._access
            if stream not in access.readers:
                access.readers = joined(access.readers, stream)
                changed = True
        for array in writes:
            access = array._access
            if access.writer is not stream or access.readers:
                access.writer = stream
                access.readers = set()
                changed = True
        if changed:
            state.epoch += 1
        return state.epoch if state.epoch == start + changed else -1


class DeviceArray(Uncopyable):
    """A typed, strided view of device memory: what a tensor argument of an operator is.

    ``strides`` and ``offset`` count elements, as in aclCreateTensor. Made by ``to_device``,
    ``DeviceArray.empty`` or ``DeviceArray.wrap`` (a foreign pointer, e.g. a framework tensor's
    storage). Reading it back with ``to_numpy`` first waits for the work queued to write it;
    writing it with ``copy_from`` first waits for the work queued to read or write it.
    """

    def __init__(self, buffer: Optional[DeviceBuffer], shape: Sequence[int], dtype: npt.DTypeLike,
                 strides: Optional[Sequence[int]] = None, offset: int = 0) -> None:
        self._buffer = buffer
        dims = check_shape(shape)
        steps = contiguous_strides(dims) if strides is None else tuple(whole_number(s, "strides", 0) for s in strides)
        # Fixed for the array's life (read-only attributes): what validation saw is what launches use.
        self._layout = (dims, check_device_dtype(dtype), steps, whole_number(offset, "offset"))
        self._dead = False
        self._address = 0 if buffer is None else buffer.ptr   # (fixed for the array's life)
        self._life: Optional[Life] = None if buffer is None else buffer._life   # what a launch holds
        self._access = Access() if buffer is None else buffer._access

    # -- construction --

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: npt.DTypeLike) -> "DeviceArray":
        """Fresh C-contiguous device memory (contents undefined, as on a device)."""
        shape = check_shape(shape)
        dtype = check_device_dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > MAX_ALLOCATION:
            raise ArgumentError(f"shape {shape} of {dtype_name(dtype)} needs {nbytes} bytes, more than any device "
                                "can address")
        return cls(DeviceBuffer(nbytes) if nbytes else None, shape, dtype)

    @classmethod
    def zeros(cls, shape: Sequence[int], dtype: npt.DTypeLike) -> "DeviceArray":
        """Fresh C-contiguous device memory, zeroed (aclrtMemset, synchronous)."""
        array = cls.empty(shape, dtype)
        try:
            if array.buffer is not None:
                runtime_api().aclrtMemset(array.buffer.ptr, array.buffer.nbytes, 0, array.buffer.nbytes)
        except BaseException:
            array.close()
            raise
        return array

    @classmethod
    def wrap(cls, ptr: int, shape: Sequence[int], dtype: npt.DTypeLike, strides: Optional[Sequence[int]] = None,
             offset: int = 0, nbytes: Optional[int] = None) -> "DeviceArray":
        """Borrows a foreign device pointer described by shape/dtype/strides/offset (elements)."""
        address = whole_number(ptr, "ptr", 1, ADDRESS_MAX)
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
            buffer = array._buffer = DeviceBuffer.wrap(address, nbytes)
            array._address, array._life, array._access = address, buffer._life, buffer._access
        return array

    # -- geometry --

    @property
    def buffer(self) -> Optional[DeviceBuffer]:
        """The device memory the view is of (None for an empty array without memory)."""
        return self._buffer

    @property
    def shape(self) -> Tuple[int, ...]:
        """The dims."""
        return self._layout[0]

    @property
    def dtype(self) -> np.dtype:
        """The element type."""
        return self._layout[1]

    @property
    def strides(self) -> Tuple[int, ...]:
        """Element strides, one per dim."""
        return self._layout[2]

    @property
    def offset(self) -> int:
        """Elements from the buffer's start to the first element of the view."""
        return self._layout[3]

    @property
    def ndim(self) -> int:
        """The number of dims."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements (the product of the dims)."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the elements the view holds (size x itemsize, as numpy.ndarray.nbytes)."""
        return self.size * self.dtype.itemsize

    @property
    def last_index(self) -> int:
        """Highest element index the view touches, offset included (-1 when empty)."""
        return elements_spanned(self._layout) - 1

    @property
    def extent_bytes(self) -> int:
        """Bytes from the buffer's start to the end of the last element the view touches (0 when
        empty): how much memory the view needs."""
        return (self.last_index + 1) * self.dtype.itemsize

    @property
    def ptr(self) -> int:
        """Device address of the buffer (0 for an empty array without memory)."""
        return open_address(self)

    @property
    def is_contiguous(self) -> bool:
        """True for a C-contiguous view that starts at the buffer's start (offset 0)."""
        return self.offset == 0 and self.strides == contiguous_strides(self.shape)

    def layout(self) -> Tuple[Tuple[int, ...], np.dtype, Tuple[int, ...], int]:
        """(shape, dtype, strides, offset): what a plan needs to be the same to rebind it."""
        return self._layout

    # -- data --

    @property
    def pending(self) -> Optional[Stream]:
        """The stream of the last write queued to this array through the package (None when
        there is none, or its wrapper is gone)."""
        writer = self._access.writer
        return None if writer is None or writer.wrapper is None else writer.wrapper()

    def wait_for_writer(self) -> None:
        """Waits for the work queued to write this array (also through a closed Stream wrapper)."""
        writer = self._access.writer
        if writer is not None:
            writer.wait()

    def wait_for_access(self) -> None:
        """Waits for every queued read and write of this array (before a write from the host)."""
        order_launch((), (self,), None)

    def to_numpy(self, sync: bool = True) -> np.ndarray:
        """A fresh host copy; waits first for work queued to write this array (unless sync=False)."""
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
        to read or write it is done."""
        host = np.ascontiguousarray(host, dtype=self.dtype)
        if host.shape != self.shape:
            raise ArgumentError(f"host array has shape {host.shape}, this DeviceArray has {self.shape}")
        if not self.is_contiguous:
            raise ArgumentError("copy_from needs a contiguous DeviceArray")
        self.wait_for_access()
        if host.size:
            buffer = self.buffer
            assert buffer is not None   # a non-empty view has memory
            buffer.copy_from_host(host)

    def close(self) -> None:
        """Kills the array; frees its device memory (when owned) as soon as nothing holds it and
        the queued work that uses it is done."""
        self._dead = True
        if self.buffer is not None:
            self.buffer.close()
        else:
            with state.lock:
                state.epoch += 1

    @property
    def closed(self) -> bool:
        """True once close() was called on the array or on its buffer."""
        return is_closed(self)

    def __enter__(self) -> "DeviceArray":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state_text = " closed" if self.closed else ""
        address = 0 if self.closed or self.buffer is None else self.buffer.ptr
        return (f"<DeviceArray shape={self.shape} dtype={dtype_name(self.dtype)} strides={self.strides} "
                f"offset={self.offset} at 0x{address:x}{state_text}>")


# What the package hands to C is read from the array's own records, never through attributes a
# subclass may override.


def is_closed(array: DeviceArray) -> bool:
    """Whether close() was called on the array or on its buffer."""
    life = array._life
    return array._dead or (life is not None and life.closed)


def closed_array_error(name: Optional[str]) -> HandleClosedError:
    """The error for a closed array given as the argument `name` (None: not an argument)."""
    if name is None:
        return HandleClosedError("this DeviceArray was closed; it cannot be used any more")
    return HandleClosedError(f"{name} is a closed DeviceArray; its device memory was freed")


def open_address(array: DeviceArray, name: Optional[str] = None) -> int:
    """The array's device address (0 without memory); HandleClosedError once it was closed
    (naming the argument `name`, if given)."""
    if is_closed(array):
        raise closed_array_error(name)
    return array._address


def elements_spanned(layout: Tuple[Tuple[int, ...], np.dtype, Tuple[int, ...], int]) -> int:
    """Elements from the buffer's start through the last one a view of this layout touches (0
    when it has none)."""
    shape, _, strides, offset = layout
    return offset + element_span(shape, strides) if math.prod(shape) else 0


def lives_of(arrays: Iterable[DeviceArray]) -> List[Life]:
    """The native handles a launch using these arrays relies on: their memory."""
    return [array._life for array in arrays if array._life is not None]


def to_device(array: np.ndarray) -> DeviceArray:
    """Copies a NumPy array to new device memory. A non-contiguous view keeps its strides on
    the device (the bytes it spans are copied); negative strides are copied to C order first."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"to_device needs a numpy.ndarray, got {type(array).__name__}")
    array = plain_array(array, "to_device's array")
    check_device_dtype(array.dtype, "array's dtype")
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
