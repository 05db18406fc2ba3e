"""A stand-in torch_npu over emulator memory, for the tests of the torch layer's NPU kernels:
tensors whose storage is emulator device memory, a current stream that is an emulator stream,
formats as given. Imported by test modules that have torch."""

import contextlib
import ctypes
import math
import sys
import types

import numpy as np
import torch

import acl_swiglu


class StandInTorchNpu:
    """What the NPU kernels use of torch_npu: the current stream (its reads counted), the device
    context, and each storage's format (ND unless `formats` says otherwise)."""

    def __init__(self, stream, formats=None):
        self.stream_reads = 0
        self.formats = formats or {}
        outer = self

        class _Stream:
            @property
            def npu_stream(self):
                outer.stream_reads += 1
                return stream.handle

        self.npu = types.SimpleNamespace(device=lambda device: contextlib.nullcontext(), init=lambda: None,
                                         current_device=lambda: 0, current_stream=lambda device=None: _Stream())

    def get_npu_format(self, tensor):
        return self.formats.get(tensor.untyped_storage().data_ptr(), 2)


class EmulatorMemory:
    """torch tensors whose storage is emulator device memory (host-addressable in the emulator)."""

    def __init__(self):
        self.buffers = []

    def empty(self, shape, dtype, device=None):
        nbytes = max(math.prod(shape) * torch.empty((), dtype=dtype).element_size(), 1)
        self.buffers.append(acl_swiglu.DeviceBuffer(nbytes))
        raw = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(self.buffers[-1].ptr), np.uint8)
        return torch.from_numpy(raw).view(dtype)[:math.prod(shape)].view(shape)

    def holding(self, tensor):
        """A copy of `tensor` in emulator memory, keeping its strides and storage offset."""
        storage = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
        copy = self.empty((storage.numel(),), torch.uint8)
        copy.copy_(storage)
        return copy.view(tensor.dtype).as_strided(tensor.shape, tensor.stride(), tensor.storage_offset())

    def close(self):
        for buffer in self.buffers:
            buffer.close()


@contextlib.contextmanager
def npu_stand_in(monkeypatch, module):
    """(torch_npu, memory, stream): the stand-in installed as torch_npu, and `module`'s device
    allocations made in emulator memory, on a stream of its own; all of it released after."""
    memory = EmulatorMemory()
    with acl_swiglu.Stream() as stream:
        torch_npu = StandInTorchNpu(stream)
        monkeypatch.setitem(sys.modules, "torch_npu", torch_npu)
        monkeypatch.setattr(module, "_allocate", memory.empty)
        try:
            yield torch_npu, memory, stream
        finally:
            stream.synchronize()
            memory.close()
