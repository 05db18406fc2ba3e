"""Helpers that only the bundled CPU emulator supports: live-handle counts and fault injection."""

from __future__ import annotations

import contextlib
import ctypes
import numbers
from types import SimpleNamespace
from typing import Dict, Iterator, List, Sequence, Tuple, Union

from . import _ffi
from .errors import AclSwigluError, ArgumentError

__all__ = [
    "KINDS", "KERNEL_VARIANTS", "FaultPlan", "NotEmulatorError", "faults_injected", "inject_faults", "is_active",
    "live_counts", "live_handles", "set_kernel_variant", "set_threads", "version",
]

KINDS = ("tensor", "int_array", "executor", "stream", "allocation")
MAX_FAULTS = 32          # the emulator's plan holds at most this many entries
MAX_API_NAME = 63        # bytes of an API name it keeps


class NotEmulatorError(AclSwigluError, RuntimeError):
    """An emulator-only helper was called while a real CANN backend is loaded."""


FaultPlan = Union[str, Sequence[Tuple[str, int, int]]]


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


def _fault_entry(where: str, api_name: object, nth: object, code: object) -> str:
    """One entry as "name:N:code", or an error naming where in `faults` it broke which rule."""
    if not isinstance(api_name, str) or not api_name or any(c in api_name for c in ":, \t\n"):
        raise ArgumentError(f"inject_faults: {where}: the API name must be a non-empty string without ':', ',' "
                            f"or blanks (e.g. 'aclrtMalloc'), got {api_name!r}")
    if len(api_name.encode()) > MAX_API_NAME:
        raise ArgumentError(f"inject_faults: {where}: the API name {api_name!r} is longer than {MAX_API_NAME} bytes")
    if isinstance(nth, bool) or not isinstance(nth, numbers.Integral) or not 1 <= int(nth) < 2**64:
        raise ArgumentError(f"inject_faults: {where}: N (which call of {api_name} fails, counted from 1) must be "
                            f"a whole number >= 1, got {nth!r}")
    if isinstance(code, bool) or not isinstance(code, numbers.Integral) or not 0 < abs(int(code)) < 2**31:
        raise ArgumentError(f"inject_faults: {where}: the status code must be a non-zero whole number that fits "
                            f"in an int32 (e.g. 207001), got {code!r}")
    return f"{api_name}:{int(nth)}:{int(code)}"


def _plan_text(faults: FaultPlan) -> str:
    """The emulator's plan text for `faults` ("name:N:code[,...]" or a list of (name, N, code)),
    checked entry by entry here so that a mistake is reported against the argument."""
    entries: List[str] = []
    if isinstance(faults, str):
        for i, part in enumerate(faults.split(",")):
            if not part.strip():
                continue
            fields = part.strip().split(":")
            if len(fields) != 3:
                raise ArgumentError(f"inject_faults: faults entry {i} {part!r} must be name:N:code (e.g. "
                                    "'aclrtMalloc:1:207001')")
            name, nth_text, code_text = fields
            try:
                nth, code = int(nth_text), int(code_text)
            except ValueError:
                raise ArgumentError(f"inject_faults: faults entry {i} {part!r}: N and code must be whole numbers "
                                    "(e.g. 'aclrtMalloc:1:207001')") from None
            entries.append(_fault_entry(f"faults entry {i} {part!r}", name, nth, code))
    elif isinstance(faults, (list, tuple)):
        for i, entry in enumerate(faults):
            if not isinstance(entry, (list, tuple)) or len(entry) != 3:
                raise ArgumentError(f"inject_faults: faults[{i}] must be a (name, N, code) tuple, got {entry!r}")
            entries.append(_fault_entry(f"faults[{i}]", *entry))
    else:
        raise TypeError(f"inject_faults: faults must be a 'name:N:code[,...]' string or a list of (name, N, code) "
                        f"tuples, got {type(faults).__name__}")
    if len(entries) > MAX_FAULTS:
        raise ArgumentError(f"inject_faults: faults has {len(entries)} entries; the emulator holds at most {MAX_FAULTS}")
    return ",".join(entries)


@contextlib.contextmanager
def inject_faults(faults: FaultPlan) -> Iterator[None]:
    """Within the block, the Nth call of each named API fails with the given code.

    ``faults`` is "name:N:code[,...]" or a list of (name, N, code). Calls are counted from the
    start of the block. The plan is cleared on exit; ``faults_injected()`` tells how many fired.
    The same plan can be set for a whole process with ACL_EMU_FAIL (docs/emulator.md).
    """
    plan = _plan_text(faults)
    api = _api()
    api.aclEmuSetFaults(plan.encode())
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
