"""Helpers that only the bundled CPU emulator supports: live-handle counts and fault injection."""

from __future__ import annotations

import contextlib
import ctypes
from types import SimpleNamespace
from typing import Dict, Iterator, List, Tuple, Union

from . import _ffi
from .errors import AclSwigluError

KINDS = ("tensor", "int_array", "executor", "stream", "allocation")


class NotEmulatorError(AclSwigluError, RuntimeError):
    """An emulator-only helper was called while a real CANN backend is loaded."""


FaultPlan = Union[str, List[Tuple[str, int, int]]]


def _api() -> SimpleNamespace:
    api = _ffi.api()
    if not api.libraries.is_emulator:
        raise NotEmulatorError(f"this needs the CPU emulator, but the loaded backend is CANN ({api.libraries.info.runtime})")
    return api


def is_active() -> bool:
    """True when the loaded backend is the emulator (loads the libraries if needed)."""
    return bool(_ffi.api().libraries.is_emulator)


def version() -> str:
    """The emulator's version text (what backend_info() reports)."""
    return str(_api().aclEmuVersion().decode())


def live_counts() -> Dict[str, int]:
    """Live handles by kind, from the emulator's own counters (plus ``bytes`` of device memory)."""
    api = _api()
    counts = {kind: int(api.aclEmuLiveCount(i)) for i, kind in enumerate(KINDS)}
    counts["bytes"] = int(api.aclEmuLiveBytes())
    return counts


def live_handles(kind: str) -> List[int]:
    """The addresses of the live handles of one kind (one of KINDS), from the emulator's registry."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    api = _api()
    index = KINDS.index(kind)
    while True:
        count = int(api.aclEmuLiveHandles(index, None, 0))
        handles = (ctypes.c_void_p * max(count, 1))()
        found = int(api.aclEmuLiveHandles(index, handles, count))
        if found <= count:
            return [int(handles[i] or 0) for i in range(found)]


def set_threads(threads: int) -> None:
    """Kernel worker threads (0 = one per CPU); results do not depend on it."""
    _api().aclEmuSetThreads(int(threads))


KERNEL_VARIANTS = ("vector", "scalar")


def set_kernel_variant(variant: str) -> None:
    """'vector' (default) or 'scalar' (the one-element-at-a-time reference); same bytes either way."""
    if variant not in KERNEL_VARIANTS:
        raise ValueError(f"kernel variant must be one of {KERNEL_VARIANTS}, got {variant!r}")
    _api().aclEmuSetKernelVariant(KERNEL_VARIANTS.index(variant))


def _plan_text(faults: FaultPlan) -> str:
    if isinstance(faults, str):
        return faults
    parts = []
    for entry in faults:
        api_name, nth, code = entry
        parts.append(f"{api_name}:{int(nth)}:{int(code)}")
    return ",".join(parts)


@contextlib.contextmanager
def inject_faults(faults: FaultPlan) -> Iterator[None]:
    """Within the block, the Nth call of each named API fails with the given code.

    ``faults`` is "name:N:code[,...]" or a list of (name, N, code). Calls are counted from the
    start of the block. The plan is cleared on exit; ``faults_injected()`` tells how many fired.
    """
    api = _api()
    api.aclEmuSetFaults(_plan_text(faults).encode())
    try:
        yield
    finally:
        fired = api.aclEmuFaultsInjected()
        api.aclEmuSetFaults(None)
        setattr(inject_faults, "last_injected", int(fired))   # (a function attribute: set by name)


setattr(inject_faults, "last_injected", 0)


def faults_injected() -> int:
    """Faults injected since the current plan was set (or by the last inject_faults block)."""
    return int(_api().aclEmuFaultsInjected())
